"""Report section of the analyze-fourier stage (Zhou et al. 2024), read from its folder only.

The reading says, from the numbers: which frequencies the attention and the MLP outputs write onto the number
tokens (the share of their non-constant power above half the highest frequency, always next to the share a flat
spectrum has and the share of random directions of the same norms, and the strongest frequency), how accuracy
changes when the low or the high frequencies are filtered out of each group, and, on a digit-splitting
tokenizer, that the number index has only ten values (frequencies 0..5), so "low" and "high" are coarse.
"""

from __future__ import annotations

from collections.abc import Sequence

from arithmech.report.page import Body, Figure, Table, num, pct, signed_pct, small_samples, to_float
from arithmech.report.run_folder import StageFolder

_NAMES = {"attention": "attention", "mlp": "MLP"}
_CLOSE = 0.05
"""Shares of the high frequencies closer than this are read as the same mix."""


def _by_frequency(rows: Sequence[dict[str, str]], kind: str) -> dict[int, float]:
    """Frequency -> magnitude summed over the layers, for one component kind."""
    total: dict[int, float] = {}
    for row in rows:
        if row["component"] == kind:
            total[int(row["frequency"])] = total.get(int(row["frequency"]), 0.0) + to_float(row["magnitude"])
    return total


def _share_reading(row: dict[str, str]) -> tuple[str, float | None]:
    """"X% ... (flat spectrum F%; random directions R% +- S%)" for one group, and its share (None if undefined)."""
    name = _NAMES.get(row["component"], row["component"])
    if not row["high_share"]:
        return f"{name} outputs write no non-constant power onto the number tokens", None
    share, flat = to_float(row["high_share"]), to_float(row["flat_share"])
    mean, sd = to_float(row["random_mean"]), to_float(row["random_std"])
    side = "below" if share < flat - _CLOSE else "above" if share > flat + _CLOSE else "about"
    versus = "below" if share < mean - 2 * sd else "above" if share > mean + 2 * sd else "within 2 sd of"
    text = (f"{name} outputs put {pct(share, 1)} of their non-constant number-logit power on f = "
            f"{row['high_frequencies']} ({side} the {pct(flat, 1)} of a flat spectrum; {versus} random directions of "
            f"the same norms, {pct(mean, 1)} +- {pct(sd, 1)}; strongest f = {row['strongest_frequency']})")  # fmt: skip
    return text, share


def _filter_reading(filters: Sequence[dict[str, str]], answered: bool) -> str:
    """Per (group, filter): the cutoff that costs most accuracy (or answer probability, when the model answers
    nothing), with what it removed."""
    key = "accuracy" if answered else "answer_prob"
    lines: dict[tuple[str, str], list[dict[str, str]]] = {}
    for row in filters:
        lines.setdefault((row["component"], row["filter"]), []).append(row)
    parts = []
    for (group, kind), rows in lines.items():
        worst = min(rows, key=lambda r: (to_float(r[f"{key}_change"]), to_float(r["answer_prob_change"])))
        value = pct(to_float(worst[key])) if answered else num(to_float(worst[key]))
        change = (
            signed_pct(to_float(worst[f"{key}_change"]), 0) if answered else f"{to_float(worst[f'{key}_change']):+.3g}"
        )
        parts.append(f"{_NAMES.get(group, group)} {kind} at cutoff {worst['cutoff']} (frequencies "
                     f"{worst['removed_frequencies']} removed) {value} ({change})")  # fmt: skip
    if not parts:
        return "."
    lead = "; the lowest accuracy of each filter is " if answered else "; it answers none of these prompts, so "
    lead += "" if answered else "the filters are read from P(answer), lowest per filter: "
    return lead + ", ".join(parts) + "."


def fourier_body(stage: StageFolder) -> Body:
    meta = stage.metadata
    numbers, baseline = meta["numbers"], meta["baseline"]
    n, top = int(numbers["count"]), int(numbers["max_frequency"])
    spectrum = stage.csv("fourier_spectrum.csv")
    filters = stage.csv("fourier_filters.csv")
    text = f"Over {meta.get('counts', {}).get('prompts', 'n/a')} reference prompts and the number index 0..{n - 1}"
    if numbers.get("digit_splitting"):
        text += (
            " (the tokenizer splits numbers into digits, so only 0-9 are single tokens: ten values, frequencies "
            "0..5 with periods 10, 5, 3.3, 2.5 and 2, far coarser than the hundreds of number tokens of Zhou et "
            "al.'s models; f = 5 is the parity, f = 1 the magnitude)"
        )
    totals = {kind: _by_frequency(spectrum, kind) for kind in ("attention", "mlp")}
    share_rows = stage.csv("fourier_shares.csv") if stage.has("fourier_shares.csv") else []
    shares = {row["component"]: _share_reading(row) for row in share_rows}
    text += ", " + "; ".join(reading for reading, _ in shares.values()) + "." if shares else "."
    att, mlp = (shares.get(k, ("", None))[1] for k in ("attention", "mlp"))
    if att is not None and mlp is not None and abs(att - mlp) < _CLOSE:
        text += " Attention and MLPs write about the same mix of frequencies: no split like Zhou et al.'s."
    elif att is not None and mlp is not None:
        side = "higher" if att > mlp else "lower"
        agrees = "as Zhou et al. found" if att > mlp else "unlike Zhou et al.'s models (MLPs low, attention high)"
        text += f" Attention writes {side} frequencies than the MLPs, {agrees}."
    text += f" Without a filter the model answers {pct(baseline['accuracy'])}"
    text += f" (P(answer) {num(baseline['answer_prob'])})"
    text += _filter_reading(filters, baseline["accuracy"] > 0)
    header = ("group", "filter", "cutoff", "frequencies removed", "directions", "accuracy", "change", "P(answer)")
    rows = [(_NAMES.get(r["component"], r["component"]), r["filter"], r["cutoff"], r["removed_frequencies"],
             r["directions"], pct(to_float(r["accuracy"])), signed_pct(to_float(r["accuracy_change"]), 0),
             num(to_float(r["answer_prob"]))) for r in filters]  # fmt: skip
    freq_header = ("frequency", "period (numbers)", "attention (sum over layers)", "MLP (sum over layers)")
    freq_rows = [(str(f), f"{n / f:.3g}" if f else "constant", num(totals["attention"].get(f)),
                  num(totals["mlp"].get(f))) for f in range(top + 1)]  # fmt: skip
    share_table = Table(
        "Share of the non-constant number-logit power on the high frequencies, against a flat spectrum and random "
        "directions of the same norms", ("group", "frequencies", "share", "flat spectrum", "random: mean", "random: sd",
                                         "random draws"),
        [(_NAMES.get(r["component"], r["component"]), r["high_frequencies"],
          *(pct(to_float(r[k]), 1) for k in ("high_share", "flat_share", "random_mean", "random_std")),
          r["random_draws"]) for r in share_rows],
    )  # fmt: skip
    tables = [
        *([share_table] if share_rows else []),
        Table("Accuracy after each filter (one group filtered at a time)", header, rows),
        Table("Mean |DFT| of the number logits per frequency", freq_header, freq_rows, collapsed=True),
    ]
    captions = {
        "fourier_spectrum.png": "Mean |DFT| over the number index of each layer's attention and MLP contribution at "
        "the last token, read through the final norm (as Zhou et al. read each layer's output).",
        "fourier_filters.png": "Accuracy and answer probability with one group's outputs cut along the Fourier "
        "directions of the number-token unembedding above (low-pass) or below (high-pass) the cutoff.",
    }
    figures = [Figure(stage.folder / name, caption) for name, caption in captions.items() if stage.has(name)]
    return Body(text, figures, tables, small_samples({"": meta.get("counts", {}).get("prompts")}, "reference prompt"))

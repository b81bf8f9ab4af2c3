"""The report section of the knockout stage: effect-rank vs random-rank curves, held out first, then in sample.

Reads knockout_summary.csv, knockout.csv and metadata.json (`stages/knockout.py`, `stages/knockout_outputs.py`).
A run of one prompt set (no held-out prompts, or components given by name) is read as one curve, with the reason
from metadata.json's "split"; a folder written before the prompt_set column existed is read as one curve too.
Nothing is recomputed.
"""

from __future__ import annotations

from typing import Any

from arithmech.report.answer_digits_section import knockout_places
from arithmech.report.page import Body, Figure, Table, is_number, listing, num, pct, small_samples, to_float
from arithmech.report.run_folder import StageFolder

SET_NAMES = {"held_out": "held out", "in_sample": "in sample", "unranked": "", "": ""}
WHERE = {
    "held_out": "on {n} held-out prompts (the run's templates; no prompt and no fact the ranking saw)",
    "in_sample": "on the {n} prompts the ranking was made on (in sample)",
}


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def knockout_body(stage: StageFolder) -> Body:
    meta = stage.metadata
    cfg: dict[str, Any] = meta.get("config", {})
    summary = stage.csv("knockout_summary.csv")
    runs = stage.csv("knockout.csv")
    sets = list(dict.fromkeys(r.get("prompt_set", "") for r in runs))
    counts = meta.get("counts", {}).get("prompts")
    sizes: dict[str, Any] = counts if isinstance(counts, dict) else dict.fromkeys(sets, counts)
    word = "component" if cfg.get("include_mlps") or cfg.get("components") else "head"
    where = " at the last token" if cfg.get("end_only") else ""
    setting = f"{plural(int(cfg.get('n_random', 0)), 'random draw')}, {cfg.get('ablation', 'mean')} ablation{where}"
    texts, gaps, rows = [], {}, []
    for prompt_set in sets:
        mine = [r for r in summary if r.get("prompt_set", "") == prompt_set]
        base = next(r for r in runs if r.get("prompt_set", "") == prompt_set and r["ranking"] == "none")
        text, gaps[prompt_set] = _curve_text(mine, runs, base, prompt_set, sizes.get(prompt_set, "n/a"), word)
        texts.append(text)
        rows += _table_rows(prompt_set, mine, base)
    text = " ".join(texts) + f" Settings: {setting}."
    if set(gaps) == {"held_out", "in_sample"} and all(is_number(g) for g in gaps.values()):
        text += (f" The effect-ranked {word}s cost {pct(gaps['held_out'])} of accuracy more than random ones held out, "
                 f"against {pct(gaps['in_sample'])} in sample; the held-out number is the one that does not reuse "
                 "the prompts the ranking was chosen on.")  # fmt: skip
    elif "held_out" not in sets and meta.get("split"):
        text += f" Prompt sets: {meta['split']}."
    columns = ("k", "effect-rank accuracy", "random accuracy (mean ± sd)", "effect-rank probability",
               "random probability (mean ± sd)")  # fmt: skip
    named = any(SET_NAMES.get(s, s) for s in sets)
    table = Table(f"Accuracy and mean answer probability with k {word}s knocked out",
                  (("prompts",) if named else ()) + columns,
                  [row if named else row[1:] for row in rows])  # fmt: skip
    caption = (f"Accuracy (left) and answer probability (right) after knocking out the top-k {word}s by effect "
               "vs k random ones, ± 1 sd (paper Figure 3)"
               + ("; held out solid, in sample dashed." if len(sets) > 1 else "."))  # fmt: skip
    figures = [Figure(stage.folder / "knockout.png", caption)] if stage.has("knockout.png") else []
    tables = [table]
    if stage.has("knockout_place_summary.csv"):
        extra, place_tables = knockout_places(stage)
        text += extra
        tables += place_tables
    small = {SET_NAMES.get(s, s): sizes.get(s) for s in sets}
    return Body(text, figures, tables, small_samples(small, "prompt"))


def _curve_text(
    summary: list[dict[str, str]], runs: list[dict[str, str]], base: dict[str, str], prompt_set: str, n: Any, word: str
) -> tuple[str, float]:
    """One prompt set's sentences, and its gap at the largest k (random mean minus effect-rank accuracy)."""
    base_acc, base_prob = to_float(base["accuracy"]), to_float(base["mean_prob"])
    first, last = summary[0], summary[-1]
    k1, kmax = int(first["k"]), int(last["k"])
    effect_max = to_float(last["effect_accuracy"])
    rand_mean, rand_sd = to_float(last["random_accuracy_mean"]), to_float(last["random_accuracy_std"])
    top = next((r["components"].split() for r in runs if r.get("prompt_set", "") == prompt_set
                and r["ranking"] == "effect" and int(r["k"]) == kmax), [])  # fmt: skip
    on = WHERE[prompt_set].format(n=n) if prompt_set in WHERE else f"on {n} prompts"
    gap = rand_mean - effect_max
    if not (is_number(base_acc) and base_acc > 0):
        return (f"With nothing knocked out the model answers {pct(base_acc)} of the prompts {on}, so accuracy cannot "
                f"drop; the mean answer probability goes from {num(base_prob)} to {num(to_float(last['effect_prob']))} "
                f"with the top {kmax} {word}s ({listing(top)}) knocked out, and to "
                f"{num(to_float(last['random_prob_mean']))} with {kmax} random ones.", gap)  # fmt: skip
    effect_1 = to_float(first["effect_accuracy"])
    verb = "raises" if is_number(effect_1) and effect_1 > base_acc else "drops"
    text = f"{on[0].upper()}{on[1:]}, knocking out the top {plural(k1, word)} {verb} accuracy from {pct(base_acc)} to "
    text += pct(effect_1)
    if kmax != k1:
        text += f", the top {kmax} ({listing(top)}) to {pct(effect_max)}"
    text += f", while {kmax} random {word}s leave {pct(rand_mean)} ± {pct(rand_sd)}."
    margin = max(rand_sd, 0.02) if is_number(rand_sd) else 0.02  # a gap within the random spread is no gap
    if gap > margin:
        text += f" Effect-ranked {word}s matter more than random ones."
    elif gap < -margin:
        text += f" Random {word}s cost more than the effect-ranked ones here."
    else:
        text += f" At this size effect-ranked and random {word}s cost about the same."
    return text, gap


def _table_rows(prompt_set: str, summary: list[dict[str, str]], base: dict[str, str]) -> list[tuple[str, ...]]:
    """The table rows of one prompt set: k = 0 (nothing knocked out), then every k; the set's name first."""
    name = SET_NAMES.get(prompt_set, prompt_set)
    base_acc, base_prob = to_float(base["accuracy"]), to_float(base["mean_prob"])
    rows = [(name, "0", pct(base_acc), pct(base_acc), num(base_prob), num(base_prob))]
    for r in summary:
        rows.append((
            name, r["k"], pct(to_float(r["effect_accuracy"])),
            f"{pct(to_float(r['random_accuracy_mean']))} ± {pct(to_float(r['random_accuracy_std']))}",
            num(to_float(r["effect_prob"])),
            f"{num(to_float(r['random_prob_mean']))} ± {num(to_float(r['random_prob_std']))}",
        ))  # fmt: skip
    return rows

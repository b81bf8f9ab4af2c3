"""The knockout stage's files: its tables and figures from the sweep rows of every prompt set (`knockout.py`).

Every table has a prompt_set column first ("held_out", "in_sample" or "unranked", `stages/knockout.py`), its rows
in the order the sets were scored: held_out before in_sample. The figures draw every set's curves on one pair of
axes: held out solid, in sample dashed.
    knockout.csv                  every configuration: prompt_set, k, ranking, seed, accuracy, mean_prob, components
    knockout_summary.csv          per prompt set and k: effect-rank, random-rank mean and sample sd (`summarize`)
    knockout.png                  accuracy and answer probability against k (`report/plots.knockout_curves`)
    knockout_by_place.csv,        answers scored token by token: per answer place and carry group
    knockout_place_summary.csv,
    knockout_<place>.png
    prompts_<prompt_set>.jsonl    every prompt of each set (metadata.json's sample indices point into it)
    metadata.json                 last: its presence means the folder is complete
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import statistics
from pathlib import Path
from typing import Any

from arithmech.data import PromptPair, write_prompt_file
from arithmech.data.places import place_name
from arithmech.knockout.sweep import SweepRow, sample_std
from arithmech.runs import atomic_write_json, atomic_write_text, cell, csv_text, defined_row
from arithmech.stages.knockout_config import KnockoutConfig

SET_LABELS = {"held_out": "held out", "in_sample": "in sample", "unranked": ""}
"""How a figure's legend names each prompt set ("" for the one set of an unranked run)."""


def prompt_set_order(rows: list[SweepRow]) -> list[str]:
    """The prompt sets of `rows`, in the order they were scored (held_out first)."""
    return list(dict.fromkeys(r.prompt_set for r in rows))


def summarize(rows: list[SweepRow]) -> list[dict[str, Any]]:
    """Per prompt set (held_out first) and k: effect-rank accuracy and probability, and the random-rank mean and
    sample standard deviation (ddof 1; NaN with no random draws, and the deviation NaN with one:
    knockout_summary.csv holds an empty cell there)."""
    out: list[dict[str, Any]] = []
    for prompt_set in prompt_set_order(rows):
        mine = [r for r in rows if r.prompt_set == prompt_set]
        for k in sorted({r.k for r in mine if r.k > 0}):
            effect = next(r for r in mine if r.k == k and r.ranking == "effect")
            rand = [r for r in mine if r.k == k and r.ranking == "random"]
            acc = [r.accuracy for r in rand]
            prob = [r.mean_prob for r in rand]
            out.append(
                {
                    "prompt_set": prompt_set,
                    "k": k,
                    "effect_accuracy": effect.accuracy,
                    "random_accuracy_mean": statistics.fmean(acc) if acc else math.nan,
                    "random_accuracy_std": sample_std(acc),
                    "effect_prob": effect.mean_prob,
                    "random_prob_mean": statistics.fmean(prob) if prob else math.nan,
                    "random_prob_std": sample_std(prob),
                }
            )
    return out


def baseline(rows: list[SweepRow], prompt_set: str) -> SweepRow:
    """The row of a prompt set with nothing knocked out."""
    return next(r for r in rows if r.prompt_set == prompt_set and r.ranking == "none")


def prompt_file(prompt_set: str) -> str:
    """The name of the file holding a prompt set's prompts."""
    return f"prompts_{prompt_set}.jsonl"


def write_knockout_outputs(
    out: Path,
    rows: list[SweepRow],
    metadata: dict[str, Any],
    model: str,
    cfg: KnockoutConfig,
    prompts: dict[str, list[PromptPair]] | None = None,
) -> None:
    """Every file of the module docstring, atomically; metadata.json last. `prompts`: file name -> prompts."""
    from arithmech.report.plots import knockout_curves

    out.mkdir(parents=True, exist_ok=True)
    (out / "metadata.json").unlink(missing_ok=True)
    for name, pairs in (prompts or {}).items():
        write_prompt_file(out / name, pairs)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["prompt_set", "k", "ranking", "seed", "accuracy", "mean_prob", "components"])
    for r in rows:
        writer.writerow([r.prompt_set, r.k, r.ranking, "" if r.seed is None else r.seed, cell(r.accuracy, ".6f"),
                         cell(r.mean_prob, ".6f"), " ".join(r.components)])  # fmt: skip
    atomic_write_text(out / "knockout.csv", buffer.getvalue())
    summary = summarize(rows)
    atomic_write_text(out / "knockout_summary.csv", csv_text([defined_row(r) for r in summary], float_format=".6f"))
    counts = metadata["counts"]["prompts"]
    knockout_curves(_curves(rows, summary, counts), out / "knockout.png",
                    f"{cfg.ablation} ablation, {_sizes(counts)}: {model}")  # fmt: skip
    if rows[0].by_place:
        _write_place_outputs(out, rows, model, cfg)
    atomic_write_json(out / "metadata.json", metadata)


def _curves(
    rows: list[SweepRow], summary: list[dict[str, Any]], counts: dict[str, int]
) -> list[tuple[str, list[dict[str, Any]], float, float]]:
    """(legend label, summary rows, baseline accuracy, baseline probability) of every prompt set."""
    curves = []
    for prompt_set in prompt_set_order(rows):
        base = baseline(rows, prompt_set)
        label = SET_LABELS.get(prompt_set, prompt_set)
        label = f"{label} ({counts[prompt_set]})" if label and prompt_set in counts else label
        curves.append((label, [r for r in summary if r["prompt_set"] == prompt_set], base.accuracy, base.mean_prob))
    return curves


def _sizes(counts: dict[str, int]) -> str:
    """"32 held-out + 32 in-sample prompts", or "64 prompts" for one unranked set."""
    named = [(SET_LABELS.get(name, name), n) for name, n in counts.items()]
    if len(named) == 1 and not named[0][0]:
        return f"{named[0][1]} prompts"
    return " + ".join(f"{n} {label.replace(' ', '-')}" for label, n in named) + " prompts"


def _write_place_outputs(out: Path, rows: list[SweepRow], model: str, cfg: KnockoutConfig) -> None:
    """knockout_by_place.csv and knockout_place_summary.csv (place "answer": whole answers, then "units",
    "tens", ...), and one knockout_<place>.png per answer place (group "all", every prompt set)."""
    from arithmech.report.plots import knockout_curves

    by_place = [
        {"prompt_set": r.prompt_set, "k": r.k, "ranking": r.ranking, "seed": "" if r.seed is None else r.seed,
         "place": _place_label(place), "group": group, "prompts": n, "accuracy": cell(accuracy, ".6f"),
         "mean_prob": cell(prob, ".6f")}
        for r in rows for place, group, n, accuracy, prob in r.by_place
    ]  # fmt: skip
    atomic_write_text(out / "knockout_by_place.csv", csv_text(by_place))
    summary_rows = []
    figures: dict[int, list[tuple[str, list[dict[str, Any]], float, float]]] = {}
    sizes: dict[int, dict[str, int]] = {}
    for prompt_set in prompt_set_order(rows):
        mine = [r for r in rows if r.prompt_set == prompt_set]
        for place, group, n, *_ in mine[0].by_place:
            at = [_at_place(r, place, group) for r in mine]
            summary = summarize(at)
            summary_rows += [{"prompt_set": prompt_set, "place": _place_label(place), "group": group, "prompts": n,
                              **{k: v for k, v in defined_row(r).items() if k != "prompt_set"}}
                             for r in summary]  # fmt: skip
            if place is not None and group == "all":
                base = baseline(at, prompt_set)
                label = SET_LABELS.get(prompt_set, prompt_set)
                figures.setdefault(place, []).append((f"{label} ({n})" if label else label, summary,
                                                      base.accuracy, base.mean_prob))  # fmt: skip
                sizes.setdefault(place, {})[prompt_set] = n
    for place, curves in figures.items():
        title = f"{cfg.ablation} ablation, answer {place_name(place)} digit, {_sizes(sizes[place])}: {model}"
        knockout_curves(curves, out / f"knockout_{place_name(place)}.png", title)
    atomic_write_text(out / "knockout_place_summary.csv", csv_text(summary_rows, float_format=".6f"))


def _place_label(place: int | None) -> str:
    """The place column of the per-place tables: "answer" for whole answers, else "units", "tens", ..."""
    return "answer" if place is None else place_name(place)


def _at_place(row: SweepRow, place: int | None, group: str) -> SweepRow:
    """The row's scores at one answer place (None: whole answers) and group, as a row of its own."""
    accuracy, prob = next((a, p) for q, g, _, a, p in row.by_place if (q, g) == (place, group))
    return dataclasses.replace(row, accuracy=accuracy, mean_prob=prob, by_place=())

"""The evaluate section's arithmetic part: base vs tuned accuracy per operation, next to the general-ability change.

Reads, from a finished evaluate folder, {base,tuned}/arithmetic.csv (per benchmark, operation and formation:
first-token accuracy and exact match with 95% Wilson intervals clustered by template and fact,
evaluate/arithmetic.py), results.csv's general-ability rows (general: perplexity and KL to the base model; choice
benchmarks: accuracy) and the split.json of the evaluation and of the finetune folder beside it. Nothing is
recomputed.

A change is called beyond the noise when the base and tuned 95% intervals do not overlap. That is conservative
(two intervals can overlap while the difference is significant), so a change it calls real is one a reader can
trust at this sample size; the others are reported as within the intervals, not as no change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arithmech.report.page import Table, is_number, num, pct, to_float
from arithmech.report.run_folder import StageFolder


@dataclass(frozen=True)
class ArithmeticPart:
    """A sentence for the section's reading and the per-operation table (empty when no arithmetic was run)."""

    reading: str = ""
    tables: list[Table] = field(default_factory=list)
    covers: tuple[str, ...] = ()
    """Benchmark kinds the reading already reads out (the section's own reading leaves them out)."""


def _folder(stage: StageFolder, which: str) -> Path | None:
    """base/ or tuned/ of a pipeline evaluate folder; the folder itself for `arithmech evaluate --out` (base)."""
    sub = stage.folder / which
    if (sub / "metadata.json").is_file():
        return sub
    return stage.folder if which == "base" and stage.has("results.csv") else None


def _rows(folder: Path | None) -> dict[tuple[str, str], dict[str, str]]:
    """(benchmark, operation) -> its row of arithmetic.csv, over all formations."""
    if folder is None or not (folder / "arithmetic.csv").is_file():
        return {}
    rows = StageFolder("evaluate", folder, "done").csv("arithmetic.csv")
    return {(r["benchmark"], r["operation"]): r for r in rows if r["formation"] == "all" and r["operation"] != "all"}


def _cell(row: dict[str, str] | None, key: str = "accuracy", low: str = "ci_low", high: str = "ci_high") -> str:
    if not row:
        return "n/a"
    return f"{pct(to_float(row[key]), 1)} [{pct(to_float(row[low]), 1)}-{pct(to_float(row[high]), 1)}]"


def _change(base: dict[str, str], tuned: dict[str, str] | None, key: str = "accuracy") -> tuple[str, str]:
    """("+36.7 points", "beyond the 95% intervals" / "within the 95% intervals"), or n/a."""
    if not tuned:
        return "n/a", ""
    prefix = "exact_" if key == "exact_accuracy" else ""
    b, t = to_float(base[key]), to_float(tuned[key])
    if not (is_number(b) and is_number(t)):
        return "n/a", ""
    apart = to_float(tuned[f"{prefix}ci_low"]) > to_float(base[f"{prefix}ci_high"]) or \
        to_float(tuned[f"{prefix}ci_high"]) < to_float(base[f"{prefix}ci_low"])  # fmt: skip
    return f"{(t - b) * 100:+.1f} points", "beyond the 95% intervals" if apart else "within the 95% intervals"


def _label(benchmark: str, operation: str) -> str:
    return f"multi-digit {operation} (10-99)" if benchmark.startswith("arithmetic-multidigit") else operation


def _general_change(base: dict[str, dict[str, str]], tuned: dict[str, dict[str, str]]) -> list[str]:
    """The general-ability rows of results.csv as short phrases: perplexity (KL) and choice accuracies."""
    phrases = []
    for name, b in base.items():
        t = tuned.get(name, {})
        if b.get("kind") == "general":
            phrases.append(f"perplexity on general text {num(to_float(b.get('perplexity')))} -> "
                           f"{num(to_float(t.get('perplexity')))} (KL to the base model {num(to_float(t.get('kl')))})")
        elif b.get("kind") == "choice":
            phrases.append(f"{name} {pct(to_float(b.get('accuracy')), 1)} -> {pct(to_float(t.get('accuracy')), 1)} "
                           f"(n={b.get('n', 'n/a')})")  # fmt: skip
    return phrases


def _split_note(stage: StageFolder) -> str:
    """Whether the tuned model was trained on the train part of the split it is tested on (pipeline layout)."""
    tested, trained = stage.folder / "tuned" / "split.json", stage.folder.parent / "finetune" / "split.json"
    if not (tested.is_file() and trained.is_file()):
        return ""
    a: dict[str, Any] = StageFolder("evaluate", tested.parent, "done").json("split.json")
    b: dict[str, Any] = StageFolder("finetune", trained.parent, "done").json("split.json")
    if a.get("fingerprint") == b.get("fingerprint"):
        return f" The tuned model was trained on the train part of this split ({a.get('fingerprint')})."
    return (f" WARNING: the tuned model was trained on another split ({b.get('fingerprint')}) than the one tested "
            f"({a.get('fingerprint')}), so some test prompts may have been trained on.")  # fmt: skip


def arithmetic_part(
    stage: StageFolder, base_results: dict[str, dict[str, str]], tuned_results: dict[str, dict[str, str]]
) -> ArithmeticPart:
    """The per-operation comparison of an evaluate folder (see the module docstring)."""
    base, tuned = _rows(_folder(stage, "base")), _rows(_folder(stage, "tuned"))
    if not base and not tuned:
        return ArithmeticPart()
    rows, phrases = [], []
    for key in dict.fromkeys([*base, *tuned]):
        b, t = base.get(key) or {}, tuned.get(key)
        multi = key[0].startswith("arithmetic-multidigit")
        measure = "exact_accuracy" if multi else "accuracy"
        change, verdict = _change(b, t, measure) if b else ("n/a", "")
        rows.append((_label(*key), (b or t or {}).get("n", "n/a"), _cell(b), _cell(t), _cell(b, "exact_accuracy",
                     "exact_ci_low", "exact_ci_high"), _cell(t, "exact_accuracy", "exact_ci_low", "exact_ci_high"),
                     f"{change} ({verdict})" if verdict else change))  # fmt: skip
        shown = "exact " if multi else ""
        if t and b:
            phrases.append(f"{_label(*key)} {shown}{pct(to_float(b[measure]), 1)} -> {pct(to_float(t[measure]), 1)} "
                           f"({change}, {verdict})")  # fmt: skip
        elif b:
            phrases.append(f"{_label(*key)} {shown}{pct(to_float(b[measure]), 1)}")
    lead = "Held-out arithmetic, base -> tuned" if tuned else "Held-out arithmetic (base model)"
    reading = f"{lead} (unseen templates and operand pairs; first answer token, exact number for multi-digit): "
    reading += "; ".join(phrases) + "."
    general = _general_change(base_results, tuned_results) if tuned else []
    if general:
        reading += " General ability, base -> tuned: " + "; ".join(general) + "."
    reading += _split_note(stage)
    table = Table(
        "Arithmetic per operation on held-out templates and operand pairs: accuracy [95% Wilson interval, clustered]",
        ("operation", "n", "base first token", "tuned first token", "base exact", "tuned exact",
         "change (exact for multi-digit)"),
        rows,
    )  # fmt: skip
    return ArithmeticPart(reading, [table], ("arithmetic", "general", "choice") if general else ("arithmetic",))

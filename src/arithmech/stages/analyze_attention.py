"""The attention-roles analysis stage: where each key head looks from END, and what kind of head it is.

Reads a finished identify run (its reference prompts and key heads), computes each chosen head's END-row
attention grouped by token role (`analysis/attention.py`), labels it an operand head, an operator head or
neither, and writes into its own folder, each atomically and metadata.json last:

- attention_roles.csv    head, layer, head_index, mass on A, B, operator, prefix, other, A+B, label
- attention_roles.png    one stacked bar per head (paper Figure 5)
- attention_examples.png END attention of the heads over single prompts' tokens (Figure 7; if n_examples > 0)
- attention_examples.json the tokens, roles and weights drawn in attention_examples.png
- attention_by_place.csv  (identify run of --answer-digits) the same per answer place, units, tens, ..., with the
                          mass on each operand's last two tokens
- metadata.json          model, config, heads and where they came from, counts, versions, git sha
"""

from __future__ import annotations

import csv
import io
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from arithmech.analysis.attention import (
    ROLES,
    end_attention,
    label_heads,
    operand_token_masses,
    operand_token_names,
    role_scores,
)
from arithmech.data import ROLE_CODES, TokenizedPairs, tokenize_pairs
from arithmech.data.places import place_name
from arithmech.data.sampling import sample_pairs
from arithmech.errors import DataError
from arithmech.models.load import ModelHandle
from arithmech.models.sites import Component, parse_components
from arithmech.runs import atomic_write_json, atomic_write_text, cell, csv_text, git_sha, package_versions
from arithmech.stages.analyze_attention_config import AttentionConfig
from arithmech.stages.identify_run import IdentifyRun, read_identify_run

logger = logging.getLogger(__name__)

_ROLE_NAMES = {code: name for name, code in ROLE_CODES.items()}
MAX_EXAMPLE_HEADS = 8


@dataclass
class AttentionResult:
    """Mean END attention per role of each head, its label, and where the files went."""

    heads: list[Component]
    scores: torch.Tensor
    """[head, role] mean END attention mass, roles in `ROLES` order."""
    labels: list[str]
    heads_source: str
    """"config", "key_heads" or "top_k": where the head list came from."""
    n_prompts: int
    out_dir: Path
    metadata: dict[str, Any]

    def as_dict(self) -> dict[str, dict[str, float | str]]:
        """{head name: {role: mass, ..., "label": label}}."""
        return {
            head.name: {**dict(zip(ROLES, row, strict=True)), "label": label}
            for head, row, label in zip(self.heads, self.scores.tolist(), self.labels, strict=True)
        }


def choose_heads(run: IdentifyRun, cfg: AttentionConfig, handle: ModelHandle) -> tuple[list[Component], str]:
    """The heads to analyse and their source: the config, the run's key heads, else its top-k heads."""
    if cfg.heads:
        return parse_components(",".join(cfg.heads), handle.dims), "config"
    key_heads = run.key.get("key_heads") or []
    if key_heads:
        return parse_components(",".join(key_heads), handle.dims), "key_heads"
    logger.info("the identify run has no key heads; analysing its top %d heads by effect", cfg.top_k)
    return run.ranked("head")[: cfg.top_k], "top_k"


def _check_roles(t: TokenizedPairs, handle: ModelHandle, run_dir: Path) -> None:
    if t.roles_available:
        return
    if not getattr(handle.tokenizer, "is_fast", False):
        raise DataError(
            f"token roles need character offsets, which this model's slow tokenizer "
            f"({type(handle.tokenizer).__name__}) cannot give; load the model with a fast tokenizer"
        )
    raise DataError(
        f"the reference prompts of {str(run_dir)!r} have no character spans for A, B and the operator, "
        "so tokens have no roles; identify with generated prompts, or add \"spans\" to your prompt file"
    )


def token_strings(tokenizer: Any, ids: list[int]) -> list[str]:
    """Readable text of each token for an axis: spaces as '␣', newlines as '\\n'."""
    out = []
    for token_id in ids:
        text = tokenizer.decode([token_id]) or str(tokenizer.convert_ids_to_tokens(token_id))
        out.append(text.replace(" ", "␣").replace("\n", "\\n"))
    return out


@torch.no_grad()
def analyze_attention(
    handle: ModelHandle, cfg: AttentionConfig, run_dir: str | Path, out_dir: str | Path, quiet: bool = False
) -> AttentionResult:
    """Run the attention-roles analysis on an identify run's reference prompts and write `out_dir`."""
    from tqdm.auto import tqdm

    run = read_identify_run(run_dir, handle)
    heads, heads_source = choose_heads(run, cfg, handle)
    if not heads:
        raise DataError(f"the identify run {str(run_dir)!r} lists no heads; pass the heads to analyse")
    if not run.pairs:
        raise DataError(f"the identify run {str(run_dir)!r} has no reference prompts; rerun identify")
    pairs, sample = sample_pairs(run.pairs, cfg.max_prompts, cfg.seed)
    t, _ = tokenize_pairs(handle.tokenizer, pairs, answer_digits=run.answer_digits)  # rows: one per answer token
    _check_roles(t, handle, Path(run_dir))

    start = time.perf_counter()
    layers = sorted({h.layer for h in heads})
    with tqdm(total=len(t.end), desc="attention", unit="prompt", disable=quiet) as bar:
        rows = end_attention(handle.view, t.ref_ids, t.ref_mask, t.end, layers, cfg.batch_size, bar.update)
    layer_index = torch.tensor([layers.index(h.layer) for h in heads])
    head_index = torch.tensor([h.head for h in heads])
    head_rows = rows[:, layer_index, head_index]  # [batch, head (chosen), pos]
    scores = role_scores(head_rows, t.roles, t.ref_mask)  # [head, role]
    labels = label_heads(scores, cfg.tau)
    elapsed = time.perf_counter() - start

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metadata.json").unlink(missing_ok=True)
    metadata = {
        "stage": cfg.STAGE,
        "model": handle.source,
        "dims": asdict(handle.dims),
        "identify_runs": [run.record],
        "config": asdict(cfg),
        "heads": [h.name for h in heads],
        "heads_source": heads_source,
        "prompts": sample,
        "roles": list(ROLES),
        "label_rule": (
            f"operand if A+B >= {cfg.tau:g} and A+B > operator; operator if operator >= {cfg.tau:g} "
            "and operator > A+B; else neither (masses: mean END attention over the reference prompts)"
        ),
        "counts": {"prompts": t.n_pairs, "heads": len(heads), **({"scored_tokens": len(t.end)} if run.answer_digits
                                                                   else {})},  # fmt: skip
        "answer_digits": run.answer_digits,
        "timings": {"attention_s": elapsed},
        "versions": package_versions(),
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    _write_outputs(out, handle, t, heads, head_rows, scores, labels, cfg)
    if run.answer_digits:
        atomic_write_text(out / "attention_by_place.csv", place_csv(heads, head_rows, t, cfg.tau))
    atomic_write_json(out / "metadata.json", metadata)
    return AttentionResult(heads, scores, labels, heads_source, len(t.end), out, metadata)


def roles_csv(heads: list[Component], scores: torch.Tensor, labels: list[str]) -> str:
    """One row per head: head, layer, head_index, mass per role, operand (A+B), label."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["head", "layer", "head_index", *ROLES, "operand", "label"])
    for head, row, label in zip(heads, scores.tolist(), labels, strict=True):
        masses = dict(zip(ROLES, row, strict=True))
        writer.writerow(
            [head.name, head.layer, head.head, *(cell(v, ".6f") for v in row),
             cell(masses['A'] + masses['B'], ".6f"), label]
        )  # fmt: skip
    return buffer.getvalue()


def place_csv(heads: list[Component], head_rows: torch.Tensor, t: TokenizedPairs, tau: float) -> str:
    """Answers scored token by token: one row per head and answer place (units, tens, ...: the digit being
    written, `data/places.py`), the role masses, operand (A+B), the mass on each operand's last two tokens (A[-2],
    A[-1], B[-2], B[-1]: tens and units on a digit-splitting tokenizer), the label, and the number of prompts."""
    rows = []
    for place in sorted(set(t.answer_place.tolist())):
        at = t.answer_place == place
        scores = role_scores(head_rows[at], t.roles[at], t.ref_mask[at])  # [head, role]
        tokens = operand_token_masses(head_rows[at], t.roles[at], t.ref_mask[at]).mean(0)  # [head, column]
        for head, row, token, label in zip(heads, scores.tolist(), tokens.tolist(), label_heads(scores, tau),
                                           strict=True):  # fmt: skip
            masses = dict(zip(ROLES, row, strict=True))
            rows.append({"head": head.name, "place": place_name(place), "prompts": int(at.sum()),
                         **{r: cell(v, ".6f") for r, v in masses.items()},
                         "operand": cell(masses["A"] + masses["B"], ".6f"),
                         **{n: cell(v, ".6f") for n, v in zip(operand_token_names(), token, strict=True)},
                         "label": label})  # fmt: skip
    return csv_text(rows)


def _write_outputs(
    out: Path,
    handle: ModelHandle,
    t: TokenizedPairs,
    heads: list[Component],
    head_rows: torch.Tensor,
    scores: torch.Tensor,
    labels: list[str],
    cfg: AttentionConfig,
) -> None:
    from arithmech.report.attention_plots import attention_examples, role_bar_chart

    names = [h.name for h in heads]
    model_name = handle.source.get("model", "?")
    atomic_write_text(out / "attention_roles.csv", roles_csv(heads, scores, labels))
    role_bar_chart(
        names, scores.numpy(), ROLES, labels, out / "attention_roles.png",
        f"END attention by token role: {model_name}, {len(t.end)} prompts", cfg.tau,
    )  # fmt: skip
    shown = min(len(heads), MAX_EXAMPLE_HEADS)
    examples = []
    for i in range(min(cfg.n_examples, len(t.end))):
        n = int(t.end[i]) + 1
        examples.append({
            "prompt": t.pairs[i].reference,
            "tokens": token_strings(handle.tokenizer, t.ref_ids[i, :n].tolist()),
            "roles": [_ROLE_NAMES[int(code)] for code in t.roles[i, :n]],
            "heads": names[:shown],
            "weights": [[round(w, 6) for w in r] for r in head_rows[i, :shown, :n].tolist()],  # [head, pos]
        })  # fmt: skip
    atomic_write_json(out / "attention_examples.json", examples)
    if examples:
        attention_examples(
            examples, names[:shown], out / "attention_examples.png",
            f"END attention over single prompts: {model_name}",
        )  # fmt: skip

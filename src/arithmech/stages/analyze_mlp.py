"""The analyze-mlp stage: the MLP logit lens of paper Figure 6 on the prompts of a finished identify run.

Reads the identify run's reference prompts, runs the model once per batch recording END states, and writes
into its own folder, each file atomically and metadata.json last:
    mlp_cosines.csv          per layer, mean over prompts: cos_in_A, cos_in_A_wrong, cos_in_B, cos_in_B_wrong,
                             cos_update_C, cos_update_C_wrong (then the same names + "_std")
    mlp_cosines.png          Figure 6a/6b: the curves over layers, correct vs wrong candidate numbers
    mlp_update_ranks.csv     for one prompt, per layer and number token: its rank in the vocabulary
                             (0 = top) and among the number tokens, in the logits of the MLP update
    mlp_update_ranks.png     Figure 6c: that table as a layer x number heatmap, the prompt in the title
    metadata.json            model, identify run, config, counts, token sets, versions, git sha
Definitions and formulas: `arithmech.analysis.logit_lens`.
"""

from __future__ import annotations

import csv
import io
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arithmech.analysis.logit_lens import (
    COSINE_COLUMNS,
    largest_number,
    mlp_cosines,
    number_token_ids,
    operand_token_ids,
    update_logits,
    update_ranks,
)
from arithmech.data import PromptPair, tokenize_pairs
from arithmech.data.sampling import sample_pairs
from arithmech.errors import ConfigError
from arithmech.models.load import ModelHandle
from arithmech.patching.states import collect_end_states
from arithmech.runs import atomic_write_json, atomic_write_text, cell, defined, git_sha, package_versions
from arithmech.stages.analyze_mlp_config import AnalyzeMlpConfig
from arithmech.stages.identify_run import analysis_folders, analysis_header, chosen_layers, read_identify_run

logger = logging.getLogger(__name__)


@dataclass
class MlpLensResult:
    """What analyze-mlp computed, and where it wrote it."""

    layers: list[int]
    """Layers reported (rows of every table below)."""
    cosines: dict[str, np.ndarray]
    """COSINE_COLUMNS -> [layer, prompt] per-prompt cosines."""
    mean: dict[str, np.ndarray]
    """COSINE_COLUMNS -> [layer] mean over prompts."""
    ranks: np.ndarray
    """[layer, n_numbers] rank (0 = top) of each number token in the example prompt's MLP-update logits."""
    number_ids: list[int]
    number_labels: list[str]
    example: dict[str, Any]
    out_dir: Path
    metadata: dict[str, Any]


def _label(tokenizer: Any, token_id: int) -> str:
    return str(tokenizer.decode([token_id])).replace(" ", "␣").replace("\n", "⏎")


@torch.no_grad()
def analyze_mlp(
    handle: ModelHandle, cfg: AnalyzeMlpConfig, run_dir: str | Path, out_dir: str | Path, quiet: bool = False
) -> MlpLensResult:
    """Run the MLP logit lens on the prompts of the identify run in `run_dir`; write into `out_dir`."""
    from tqdm.auto import tqdm

    run_path, out = analysis_folders(run_dir, out_dir, "MLP analysis", "mlp")
    dims = handle.dims
    layers = chosen_layers(cfg.layers, dims.n_layers)
    run = read_identify_run(run_path, handle, one_answer_token="the MLP analysis")
    start_time = time.perf_counter()
    sampled, sample = sample_pairs(run.pairs, cfg.max_prompts, cfg.seed)
    tokenized, _ = tokenize_pairs(handle.tokenizer, sampled)
    pairs = tokenized.pairs
    if cfg.example_prompt >= len(pairs):
        raise ConfigError(
            f"example prompt index {cfg.example_prompt} is out of range: the run has {len(pairs)} prompts; "
            f"choose 0..{len(pairs) - 1}"
        )
    a_ids, b_ids = operand_token_ids(handle.tokenizer, pairs)
    c_ids = tokenized.answer_ids
    max_number = cfg.max_number if cfg.max_number is not None else largest_number(pairs)
    numbers = number_token_ids(handle.tokenizer, pairs, max_number)

    chunks: dict[str, list[torch.Tensor]] = {name: [] for name in COSINE_COLUMNS}
    ranks = torch.zeros(0)
    example: dict[str, Any] = {}
    with tqdm(total=len(pairs), desc="MLP logit lens", unit="prompt", disable=quiet) as bar:
        for start in range(0, len(pairs), cfg.batch_size):
            rows = slice(start, start + cfg.batch_size)
            width = int(tokenized.end[rows].max()) + 1
            states = collect_end_states(
                handle.view,
                tokenized.ref_ids[rows, :width],
                tokenized.ref_mask[rows, :width],
                tokenized.end[rows],
            )
            cos = mlp_cosines(handle.view, states, a_ids[rows], b_ids[rows], c_ids[rows], numbers)
            for name in COSINE_COLUMNS:
                chunks[name].append(cos[name])
            if start <= cfg.example_prompt < start + cfg.batch_size:
                local, index = cfg.example_prompt - start, cfg.example_prompt
                ranks = update_ranks(handle.view, states, numbers["C"], prompt=local)
                predicted = int(update_logits(handle.view, states.resid_final[local]).argmax())
                ids = {"A": int(a_ids[index]), "B": int(b_ids[index]), "C": int(c_ids[index])}
                example = _example_info(handle.tokenizer, pairs[index], index, predicted, ids)
            bar.update(len(range(*rows.indices(len(pairs)))))
    elapsed = time.perf_counter() - start_time

    # per prompt, [layer, prompt]
    cosines = {name: torch.cat(chunks[name], dim=1)[layers].numpy() for name in COSINE_COLUMNS}
    mean = {name: np.nanmean(values, axis=1) for name, values in cosines.items()}
    std = {name: np.nanstd(values, axis=1) for name, values in cosines.items()}
    rank_rows = ranks[layers].numpy()  # [layer, n_numbers]
    number_ids = numbers["C"].tolist()
    labels = [_label(handle.tokenizer, token) for token in number_ids]
    metadata = {
        **analysis_header(handle, run, cfg),
        "counts": {"prompts": len(pairs), "prompts_in_run": len(run.pairs), "layers": len(layers)},
        "prompts": sample,
        "max_number": max_number,
        "number_tokens": {
            role: [[int(t), _label(handle.tokenizer, int(t))] for t in ids.tolist()]
            for role, ids in numbers.items()
        },
        "example": example,
        "definitions": {
            "MLP_in": "residual the MLP reads at END (its pre-norm's input; the block input if parallel)",
            "update": "MLP_out - MLP_in = the MLP's contribution to the residual (after any post-MLP norm)",
            "W_U": "raw unembedding rows (no centering, no bias)",
            "operand_token": "first token of the operand as it follows the text before it in the prompt",
            "wrong": "mean over the candidate number tokens other than the correct one",
            "rank": "0 = top of the whole vocabulary in unembed(final_norm(update)), soft-cap left out",
        },
        "timings": {"lens_s": elapsed},
        "versions": package_versions(),
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    result = MlpLensResult(layers, cosines, mean, rank_rows, number_ids, labels, example, out, metadata)
    _write_outputs(result, std, handle.source.get("model", "?"))
    return result


def _example_info(
    tokenizer: Any, pair: PromptPair, index: int, predicted: int, ids: dict[str, int]
) -> dict[str, Any]:
    """The Figure 6c prompt: its text, answer, the model's own next token, and the A/B/C token ids."""
    return {
        "index": index,
        "reference": pair.reference,
        "answer": pair.answer,
        "predicted_token": _label(tokenizer, predicted),
        "answered": predicted == ids["C"],
        "token_ids": ids,
    }


def cosines_csv(result: MlpLensResult, std: dict[str, np.ndarray]) -> str:
    """One row per layer: layer, the six mean cosines, then their standard deviations over prompts. A
    wrong-candidate cosine is empty when no prompt has a candidate number token other than the correct one
    (its mean over no candidates is undefined)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["layer", *COSINE_COLUMNS, *(f"{name}_std" for name in COSINE_COLUMNS)])
    for row, layer in enumerate(result.layers):
        values = [result.mean[name][row] for name in COSINE_COLUMNS] + [
            std[name][row] for name in COSINE_COLUMNS
        ]
        writer.writerow([layer, *(cell(defined(v), ".6g") for v in values)])
    return buffer.getvalue()


def ranks_csv(result: MlpLensResult) -> str:
    """One row per (layer, number token): rank in the vocabulary and among the number tokens (0 = top)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["layer", "token", "token_id", "rank", "rank_among_numbers"])
    for row, layer in enumerate(result.layers):
        among = np.argsort(np.argsort(result.ranks[row], kind="stable"), kind="stable")  # [n_numbers]
        for col, (token, label) in enumerate(zip(result.number_ids, result.number_labels, strict=True)):
            writer.writerow([layer, label, token, int(result.ranks[row, col]), int(among[col])])
    return buffer.getvalue()


def _write_outputs(result: MlpLensResult, std: dict[str, np.ndarray], model_name: str) -> None:
    """Every artefact atomically; metadata.json last, so its presence means the folder is complete."""
    from arithmech.report.logit_lens_plots import mlp_cosine_curves, update_rank_heatmap

    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "metadata.json").unlink(missing_ok=True)
    n_prompts = next(iter(result.cosines.values())).shape[1]
    atomic_write_text(out / "mlp_cosines.csv", cosines_csv(result, std))
    sem = {name: values / np.sqrt(max(n_prompts, 1)) for name, values in std.items()}
    mlp_cosine_curves(
        result.layers,
        result.mean,
        sem,
        out / "mlp_cosines.png",
        f"MLP logit lens: {model_name}, {n_prompts} prompts",
    )
    atomic_write_text(out / "mlp_update_ranks.csv", ranks_csv(result))
    ex = result.example
    text = ex["reference"].replace("\n", " ⏎ ")
    text = text if len(text) <= 70 else "…" + text[-69:]
    title = (
        f"Rank of number tokens in each MLP update: {model_name}\n{text!r} -> model says "
        f"{ex['predicted_token']!r}, answer {ex['answer']!r}"
    )
    ids = result.number_ids
    highlight = {role: ids.index(tid) for role, tid in ex["token_ids"].items() if tid in ids}
    update_rank_heatmap(
        result.ranks, result.layers, result.number_labels, out / "mlp_update_ranks.png", title, highlight
    )
    atomic_write_json(out / "metadata.json", result.metadata)

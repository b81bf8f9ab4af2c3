"""The analyze-fourier stage: Fourier features of the number tokens (Zhou et al. 2024) on the prompts of a
finished identify run.

Steps (definitions and formulas: `arithmech.analysis.fourier`)
1. number tokens: the single-token numbers 0..N-1 after the prompts (`data/number_tokens.py`), detected once
   per prompt ending (its last 24 characters; the tokens at the answer's place depend only on them). Prompts
   whose ending gives other number tokens than the most common ones are left out and counted. On a
   digit-splitting tokenizer N = 10, so there are six frequencies, 0..5.
2. spectra: one forward pass per batch records the END states; every layer's attention and MLP contribution is
   read onto the number tokens through the final norm with its scale fixed, and |DFT| over the number index is
   averaged over prompts; per group, the share of the non-constant power on the high frequencies, next to the
   flat-spectrum level and the share of random directions of the same norms (`RANDOM_DRAWS` seeded draws).
3. filters: the model without a filter, then per group (attention, mlp), filter (low-pass, high-pass) and
   cutoff, every forward pass with that group's outputs cut along the Fourier directions of the number-token
   unembedding; accuracy and mean answer probability at END.

Writes into its own folder, each file atomically and metadata.json last:
    fourier_spectrum.csv   layer, component (attention | mlp), frequency, magnitude (mean over prompts),
                           magnitude_std, power (mean over prompts of m(f) |DFT|^2, `analysis.fourier`)
    fourier_shares.csv     component, high_frequencies, high_share, flat_share (a white spectrum's),
                           random_mean, random_std (over random_draws directions of the same norms),
                           strongest_frequency (most power per real dimension, f >= 1)
    fourier_spectrum.png   frequency x layer heatmaps for attention and for MLPs (+ .svg)
    fourier_filters.csv    component (the group filtered), filter, cutoff, removed_frequencies, directions (the
                           rank r removed), accuracy, answer_prob, accuracy_change, answer_prob_change (vs no filter)
    fourier_filters.png    accuracy and answer probability after each filter, against the cutoff (+ .svg)
    metadata.json          model, identify run, config, number tokens, counts, the unfiltered accuracy, versions
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arithmech.analysis.fourier import (
    end_contributions,
    filter_directions,
    filtered_predictions,
    flat_high_share,
    high_frequencies,
    high_share,
    max_frequency,
    multiplicity,
    number_logits,
    number_readout,
    prompt_generators,
    random_direction_power,
    removed_frequencies,
    spectrum,
)
from arithmech.data import PromptPair, tokenize_pairs
from arithmech.data.number_tokens import DEFAULT_LIMIT, NumberTokens, single_token_numbers
from arithmech.data.sampling import sample_pairs
from arithmech.errors import ConfigError, DataError
from arithmech.models.load import ModelHandle
from arithmech.patching.states import collect_end_states
from arithmech.runs import atomic_write_json, atomic_write_text, csv_text, defined, git_sha, package_versions
from arithmech.stages.fourier_config import GROUPS, FourierConfig
from arithmech.stages.fourier_config import default_cutoffs as default_cutoffs  # re-exported
from arithmech.stages.identify_run import analysis_folders, analysis_header, chosen_layers, read_identify_run

logger = logging.getLogger(__name__)

_ENDING = 24
"""Characters at the end of a prompt that decide the number tokens after it (step 1)."""
RANDOM_DRAWS = 32
"""Random directions drawn per contribution for the high-frequency share's random baseline."""


@dataclass
class FourierResult:
    """What analyze-fourier computed, and where it wrote it."""

    layers: list[int]
    n_numbers: int
    number_ids: list[int]
    magnitude: dict[str, np.ndarray]
    """"attention" / "mlp" -> [layer, F + 1] mean |DFT| over prompts."""
    magnitude_std: dict[str, np.ndarray]
    power: dict[str, np.ndarray]
    """"attention" / "mlp" -> [layer, F + 1] mean m(f) |DFT|^2 over prompts."""
    shares: list[dict[str, Any]]
    """The rows of fourier_shares.csv."""
    filters: list[dict[str, Any]]
    """The rows of fourier_filters.csv."""
    baseline: dict[str, float]
    """accuracy and answer_prob without a filter."""
    out_dir: Path
    metadata: dict[str, Any]


def _label(tokenizer: Any, token_id: int) -> str:
    return str(tokenizer.decode([token_id])).replace(" ", "␣").replace("\n", "⏎")


def number_tokens_of(
    tokenizer: Any, pairs: Sequence[PromptPair], numbers: int | None
) -> tuple[NumberTokens, list[int]]:
    """(the number tokens most prompts share, the indices of those prompts); step 1 of the module docstring.

    The tokens are all the single-token numbers there (metadata.json records how many), of which the first
    `numbers` are used; prompts are kept when those agree. ConfigError when `numbers` asks for more numbers than
    the tokenizer writes as one token there.
    """
    limit = max(numbers or 0, DEFAULT_LIMIT)
    found: dict[str, NumberTokens] = {}
    per_prompt = []
    for pair in pairs:
        ending = pair.reference[-_ENDING:]
        if ending not in found:
            found[ending] = single_token_numbers(tokenizer, pair.reference, limit)
        per_prompt.append(found[ending])
    used = [n.ids[:numbers] if numbers is not None else n.ids for n in per_prompt]
    shared = Counter(used).most_common(1)[0][0]
    chosen = per_prompt[used.index(shared)]
    if numbers is not None and chosen.count < numbers:
        split = " (it splits longer numbers into digits)" if chosen.digit_splitting else ""
        raise ConfigError(
            f"--numbers {numbers} is more than the tokenizer has: after these prompts only 0..{chosen.count - 1} "
            f"are single tokens{split}; choose --numbers {chosen.count} or fewer"
        )
    if chosen.count < 2:
        raise DataError(
            "after these prompts only the number 0 is a single token, so there is no number index to transform; "
            "use prompts that end where a number token starts (e.g. with a space)"
        )
    return chosen, [i for i, ids in enumerate(used) if ids == shared]


def _check_cutoffs(cfg: FourierConfig, n_numbers: int) -> None:
    """ConfigError for a cutoff above the number index's highest frequency."""
    top = max_frequency(n_numbers)
    bad = [c for c in cfg.cutoffs or () if c > top]
    if bad:
        raise ConfigError(
            f"cutoff {bad[0]} is above the highest frequency {top} of the {n_numbers} numbers 0..{n_numbers - 1}; "
            f"choose cutoffs 0..{top}"
        )


@torch.no_grad()
def analyze_fourier(
    handle: ModelHandle, cfg: FourierConfig, run_dir: str | Path, out_dir: str | Path, quiet: bool = False
) -> FourierResult:
    """Spectra and filters on the prompts of the identify run in `run_dir`; write into `out_dir`."""
    from tqdm.auto import tqdm

    run_path, out = analysis_folders(run_dir, out_dir, "Fourier analysis", "fourier")
    view, dims = handle.view, handle.dims
    layers = chosen_layers(cfg.layers, dims.n_layers)
    run = read_identify_run(run_path, handle, one_answer_token="the Fourier analysis")
    start_time = time.perf_counter()
    sampled, sample = sample_pairs(run.pairs, cfg.max_prompts, cfg.seed)
    tokenized, _ = tokenize_pairs(handle.tokenizer, sampled)
    numbers, kept = number_tokens_of(handle.tokenizer, tokenized.pairs, cfg.numbers)
    n_numbers = cfg.numbers if cfg.numbers is not None else numbers.count
    _check_cutoffs(cfg, n_numbers)
    dropped = len(tokenized.pairs) - len(kept)
    if dropped:
        logger.warning("%d prompts end where other tokens write the numbers; they are left out", dropped)
        tokenized = tokenized.take(kept)
    number_ids = torch.tensor(numbers.ids[:n_numbers], dtype=torch.long)
    readout = number_readout(view, number_ids)  # [N, d_model]

    chunks: dict[str, list[torch.Tensor]] = {kind: [] for kind in GROUPS}
    random_power = {kind: torch.zeros(RANDOM_DRAWS, max_frequency(n_numbers) + 1, dtype=torch.float64)
                    for kind in GROUPS}  # fmt: skip
    n_prompts = len(tokenized.pairs)
    with tqdm(total=n_prompts, desc="Fourier spectra", unit="prompt", disable=quiet) as bar:
        for start in range(0, n_prompts, cfg.batch_size):
            rows = slice(start, start + cfg.batch_size)
            gens = prompt_generators(cfg.seed, range(*rows.indices(n_prompts)))  # the same draws in any batching
            width = int(tokenized.end[rows].max()) + 1
            states = collect_end_states(view, tokenized.ref_ids[rows, :width], tokenized.ref_mask[rows, :width],
                                        tokenized.end[rows])  # fmt: skip
            contributions = end_contributions(view, states)  # kind -> [layer, batch, d_model]
            for kind in GROUPS:
                logits = number_logits(view, contributions[kind][layers], states.resid_final, readout)
                chunks[kind].append(spectrum(logits).cpu())  # [layer, batch, F + 1]
                random_power[kind] += random_direction_power(view, contributions[kind][layers], states.resid_final,
                                                             readout, RANDOM_DRAWS, gens)  # fmt: skip
            bar.update(len(range(*rows.indices(n_prompts))))
    spectra = {kind: torch.cat(chunks[kind], dim=1).numpy() for kind in GROUPS}  # [layer, prompt, F + 1]
    magnitude = {kind: values.mean(1) for kind, values in spectra.items()}
    magnitude_std = {kind: values.std(1) for kind, values in spectra.items()}
    power = {kind: (values**2 * multiplicity(n_numbers).numpy()).mean(1) for kind, values in spectra.items()}
    shares = [_share_row(kind, power[kind], random_power[kind], n_numbers) for kind in GROUPS]
    spectra_s = time.perf_counter() - start_time

    mark = time.perf_counter()
    batch = (tokenized.ref_ids, tokenized.ref_mask, tokenized.end, tokenized.answer_ids)
    correct, prob = filtered_predictions(view, *batch, None, None, layers, batch_size=cfg.batch_size)
    baseline = {"accuracy": float(correct.float().mean()), "answer_prob": float(prob.mean())}
    plan = cfg.filter_plan(n_numbers)
    filters = []
    for group, kind, cutoff in tqdm(plan, desc="Fourier filters", unit="filter", disable=quiet):
        removed = removed_frequencies(kind, cutoff, n_numbers)
        directions = filter_directions(readout, removed)
        correct, prob = filtered_predictions(view, *batch, group, directions, layers, cfg.end_only, cfg.batch_size)
        accuracy, answer_prob = float(correct.float().mean()), float(prob.mean())
        filters.append({
            "component": group, "filter": kind, "cutoff": cutoff, "removed_frequencies": _span(removed),
            "directions": int(directions.shape[1]), "accuracy": accuracy, "answer_prob": answer_prob,
            "accuracy_change": accuracy - baseline["accuracy"],
            "answer_prob_change": answer_prob - baseline["answer_prob"],
        })  # fmt: skip
    filters_s = time.perf_counter() - mark

    answers, number_set = tokenized.answer_ids.tolist(), set(number_ids.tolist())
    metadata = {
        **analysis_header(handle, run, cfg),
        "layers": layers,
        "counts": {
            "prompts": n_prompts,
            "prompts_in_run": len(run.pairs),
            "other_number_tokens": dropped,
            "answers_among_numbers": sum(a in number_set for a in answers),
            "distinct_answers": len(set(answers)),
        },
        "prompts": sample,
        "numbers": {
            "count": n_numbers,
            "single_token_numbers": numbers.count,
            "digit_splitting": numbers.digit_splitting,
            "max_frequency": max_frequency(n_numbers),
            "tokens": [[n, int(t), _label(handle.tokenizer, int(t))] for n, t in enumerate(number_ids.tolist())],
        },
        "baseline": baseline,
        "high_frequency_share": {
            "high_frequencies": high_frequencies(n_numbers),
            "flat": flat_high_share(n_numbers),
            "random_draws": RANDOM_DRAWS,
            **{row["component"]: {k: row[k] for k in ("high_share", "random_mean", "random_std")} for row in shares},
        },
        "definitions": {
            "contribution": "what a layer's attention (o_proj output, after any post-attention norm) or MLP adds "
            "to the residual at END",
            "number_logits": "R v / s, R[n] = c(g * W_U[t_n]) (final norm gain g, centering c for LayerNorm), s = "
            "the intact final norm scale at END",
            "magnitude": "|rfft over the number index| (unnormalised), mean over prompts",
            "power": "m(f) |rfft|^2, m(f) the real dimensions at f (1 for f = 0 and f = N/2, else 2), mean over "
            "prompts",
            "high_share": "power on f > F/2 over power on f >= 1, summed over the layers and prompts; flat: the same "
            "for a white spectrum; random: for random directions of each contribution's norm (mean, sd over draws)",
            "filter": "o - Q Q^T o at every position (or END only), Q an orthonormal basis of Phi_S R, S the "
            "removed frequencies: low-pass(c) removes f > c, high-pass(c) removes f < c",
            "accuracy": "top token over the vocabulary at END is the answer's first token",
        },
        "timings": {"spectra_s": spectra_s, "filters_s": filters_s},
        "versions": package_versions(),
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    result = FourierResult(layers, n_numbers, number_ids.tolist(), magnitude, magnitude_std, power, shares, filters,
                           baseline, out, metadata)  # fmt: skip
    write_fourier_outputs(result, handle.source.get("model", "?"))
    return result


def _share_row(kind: str, power: np.ndarray, random_power: torch.Tensor, n_numbers: int) -> dict[str, Any]:
    """One row of fourier_shares.csv: power [layer, F + 1], random_power [draw, F + 1] (summed over prompts).
    The shares are undefined (empty) where the group writes nothing non-constant onto the number tokens."""
    random = high_share(random_power, n_numbers)  # [draw]
    per_dimension = power.sum(0) / multiplicity(n_numbers).numpy()  # [F + 1]
    return {"component": kind, "high_frequencies": _span(high_frequencies(n_numbers)),
            "high_share": defined(float(high_share(torch.from_numpy(power.sum(0)), n_numbers))),
            "flat_share": flat_high_share(n_numbers), "random_mean": defined(float(random.mean())),
            "random_std": defined(float(random.std())), "random_draws": len(random),
            "strongest_frequency": int(per_dimension[1:].argmax()) + 1}  # fmt: skip


def _span(frequencies: Sequence[int]) -> str:
    """The removed frequencies as "3-5", "0" or "none" (they are one contiguous range)."""
    if not frequencies:
        return "none"
    lo, hi = min(frequencies), max(frequencies)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def spectrum_rows(result: FourierResult) -> list[dict[str, Any]]:
    """One row per (layer, component, frequency) of fourier_spectrum.csv."""
    return [
        {"layer": layer, "component": kind, "frequency": f, "magnitude": float(result.magnitude[kind][row, f]),
         "magnitude_std": float(result.magnitude_std[kind][row, f]), "power": float(result.power[kind][row, f])}
        for kind in GROUPS for row, layer in enumerate(result.layers)
        for f in range(result.magnitude[kind].shape[1])
    ]  # fmt: skip


def write_fourier_outputs(result: FourierResult, model_name: str) -> None:
    """Every artefact atomically; metadata.json last, so its presence means the folder is complete."""
    from arithmech.report.fourier_plots import filter_curves, spectrum_heatmaps

    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "metadata.json").unlink(missing_ok=True)
    n_prompts = result.metadata["counts"]["prompts"]
    atomic_write_text(out / "fourier_spectrum.csv", csv_text(spectrum_rows(result), float_format=".6g"))
    atomic_write_text(out / "fourier_shares.csv", csv_text(result.shares, float_format=".6g"))
    title = f"Number-logit spectra over 0..{result.n_numbers - 1}: {model_name}, {n_prompts} prompts"
    spectrum_heatmaps(result.magnitude, result.layers, result.n_numbers, out / "fourier_spectrum.png", title)
    atomic_write_text(out / "fourier_filters.csv", csv_text(result.filters, float_format=".6g"))
    where = "at the last token" if result.metadata["config"]["end_only"] else "at every position"
    filter_curves(result.filters, result.baseline, out / "fourier_filters.png",
                  f"Accuracy with one group's outputs filtered {where}: {model_name}, {n_prompts} prompts")  # fmt: skip
    atomic_write_json(out / "metadata.json", result.metadata)

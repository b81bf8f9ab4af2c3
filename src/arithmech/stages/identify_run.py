"""Reading a finished identify run folder: the effects, key components and reference prompts later stages use.

A folder is finished when its metadata.json exists (identify writes it last). A folder made with another model
is refused, since its component names and prompts would not mean the same thing. Each reader records the run's
`record` (its fingerprint among it) in its own metadata.json, so a report can tell an analysis of an earlier
run apart (`lineage.py`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arithmech.data import PromptPair, read_prompt_file
from arithmech.errors import ConfigError
from arithmech.lineage import identify_folder, identify_record, refuse_answer_digits, scored_answer_digits
from arithmech.models.load import ModelHandle
from arithmech.models.sites import Component, parse_component
from arithmech.models.view import Dims


@dataclass(frozen=True)
class IdentifyRun:
    """What an identify run left on disk."""

    path: Path
    effects: dict[Component, float]
    """Mean path-patching effect of every component."""
    key: dict[str, Any]
    """key_components.json as written."""
    pairs: list[PromptPair]
    """The reference set that was patched (prompts the model answered)."""
    metadata: dict[str, Any]
    record: dict[str, Any]
    """What an analysis records of the run it read: path, fingerprint, created (`lineage.identify_record`)."""

    @property
    def answer_digits(self) -> bool:
        """Whether the run scored its answers token by token (identify --answer-digits)."""
        return scored_answer_digits(self.metadata)

    def ranked(self, kind: str | None = None) -> list[Component]:
        """Components by effect, most negative first; kind "head" or "mlp" keeps only those."""
        return by_effect(self.effects, kind)


def by_effect(effects: dict[Component, float], kind: str | None = None) -> list[Component]:
    """Components by effect, most negative first (ties in the file's order); kind "head" or "mlp" keeps only those."""
    items = sorted(effects.items(), key=lambda item: item[1])
    return [c for c, _ in items if kind is None or c.kind == kind]


def read_effects(run_dir: str | Path, dims: Dims) -> dict[Component, float]:
    """effects.csv of an identify folder (`lineage.identify_folder` says which), for a model of size `dims`; no
    model check: `read_identify_run` makes it, for callers with the model loaded."""
    with (identify_folder(run_dir) / "effects.csv").open() as handle_csv:
        return {parse_component(row["component"], dims): float(row["effect"]) for row in csv.DictReader(handle_csv)}


def model_identity(source: dict[str, Any]) -> str:
    """What must match between a run folder's model and the loaded one."""
    return str(source.get("gguf_sha256") or source.get("model"))


def model_label(source: dict[str, Any]) -> str:
    """The model's name as the user gave it, with its GGUF file's checksum where it has one (two GGUF files of
    one name differ only there)."""
    name, sha = str(source.get("model") or source.get("loaded_from") or "unknown model"), source.get("gguf_sha256")
    return f"{name} (GGUF sha256 {str(sha)[:12]})" if sha else name


def read_identify_run(run_dir: str | Path, handle: ModelHandle, one_answer_token: str | None = None) -> IdentifyRun:
    """Read an identify run folder made with the same model as `handle`; `run_dir` may also be the top of an
    `arithmech run` folder (its identify/ is read; `lineage.identify_folder` says which folders are accepted).

    one_answer_token: the name of an analysis that reads one answer token per prompt; a run that scored its
    answers token by token (--answer-digits) is then refused (`lineage.refuse_answer_digits`)."""
    path = identify_folder(run_dir)
    if one_answer_token is not None:
        refuse_answer_digits(path, one_answer_token)
    metadata = json.loads((path / "metadata.json").read_text())
    made_with = metadata.get("model", {})
    if model_identity(made_with) != model_identity(handle.source) or (
        metadata.get("dims", {}).get("n_heads") != handle.dims.n_heads
    ):
        raise ConfigError(
            f"run folder {str(path)!r} was made with model {model_label(made_with)}, not the loaded "
            f"{model_label(handle.source)}; pass the same --model, or identify again with this model"
        )
    effects = read_effects(path, handle.dims)
    key = json.loads((path / "key_components.json").read_text())
    pairs = read_prompt_file(path / "prompts.jsonl")
    return IdentifyRun(path, effects, key, pairs, metadata, identify_record(path))


def analysis_folders(run_dir: str | Path, out_dir: str | Path, what: str, subfolder: str) -> tuple[Path, Path]:
    """(identify run, output folder) of an analysis that reads the run; ConfigError when they are the same
    folder (`what` names the analysis, `subfolder` is the suggested folder inside the run)."""
    out, run_path = Path(out_dir), Path(run_dir)
    if out.resolve() == run_path.resolve():
        raise ConfigError(
            f"out folder {str(out)!r} is the identify run folder; write the {what} to its own folder "
            f"(e.g. {str(run_path / subfolder)!r})"
        )
    return run_path, out


def chosen_layers(layers: tuple[int, ...] | None, n_layers: int) -> list[int]:
    """The layers an analysis reports, sorted (all by default); ConfigError for one the model does not have."""
    chosen = sorted(layers) if layers is not None else list(range(n_layers))
    if max(chosen) >= n_layers:
        raise ConfigError(f"layer {max(chosen)} does not exist: the model has layers 0..{n_layers - 1}")
    return chosen


def analysis_header(handle: ModelHandle, run: IdentifyRun, cfg: Any) -> dict[str, Any]:
    """The first keys of an analysis's metadata.json: the stage (its config's STAGE), the model, its dims, the
    identify run it read (with that run's git sha) and the analysis's config."""
    return {
        "stage": cfg.STAGE,
        "model": handle.source,
        "dims": dataclasses.asdict(handle.dims),
        "identify_runs": [{**run.record, "git_sha": run.metadata.get("git_sha")}],
        "config": dataclasses.asdict(cfg),
    }

"""The stage runs measured on the skeletons and planned in the scale guide: each stage's settings at two sizes.

A run is one call of a stage's function (stages/*.py, as `arithmech run` calls it), with its config built by the
pipeline (`pipeline.build_stage_config`, every value checked) and planned by `plan_stage` from that same config:
    small  the skeleton benchmark's (benchmarks/plan_skeletons.py): a few prompts, one or two steps; this is about
           memory and shape paths at real width, not about results
    paper  the scale guide's (benchmarks/scale_tables.py): the paper's sizes, 1,000 prompts a stage (over its tasks
           or operations where it has several), k = 32 heads, 3,260 SFT rows
Runs that read another's folder (knockout and precise SFT read identify's, `READS`) get it as `from_run`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAPER_PROMPTS = 1000
PAPER_HEADS = 32


@dataclass(frozen=True)
class StageRun:
    """One measured and planned run of a stage."""

    key: str
    """Its name in results and tables ("identify-path")."""
    stage: str
    """The pipeline stage it runs and plans (pipeline.STAGES, plan_stage)."""
    function: str
    """"module:function" called as function(handle, cfg, out_dir, quiet=True)."""
    small: dict[str, Any]
    paper: dict[str, Any]
    reads: str | None = None
    """The key of the run whose folder it reads as from_run."""


ONE_TEMPLATE = str(Path(__file__).with_name("skeleton_template.json"))
"""One template (add-eq-1), so that the 8 prompts are one chunk of one length: the batch a plan assumes (with
several templates the engine's length chunks hold 1 or 2 prompts each, and the plan of 8 at the widest would be
judged against a fraction of it)."""
_IDENTIFY_SMALL = {"filter_correct": False, "max_prompts": 8, "n_per_template": 8, "templates_file": ONE_TEMPLATE,
                   "batch_size": 8}  # fmt: skip
_FINETUNE_SMALL = {"data": "arithmetic", "target": "answer", "chat_template": False, "max_samples": 8,
                   "batch_size": 2, "micro_batch_size": 2, "max_steps": 2, "top_k": 4, "checkpoint_every": 0}
"""Two optimizer steps: the second runs with AdamW's moments allocated, the steady state a plan describes."""

RUNS: tuple[StageRun, ...] = (
    StageRun("identify-path", "identify", "arithmech.stages.identify:identify",
             {**_IDENTIFY_SMALL, "variant": "path"}, {"max_prompts": PAPER_PROMPTS, "variant": "path"}),
    StageRun("identify-total", "identify", "arithmech.stages.identify:identify",
             {**_IDENTIFY_SMALL, "variant": "total"}, {"max_prompts": PAPER_PROMPTS, "variant": "total"}),
    StageRun("knockout", "knockout", "arithmech.stages.knockout:knockout",
             {"max_k": 2, "n_random": 1, "max_prompts": 4, "batch_size": 8},
             {"max_prompts": PAPER_PROMPTS, "max_k": PAPER_HEADS}, reads="identify-path"),
    StageRun("circuit", "circuit", "arithmech.stages.circuit:circuit",
             {"method": "eap-ig", "keep_incorrect": True, "n_prompts": 2, "min_prompts": 2, "batch_size": 2,
              "steps": 2, "evaluate": True, "random_seeds": 1, "oracle": 2},
             {"method": "eap-ig", "n_prompts": PAPER_PROMPTS, "evaluate": True}),
    StageRun("mediation", "mediation", "arithmech.stages.mediate:mediate",
             {"tasks": ["addition"], "formats": ["equation"], "n_pairs": 2, "neuron_k": 0},
             {"n_pairs": PAPER_PROMPTS // 3, "neuron_k": 0}),
    StageRun("mediation-neurons", "mediation", "arithmech.stages.mediate:mediate",
             {"tasks": ["addition"], "formats": ["equation"], "n_pairs": 1, "neuron_k": 3, "neuron_layer": 1},
             {"n_pairs": PAPER_PROMPTS // 3}),
    StageRun("neurons", "neurons", "arithmech.stages.neurons:neurons",
             {"operations": ["addition"], "max_prompts": 2, "filter_correct": False, "importance_layers": [1],
              "keep_sizes": [0, 8], "n_random": 1, "lora_steps": 1, "lora_rank": 2, "top_neurons": 4, "top_heads": 2,
              "few_shot": 1},
             {"max_prompts": PAPER_PROMPTS // 4}),
    StageRun("evaluate", "evaluate", "arithmech.stages.evaluate:evaluate_stage",
             {"benchmarks": ["arithmetic-addition"], "limit": 2, "batch_size": 2, "max_new_tokens": 8, "n_shot": 0},
             {"limit": PAPER_PROMPTS}),
    StageRun("finetune-precise", "finetune", "arithmech.stages.finetune:finetune",
             {**_FINETUNE_SMALL, "method": "precise"}, {"method": "precise", "top_k": PAPER_HEADS},
             reads="identify-path"),
    StageRun("finetune-full", "finetune", "arithmech.stages.finetune:finetune",
             {**_FINETUNE_SMALL, "method": "full"}, {"method": "full"}, reads="identify-path"),
)  # fmt: skip
"""In the order they run: evaluate before fine-tuning, which changes the weights (full SFT)."""
KEYS = tuple(run.key for run in RUNS)


def run_by_key(key: str) -> StageRun:
    found = {run.key: run for run in RUNS}.get(key)
    if found is None:
        raise KeyError(f"unknown stage run {key!r}; choose from {', '.join(KEYS)}")
    return found


def stage_config(run: StageRun, size: str, folders: dict[str, Path] | None = None) -> Any:
    """The run's config object at `size` ("small" or "paper"), with the folder it reads as from_run."""
    from arithmech import pipeline

    values = dict(run.small if size == "small" else run.paper)
    if run.reads is not None and folders is not None and run.reads in folders:
        values["from_run"] = str(folders[run.reads])
    return pipeline.build_stage_config(pipeline.stage_by_name(run.stage), values, 0)

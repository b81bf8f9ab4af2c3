"""Toy lm-evaluation-harness tasks on local JSONL files (no hub), and what a model should score on them.

`write_choice_task` and `write_generation_task` write a task YAML (lm-eval's `dataset_path: json` with
`data_files`) and its data into a folder that is then passed as `include_path`. `direct_loglikelihood` and
`direct_greedy` compute, with one plain forward pass per step, what lm-eval should report for a request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

CHOICE_TASK = "toy_mc"
GENERATION_TASK = "toy_gen"
MAX_GEN_TOKENS = 4


def choice_rows(n: int = 8) -> list[dict[str, Any]]:
    """Sums with four options of different lengths (so acc and acc_norm can differ), gold at varying places."""
    rows = []
    for i in range(n):
        a, b = i + 2, 2 * i + 1
        choices = [str(a + b), str(a + b + 1), str(a * b + 10), "many"]
        rows.append({"question": f"{a} plus {b} is", "choices": choices, "label": i % 4})
    return rows


def _write(folder: Path, name: str, rows: list[dict[str, Any]], config: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    head = f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data))}\n"
    (folder / f"{name}.yaml").write_text(head + "test_split: test\n" + config, encoding="utf-8")
    return folder


def write_choice_task(folder: Path, rows: list[dict[str, Any]], name: str = CHOICE_TASK) -> Path:
    config = """output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{label}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""
    return _write(folder, name, rows, config)


def write_generation_task(folder: Path, rows: list[dict[str, Any]], name: str = GENERATION_TASK) -> Path:
    config = f"""output_type: generate_until
doc_to_text: "{{{{question}}}}="
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: {MAX_GEN_TOKENS}
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""
    return _write(folder, name, rows, config)


@torch.no_grad()
def direct_loglikelihood(model: Any, tokenizer: Any, context: str, continuation: str) -> float:
    """Sum of log-softmax of the continuation's tokens given the context, in one unpadded forward pass."""
    ctx, cont = tokenizer(context).input_ids, tokenizer(continuation).input_ids
    logits = model(torch.tensor([ctx + cont])).logits[0]  # [pos, d_vocab]
    logprobs = torch.log_softmax(logits[len(ctx) - 1 : -1].double(), dim=-1)  # [len(cont), d_vocab]: predicts cont
    return float(logprobs[torch.arange(len(cont)), torch.tensor(cont)].sum())


@torch.no_grad()
def direct_greedy(model: Any, tokenizer: Any, context: str, stop: str = "\n") -> str:
    """MAX_GEN_TOKENS greedy tokens (fewer at EOS), decoded and cut at `stop`, as lm-eval's generate_until does."""
    ids = tokenizer(context).input_ids
    new: list[int] = []
    for _ in range(MAX_GEN_TOKENS):
        token = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
        if token == tokenizer.eos_token_id:
            break
        new.append(token)
    return tokenizer.decode(new, skip_special_tokens=True).split(stop)[0]

"""`finetune --data arithmetic`: train prompts of the split only, answer + newline targets, the split recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arithmech.data.arithmetic_split import make_split, split_prompts
from arithmech.errors import ConfigError
from arithmech.finetune.arithmetic_data import arithmetic_examples
from arithmech.stages.finetune import finetune
from arithmech.stages.finetune_config import FinetuneConfig

from tiny_models import make_tiny_tokenizer

FAST = {"batch_size": 4, "micro_batch_size": 4, "lr": 1e-2, "warmup_ratio": 0.0, "max_steps": 2}


def test_examples_are_train_prompts_with_answer_targets() -> None:
    tok = make_tiny_tokenizer()
    data, record = arithmetic_examples(tok, ("subtraction", "division"), n=300, split_seed=1, seed=0)
    split = make_split(1)
    prompts = split_prompts(split, "train", ("subtraction", "division"), n=300, seed=0)
    assert len(data) == record["kept"] == 300 and record["split_fingerprint"] == split.fingerprint
    for ex, p in zip(data, prompts, strict=True):  # the split's own train prompts (leakage-free: its tests)
        prompt, target = tok.decode(list(ex.input_ids[: ex.n_prompt])), tok.decode(list(ex.input_ids[ex.n_prompt :]))
        assert (prompt, target) == (p.reference, p.answer + "\n") and p.template_id in split.train_templates
        assert (int(str(p.a)), int(str(p.b))) in split.valid_pairs("train", str(p.operation)) and target[:-1].isdigit()
    templates = {op: sum(t.startswith(op[:3]) for t in split.train_templates) for op in ("subtraction", "division")}
    items = sum(n * len(split.valid_pairs("train", op)) for op, n in templates.items())
    assert record["distinct_problems"] == items < 300  # 300 prompts: every (template, pair) once, some twice
    once, _ = arithmetic_examples(tok, ("subtraction",), n=None, split_seed=1, seed=0)  # each problem once
    problems = {ex.id.split("-", 1)[1] for ex in once}
    assert len(once) == len(problems) == templates["subtraction"] * len(split.valid_pairs("train", "subtraction"))


def test_finetune_on_arithmetic_records_its_split(handle_of, tmp_path: Path) -> None:
    cfg = FinetuneConfig(method="precise", components=("0.1", "1.2"), data="arithmetic", operations=("subtraction",),
                         max_samples=16, split_seed=2, **FAST)  # fmt: skip
    result = finetune(handle_of("llama"), cfg, tmp_path, quiet=True)
    assert result.train.finished and result.train.steps == 2
    meta = json.loads((tmp_path / "metadata.json").read_text())
    assert meta["data"]["path"] == "arithmetic" and "split" not in meta["data"]
    # the tiny model's context is 128 tokens: longer (byte-tokenized 3-shot) prompts are dropped, and counted
    assert meta["data"]["kept"] + meta["data"]["too_long"] == 16 and meta["data"]["max_length"] == 128
    assert meta["data"]["operations"] == ["subtraction"]
    assert json.loads((tmp_path / "split.json").read_text()) == make_split(2).record()


@pytest.mark.parametrize("operations", [("subtract",), ()])
def test_unknown_operations_are_config_errors(operations: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError, match="operations must be drawn from"):
        FinetuneConfig(method="full", data="arithmetic", operations=operations)

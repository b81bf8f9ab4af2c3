"""--max-memory (plan/budget.py): the sizes a budget picks, the sentence when nothing fits, bad sizes, the default
budget, and the commands refusing before the model loads (the numbers under a budget: tests/integration/
test_memory_budget.py)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from arithmech.cli import main
from arithmech.errors import ConfigError
from arithmech.models.model_config import ModelConfig
from arithmech.pipeline import STAGES, build_stage_config
from arithmech.plan import free_memory as fm
from arithmech.plan.budget import KNOBS, MemoryBudget, before_load, fit_or_keep, of_loaded
from arithmech.plan.presets import preset
from arithmech.plan.prompt_widths import WidthReader
from arithmech.plan.sizes import format_size
from arithmech.stages.analyze_attention_config import AttentionConfig
from arithmech.stages.finetune_config import FinetuneConfig
from arithmech.stages.identify_config import IdentifyConfig

LLAMA = preset("llama3.1-8b")
TINY_IDENTIFY = ["--max-prompts", "8", "--n-per-template", "2", "--keep-incorrect", "--formations", "equation"]


def budget(n_bytes: int, tokenizer: Callable[[], Any] | None = None, **layout: Any) -> MemoryBudget:
    reader = None if tokenizer is None else WidthReader(tokenizer, LLAMA.context)
    return MemoryBudget(LLAMA, "bfloat16", n_bytes, "--max-memory", reader=reader, **layout)


def peak(cfg: Any, **changes: Any) -> int:
    return budget(1).peak(dataclasses.replace(cfg, **changes))


def test_every_stage_names_the_sizes_it_may_lower() -> None:
    """Each stage of `run` has KNOBS that are fields of its config, which its plan reads: a value large enough
    plans more (a knob the plan ignored could never fit a budget). A knob may size a phase that a 7B's default
    leaves below another (neurons' batch_size sizes head importance, beneath the readout at 32 prompts)."""
    assert set(KNOBS) == {s.name for s in STAGES}
    for stage in STAGES:
        cfg = build_stage_config(stage, {}, 0)
        for knob in KNOBS[stage.name]:
            large = 16 * max(2, getattr(cfg, knob))
            assert peak(cfg, **{knob: 1}) < peak(cfg, **{knob: large}), (stage.name, knob)


def test_every_stage_plans_on_a_model_smaller_than_its_defaults(tiny_model_dir: Callable[[str], Path]) -> None:
    """The tiny Llama has 12 heads, fewer than knockout's default max_k of 16: the plan takes the heads there are,
    as the stage takes the ranking there is."""
    found = before_load(ModelConfig(model=str(tiny_model_dir("llama")), max_memory="1TB"))  # not the free memory
    assert isinstance(found, MemoryBudget)
    for stage in STAGES:
        assert fit_or_keep(found, build_stage_config(stage, {}, 0)).details["max_memory"] == found.bytes, stage.name
    assert found.reader is not None and found.reader.tokenizer()("12 + 3")["input_ids"] == list(b"12 + 3")
    assert found.reader.tokenizer() is found.reader.tokenizer()  # loaded once for every stage of a run
    from arithmech.stages.evaluate_config import EvaluateConfig

    assert found.shape.context == 128 == found.prompt_tokens(EvaluateConfig())  # MMLU's prompts, cut at the context


def test_settings_the_plan_cannot_model_keep_their_sizes(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """The budget never stops a stage for what the plan does not know; a given budget says so as a warning."""

    def unknown(self: MemoryBudget, cfg: Any, copies: int = 0) -> int:
        raise ConfigError("no plan for this")

    monkeypatch.setattr(MemoryBudget, "peak", unknown)
    cfg = IdentifyConfig(batch_size=64)
    fit = fit_or_keep(budget(10**12), cfg)
    assert fit.cfg == cfg and fit.details == {"max_memory": None, "why": "the plan cannot model these settings "
                                              "(no plan for this)"}  # fmt: skip
    assert [r.levelname for r in caplog.records] == ["WARNING"]


def test_the_largest_batch_that_fits_is_chosen() -> None:
    cfg = IdentifyConfig(batch_size=64)
    fit = budget(peak(cfg, batch_size=24)).fit(cfg)
    assert fit.cfg.batch_size == 24 and peak(cfg, batch_size=25) > peak(cfg, batch_size=24)
    assert fit.details["lowered"] == {"batch_size": {"from": 64, "to": 24}}
    assert fit.details["planned_peak"] == peak(cfg, batch_size=24)
    untouched = budget(peak(cfg)).fit(cfg)  # a budget the configured sizes fit changes nothing
    assert untouched.cfg == cfg and untouched.details["lowered"] == {}


def test_finetune_lowers_its_micro_batches_to_a_divisor_of_the_batch() -> None:
    cfg = FinetuneConfig(components=("3.1",), batch_size=48, micro_batch_size=16)
    between = (peak(cfg, micro_batch_size=6) + peak(cfg, micro_batch_size=8)) // 2  # 7 does not divide 48
    fit = budget(between).fit(cfg)
    assert (fit.cfg.micro_batch_size, fit.cfg.batch_size) == (6, 48)


def test_stages_whose_prompts_are_data_plan_at_their_widest_prompt(caplog: pytest.LogCaptureFixture) -> None:
    """Identify's reference set, fine-tuning's examples and evaluate's benchmarks: the budget reads their widest
    prompt with the tokenizer (here one token a byte: the arithmetic examples run to 192 tokens, far above the 48
    the plan assumes) and fits at it, so a budget that the assumed width fits lowers the micro-batches. An analysis
    given no identify run keeps the plan's width (tests/integration/test_memory_budget.py reads one); a tokenizer
    that cannot be had leaves the assumed width, with a warning."""
    from arithmech.data import tokenize_pairs
    from arithmech.data.reference_set import answer_sequences, reference_pairs
    from arithmech.plan.planner import DEFAULT_TOKENS
    from arithmech.stages.evaluate_config import EvaluateConfig
    from arithmech.stages.finetune import training_data

    from tiny_models import make_tiny_tokenizer

    cfg = FinetuneConfig(components=("3.1",), data="arithmetic", batch_size=16, micro_batch_size=16)
    data, _ = training_data(make_tiny_tokenizer(), cfg, cfg.max_length)
    widest = max(len(example.input_ids) for example in data)
    assumed, read = budget(10**15), budget(10**15, tokenizer=make_tiny_tokenizer)
    assert assumed.plan(cfg).tokens == DEFAULT_TOKENS < widest == read.plan(cfg).tokens
    assert read.peak(cfg) > assumed.peak(cfg)
    fit = budget(assumed.peak(cfg), tokenizer=make_tiny_tokenizer).fit(cfg)
    assert fit.cfg.micro_batch_size < 16 and fit.details["prompt_tokens"] == widest
    evaluate = EvaluateConfig(benchmarks=("arithmetic",), limit=8)
    assert read.plan(evaluate).tokens != assumed.plan(evaluate).tokens
    identify = IdentifyConfig(few_shot=0)
    pairs, _ = tokenize_pairs(make_tiny_tokenizer(), reference_pairs(identify))
    checked = max(len(sequence) for sequence in answer_sequences(pairs)[0])  # a prompt and its answer
    assert read.plan(identify).tokens == checked > pairs.ref_ids.shape[1]
    assert checked != assumed.plan(identify).tokens
    assert read.plan(AttentionConfig()).tokens == assumed.plan(AttentionConfig()).tokens  # an identify run's prompts

    def unreadable() -> Any:
        raise OSError("no tokenizer files\nmore")

    with caplog.at_level("WARNING"):
        assert budget(10**15, tokenizer=unreadable).plan(cfg).tokens == DEFAULT_TOKENS
    assert "widest prompt cannot be read before the model loads (no tokenizer files)" in caplog.text

    def forbidden() -> Any:
        raise AssertionError("a budget below the weights is refused without reading prompts")

    assert budget(1, tokenizer=forbidden).plan(cfg).tokens == DEFAULT_TOKENS


def test_nothing_fits_is_one_sentence_naming_what_would() -> None:
    cfg = IdentifyConfig(batch_size=16)
    need = peak(cfg, batch_size=1)
    with pytest.raises(ConfigError) as refused:
        budget(need - 1).fit(cfg)
    text = str(refused.value)
    assert f"identify plans {format_size(need)} even at batch_size 1" in text
    assert f"a device with {format_size(need)} free" in text and "--device auto" in text
    assert "FSDP2" not in text and "prompts" not in text  # identify's memory does not grow with its prompts
    train = FinetuneConfig(components=("3.1",), method="full", batch_size=8, micro_batch_size=8)
    with pytest.raises(ConfigError, match="FSDP2, which shards"):
        budget(peak(train, micro_batch_size=1) - 1).fit(train)


def test_a_stage_whose_memory_grows_with_its_prompts_names_how_many_fit() -> None:
    cfg = AttentionConfig(max_prompts=10000, batch_size=1)  # keeps every prompt's END rows
    most = 5000
    room = peak(cfg, max_prompts=most)
    assert peak(cfg, max_prompts=most + 1) > room
    with pytest.raises(ConfigError, match=rf"at most {most} prompts \(--max-prompts {most}\)"):
        budget(room).fit(cfg)
    with pytest.raises(ConfigError, match=rf"attention.max_prompts {most}\)"):
        budget(room).fit(cfg, option_prefix="attention")


def test_a_budget_below_the_weights_and_the_layouts_that_share_them() -> None:
    weights = LLAMA.n_params * 2
    with pytest.raises(ConfigError, match="below the weights alone"):
        budget(weights - 1).fit(IdentifyConfig())
    cfg = IdentifyConfig(batch_size=1)
    spread = budget(weights // 2, gpus=4)  # --device auto over 4 GPUs: a quarter of the weights on each
    assert spread.layout("identify") == ("auto", 4) and spread.fit(cfg).details["layout"] == "auto"
    train = FinetuneConfig(components=("3.1",), method="full", batch_size=8, micro_batch_size=1)
    need = budget(1, fsdp_processes=8, launched=8).peak(train)  # weights, gradients and moments in eighths
    assert need < weights and budget(need, fsdp_processes=8, launched=8).fit(train).details["layout"] == "fsdp2"
    with pytest.raises(ConfigError, match="below the weights alone"):
        budget(need).fit(train)  # the same budget in one process
    copies = budget(peak(cfg) + weights - 1)
    with pytest.raises(ConfigError):  # a run holding a copy of the model beside it
        copies.fit(cfg, copies=1)


def test_the_default_budget_is_the_free_memory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683664 kB\nMemAvailable:   18260168 kB\n")
    monkeypatch.setattr(fm, "MEMINFO", meminfo)
    monkeypatch.setattr(fm.importlib.util, "find_spec", lambda name: None)  # as without psutil
    assert fm.free_memory("cpu") == (18260168 * 1024, "the available system memory")
    found = before_load(ModelConfig(model="llama3.1-8b", dtype="bfloat16"))
    assert isinstance(found, MemoryBudget) and found.bytes == 18260168 * 1024 and not found.given
    assert found.label == f"the available system memory ({format_size(18260168 * 1024)})"
    meminfo.write_text("MemTotal:       24683664 kB\n")  # another OS: no default, the sizes as given
    assert "does not say" in str(before_load(ModelConfig(model="llama3.1-8b")))


def test_the_free_memory_of_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.cuda as on a machine with three GPUs (no GPU is needed): a device's own free memory, the least free
    GPU for --device auto, and each launched process's own GPU (LOCAL_RANK)."""
    import torch

    free = {0: 30 * 2**30, 1: 10 * 2**30, 2: 20 * 2**30}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (free[i], 80 * 2**30))
    assert fm.free_memory("cuda:2") == (free[2], "the free memory of cuda:2")
    assert fm.free_memory("cuda") == (free[0], "the free memory of cuda:0")
    assert fm.free_memory("auto") == (free[1], "the smallest free memory of the 3 GPUs")
    assert before_load(ModelConfig(model="llama3.1-8b", device="auto")).layout("identify") == ("auto", 3)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert fm.free_memory("cuda") == fm.free_memory("auto") == (free[1], "the free memory of cuda:1")
    assert before_load(ModelConfig(model="llama3.1-8b", device="auto")).layout("identify") == ("single", 1)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` sets for an FSDP config
    sharded = before_load(ModelConfig(model="llama3.1-8b", device="cuda"))
    assert sharded.layout("finetune") == ("fsdp2", 3) and sharded.layout("identify") == ("single", 1)


def test_a_default_budget_needs_no_readable_shape_but_a_given_one_does(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    unreadable = ModelConfig(model=str(tmp_path))
    assert "num_hidden_layers" in str(before_load(unreadable))  # logged; the stage keeps its sizes
    with pytest.raises(ConfigError, match="needs the model's shape before it loads"):
        before_load(dataclasses.replace(unreadable, max_memory="24GB"))


def test_a_loaded_model_counts_its_weights_as_free(tiny_model_dir: Callable[[str], Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from arithmech.models.load import load_model
    from arithmech.plan import budget as budget_module

    handle = load_model(ModelConfig(model=str(tiny_model_dir("llama"))))
    monkeypatch.setattr(budget_module, "free_memory", lambda device: (10**6, "the free memory of cpu"))
    found = of_loaded(handle, None)
    assert isinstance(found, MemoryBudget)
    assert found.bytes == 10**6 + found.shape.n_params * 4
    assert found.shape.n_params == sum(p.numel() for p in handle.model.parameters())
    assert of_loaded(handle, 123456).bytes == 123456  # bytes given as an int (the API)


@pytest.fixture
def no_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model fails the test: a refusal must come before it."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("arithmech.models.load.load_model", refuse)


def _refused(argv: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main([*argv, "--out", str(out)]) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and err.count("\n") == 0
    return err


@pytest.mark.usefixtures("no_load")
def test_commands_refuse_before_the_model_loads_and_write_nothing(
    tiny_model_dir: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = ["--model", str(tiny_model_dir("llama"))]
    out = tmp_path / "out"
    assert "positive size" in _refused(["identify", *model, "--max-memory", "-3GB"], out, capsys)
    assert "positive size" in _refused(["identify", *model, "--max-memory", "0"], out, capsys)
    assert "takes a size" in _refused(["identify", *model, "--max-memory", "lots"], out, capsys)
    assert "below the weights alone" in _refused(["identify", *model, "--max-memory", "100KB"], out, capsys)
    assert "identify plans" in _refused(["identify", *model, "--max-memory", "700KB"], out, capsys)
    assert "takes a size" in _refused(["run", *model, "--stages", "identify", "--max-memory", "lots"], out, capsys)
    refused = _refused(["run", *model, "--stages", "identify,attention", "--max-memory", "700KB"], out, capsys)
    assert "identify plans" in refused


def test_a_command_lowers_its_batch_and_records_it(
    tiny_model_dir: Callable[[str], Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """identify under a budget that plans batch_size 2, through the command; then `run` under one, whose record
    keeps the stage when only the budget changes (the same numbers: max_memory is no part of a fingerprint)."""
    import logging

    model = str(tiny_model_dir("llama"))
    shape = before_load(ModelConfig(model=model, max_memory="1TB"))
    assert isinstance(shape, MemoryBudget)
    tiny = IdentifyConfig(max_prompts=8, n_per_template=2, filter_correct=False, formations=("equation",))
    two = shape.peak(dataclasses.replace(tiny, batch_size=2))  # at TINY_IDENTIFY's widest prompt
    with caplog.at_level(logging.INFO, logger="arithmech"):
        assert main(["identify", "--model", model, *TINY_IDENTIFY, "--max-memory", str(two),
                     "--out", str(tmp_path / "identify"), "--quiet"]) == 0  # fmt: skip
    record = json.loads((tmp_path / "identify" / "metadata.json").read_text())
    assert record["config"]["batch_size"] == 2 and record["memory_budget"]["max_memory"] == two
    assert "identify: batch_size 16 -> 2, so that its planned peak" in caplog.text
    settings = ["--stages", "identify", "--set", "identify.max_prompts=8", "--set", "identify.n_per_template=2",
                "--set", "identify.filter_correct=false", "--set", "identify.formations=[equation]"]  # fmt: skip
    run = ["run", "--model", model, *settings, "--out", str(tmp_path / "run"), "--quiet"]
    assert main([*run, "--max-memory", str(two)]) == 0
    stage = json.loads((tmp_path / "run" / "identify" / "metadata.json").read_text())
    assert stage["memory_budget"]["sizes"] == {"batch_size": 2}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="arithmech"):
        assert main([*run, "--max-memory", "1TB"]) == 0
    assert "identify: unchanged since the last run" in caplog.text


def test_run_plans_the_stages_reading_identify_at_its_prompts(
    tiny_model_dir: Callable[[str], Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """In `run`, the stages that read identify's prompts are fitted first at identify's settings (its prompts before
    the answer check: a bound), then again once identify has written them: attention at their widest, knockout at
    least there (its held-out prompts are read too)."""
    import logging

    from arithmech.data import read_prompt_file, tokenize_pairs
    from arithmech.models.load import load_tokenizer

    model = str(tiny_model_dir("llama"))
    settings = [f"identify.{s}" for s in ("max_prompts=8", "n_per_template=2", "filter_correct=false",
                                          "formations=[equation]")] + ["knockout.max_k=1", "knockout.n_random=1"]
    run = ["run", "--model", model, "--stages", "identify,attention,knockout", "--out", str(tmp_path), "--quiet",
           "--max-memory", "1TB", *[arg for s in settings for arg in ("--set", s)]]  # fmt: skip
    with caplog.at_level(logging.INFO, logger="arithmech"):
        assert main(run) == 0
    assert caplog.text.count("attention: reading its widest prompt") == 2  # the bound, then the folder
    tokenized, _ = tokenize_pairs(load_tokenizer(ModelConfig(model=model)),
                                  read_prompt_file(tmp_path / "identify" / "prompts.jsonl"))  # fmt: skip
    width = int(tokenized.ref_ids.shape[1])

    def planned(stage: str) -> int:
        return json.loads((tmp_path / stage / "metadata.json").read_text())["memory_budget"]["prompt_tokens"]

    assert planned("attention") == width and planned("knockout") >= width

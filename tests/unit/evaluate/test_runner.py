"""The evaluate runner and stage on a tiny model and tiny JSONL files: subsets, records, errors, resume, general."""

from __future__ import annotations

import csv
import json
import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from arithmech.data import locate
from arithmech.data.locate import hub_row
from arithmech.errors import ConfigError, DataError
from arithmech.evaluate.benchmarks import COT_EXEMPLARS, benchmark, build_prompts
from arithmech.evaluate.general import general_scores
from arithmech.evaluate.general_texts import GeneralText, load_general_texts
from arithmech.evaluate.generation import cut_at_stop, generate_greedy
from arithmech.evaluate.loading import EvalItem, load_rows
from arithmech.evaluate.runner import EvalOptions, evaluate, evaluate_benchmark, select_subset
from arithmech.evaluate.widths import BOUNDARY_TOKENS, widest_row
from arithmech.models.archs import spec_for_model_type
from arithmech.models.load import ModelHandle
from arithmech.models.view import ModelView
from arithmech.stages.evaluate import evaluate_stage
from arithmech.stages.evaluate_config import EvaluateConfig

from tiny_models import make_tiny_model, make_tiny_tokenizer


def tiny_handle(arch: str = "llama", dtype: torch.dtype = torch.float32) -> ModelHandle:
    model = make_tiny_model(arch, seed=0).to(dtype)
    view = ModelView(model, spec_for_model_type(model.config.model_type))
    return ModelHandle(model, make_tiny_tokenizer(), view, {"model": f"tiny-{arch}"})


@pytest.fixture(scope="module")
def handle() -> ModelHandle:
    return tiny_handle()


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A miniature data folder (like the shipped one): gsm8k, the llm_adapters train file, mmlu test/dev, csqa."""
    root = tmp_path_factory.mktemp("data")
    write_jsonl(root / "gsm8k/test.jsonl",
                [{"id": f"gsm8k-test-{i:04d}", "question": f"{i} plus 1?", "answer": str(i + 1)} for i in range(12)])
    write_jsonl(root / "llm_adapters_math_v1/train.jsonl", [
        {"id": "t0", "source": "gsm8k", "question": "ignored", "answer": "1", "orig_id": "gsm8k-test-0003"},
        {"id": "t1", "source": "gsm8k", "question": "5 PLUS 1 ?", "answer": "6", "orig_id": None},
    ])
    subjects = ("anatomy", "virology")
    write_jsonl(root / "mmlu/dev.jsonl", [
        {"id": f"dev-{s}-{i}", "subject": s, "question": f"{s} dev {i}?", "choices": list("wxyz"), "answer": i}
        for s in subjects for i in range(2)
    ])
    write_jsonl(root / "mmlu/test.jsonl", [
        {"id": f"test-{s}-{i}", "subject": s, "question": f"{s} q{i}?", "choices": list("abcd"), "answer": i % 4}
        for s in subjects for i in range(3)
    ])
    write_jsonl(root / "csqa/validation.jsonl", [
        {"id": f"cs{i}", "question": f"Where is {i}?", "choices": ["bank", "park", "home", "shop", "sea"],
         "answer": i % 5} for i in range(4)
    ])
    return root


# -- subsets ----------------------------------------------------------------------------------------------

def test_select_subset_is_seeded_local_and_ordered() -> None:
    items = list(range(100))
    state = __import__("random").getstate()
    a, b = select_subset(items, 10, 0, "gsm8k"), select_subset(items, 10, 0, "gsm8k")
    assert a == b and a == sorted(a) and len(set(a)) == 10
    assert select_subset(items, 10, 1, "gsm8k") != a  # another seed, other rows
    assert select_subset(items, 10, 0, "svamp") != a  # each benchmark draws its own
    assert select_subset(items, None, 0, "x") == items and select_subset(items, 500, 0, "x") == items
    assert __import__("random").getstate() == state  # the global RNG is untouched


def test_stage_same_seed_same_rows(handle: ModelHandle, data_root: Path, tmp_path: Path) -> None:
    def ids(seed: int, out: str) -> list[str]:
        cfg = EvaluateConfig(benchmarks=("gsm8k", "csqa"), limit=3, seed=seed, n_shot=0, max_new_tokens=2,
                             data_dir=str(data_root))
        result = evaluate_stage(handle, cfg, tmp_path / out, quiet=True)
        return [r["id"] for name in cfg.benchmarks for r in result.benchmarks[name].records]

    first = ids(0, "a")
    assert ids(0, "b") == first
    assert ids(3, "c") != first


# -- records and files ------------------------------------------------------------------------------------

def test_stage_writes_records_results_and_metadata(handle: ModelHandle, data_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = EvaluateConfig(benchmarks=("gsm8k", "mmlu", "csqa", "general"), limit=4, n_shot=0, max_new_tokens=4,
                         data_dir=str(data_root), general_max_tokens=24)
    result = evaluate_stage(handle, cfg, out, quiet=True)
    for name in cfg.benchmarks:
        lines = (out / "examples" / f"{name}.jsonl").read_text().splitlines()
        assert len(lines) == result.benchmarks[name].n == 4
    gsm = [json.loads(line) for line in (out / "examples/gsm8k.jsonl").read_text().splitlines()]
    assert set(gsm[0]) >= {"id", "question", "gold", "generated", "extracted", "correct"}
    assert all(r["correct"] == (r["extracted"] is not None and float(r["extracted"]) == float(r["gold"])) for r in gsm)
    mmlu = [json.loads(line) for line in (out / "examples/mmlu.jsonl").read_text().splitlines()]
    for r in mmlu:
        assert len(r["logprobs"]) == 4 and r["predicted"] == max(range(4), key=r["logprobs"].__getitem__)
        assert r["correct"] == (r["predicted"] == r["gold"])
    rows = {r["benchmark"]: r for r in csv.DictReader((out / "results.csv").open())}
    assert set(rows) == set(cfg.benchmarks)
    assert float(rows["mmlu"]["accuracy"]) == pytest.approx(sum(r["correct"] for r in mmlu) / 4)
    assert float(rows["general"]["perplexity"]) > 1 and rows["general"]["kl"] == ""  # no base model
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["stage"] == "evaluate" and meta["config"]["limit"] == 4
    assert meta["benchmarks"]["gsm8k"]["info"]["data_sha256"]
    assert meta["benchmarks"]["gsm8k"]["info"]["data_from"] == "--data-dir"
    assert meta["benchmarks"]["mmlu"]["info"]["choice_format"] == "letter"


def test_stage_resumes_finished_benchmarks(handle: ModelHandle, data_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    evaluate_stage(handle, EvaluateConfig(benchmarks=("csqa",), limit=3, data_dir=str(data_root)), out, quiet=True)
    first = (out / "examples/csqa.jsonl").read_text()
    extended = EvaluateConfig(benchmarks=("csqa", "general"), limit=3, data_dir=str(data_root))
    evaluate_stage(handle, extended, out, quiet=True)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["benchmarks"]["csqa"]["reused"] and not meta["benchmarks"]["general"]["reused"]
    assert (out / "examples/csqa.jsonl").read_text() == first
    changed = EvaluateConfig(benchmarks=("csqa",), limit=2, data_dir=str(data_root))
    evaluate_stage(handle, changed, out, quiet=True)  # another limit: csqa is run again
    meta = json.loads((out / "metadata.json").read_text())
    assert not meta["benchmarks"]["csqa"]["reused"] and meta["benchmarks"]["csqa"]["n"] == 2
    retuned = tiny_handle()
    with torch.no_grad():
        retuned.view.o_proj(0).weight.mul_(1.01)
    evaluate_stage(retuned, changed, out, quiet=True)  # same config, other weights: run again
    assert not json.loads((out / "metadata.json").read_text())["benchmarks"]["csqa"]["reused"]


def test_exclude_train_overlap_drops_and_records_rows(handle: ModelHandle, data_root: Path) -> None:
    options = EvalOptions(n_shot=0, max_new_tokens=2, exclude_train_overlap=True, data_dir=str(data_root))
    result = evaluate_benchmark(handle, "gsm8k", options)
    assert result.info["excluded_by_id"] == ["gsm8k-test-0003"]
    assert result.info["excluded_by_text"] == ["gsm8k-test-0005"]  # "5 plus 1?" == "5 PLUS 1 ?" normalised
    assert result.n == 10 and {"gsm8k-test-0003", "gsm8k-test-0005"}.isdisjoint(r["id"] for r in result.records)


def test_truncated_prompts_are_flagged(handle: ModelHandle, data_root: Path) -> None:
    """The 8-shot prompt is longer than the tiny model's 128 positions: left-truncated and reported."""
    result = evaluate_benchmark(handle, "gsm8k", EvalOptions(limit=2, max_new_tokens=2, data_dir=str(data_root)))
    assert result.info["n_shot"] == len(COT_EXEMPLARS) and result.info["truncated_prompts"] == 2
    assert all(r["truncated"] for r in result.records)


@pytest.mark.parametrize("name", ["gsm8k", "mmlu", "csqa", "general", "arithmetic"])
def test_the_widest_row_is_what_the_benchmark_embeds(handle: ModelHandle, data_root: Path, name: str) -> None:
    """The memory budget plans evaluate at `widest_row`, read before the weights load: for generation, text and
    arithmetic it is the widest row the model embeds; for choices at most BOUNDARY_TOKENS + 1 more (the longest
    option beside its context, where one-token options share one pass of the context), never less."""
    options = EvalOptions(limit=4, n_shot=0, max_new_tokens=2, data_dir=str(data_root),
                          general_max_tokens=24)  # fmt: skip
    widths: list[int] = []
    hook = handle.model.get_input_embeddings().register_forward_hook(
        lambda _m, args, _out: widths.append(args[0].shape[-1]))  # fmt: skip
    try:
        evaluate_benchmark(handle, name, options)
    finally:
        hook.remove()
    widest = widest_row(name, options, handle.tokenizer)
    assert max(widths) < 128  # the tiny model's context: nothing was truncated
    if name in ("mmlu", "csqa"):
        assert max(widths) <= widest <= max(widths) + BOUNDARY_TOKENS + 1
    else:
        assert widest == max(widths)


# -- bad input --------------------------------------------------------------------------------------------

def test_unknown_benchmark_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown benchmark 'gsm9k'.*gsm8k.*mmlu.*csqa"):
        EvaluateConfig(benchmarks=("gsm9k",))
    with pytest.raises(ConfigError, match="unknown benchmark"):
        benchmark("nope")


@pytest.mark.parametrize(
    "kwargs",
    [{"benchmarks": ()}, {"limit": 0}, {"batch_size": 0}, {"max_new_tokens": 0}, {"choice_format": "logits"},
     {"benchmarks": ("gsm8k", "gsm8k")}],
)
def test_bad_config_is_config_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        EvaluateConfig(**kwargs)


def test_empty_or_broken_file_is_data_error(handle: ModelHandle, tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    cfg = EvaluateConfig(benchmarks=(str(empty),))
    with pytest.raises(DataError, match="no rows"):
        evaluate_stage(handle, cfg, tmp_path / "out", quiet=True)
    broken = write_jsonl(tmp_path / "broken.jsonl", [{"id": "x", "question": "q"}])
    with pytest.raises(DataError, match="answer"):
        evaluate_benchmark(handle, str(broken), EvalOptions(n_shot=0))
    with pytest.raises(DataError, match=f"could not find the nothing test set: looked for {tmp_path}/nothing/test"):
        load_rows("nothing/test", str(tmp_path))


def test_too_many_shots_is_config_error(handle: ModelHandle, data_root: Path) -> None:
    with pytest.raises(ConfigError, match="0 to 5"):
        evaluate_benchmark(handle, "mmlu", EvalOptions(n_shot=6, data_dir=str(data_root)))
    with pytest.raises(ConfigError, match="fewer than"):  # the miniature dev set has 2 per subject
        evaluate_benchmark(handle, "mmlu", EvalOptions(n_shot=3, limit=1, data_dir=str(data_root)))


# -- prompts ----------------------------------------------------------------------------------------------

def test_mmlu_prompt_uses_same_subject_dev_rows() -> None:
    dev = [EvalItem(f"d{s}{i}", f"{s} dev {i}?", i, tuple("wxyz"), s) for s in ("anatomy", "virology") for i in (0, 1)]
    item = EvalItem("t", "virology q?", 2, tuple("abcd"), "virology")
    prompt = build_prompts(benchmark("mmlu"), [item], n_shot=2, exemplars=dev)[0]
    assert prompt.text.startswith("The following are multiple choice questions (with answers) about virology.")
    assert "virology dev 1?\nA. w\nB. x\nC. y\nD. z\nAnswer: B\n\n" in prompt.text and "anatomy" not in prompt.text
    assert prompt.text.endswith("virology q?\nA. a\nB. b\nC. c\nD. d\nAnswer:")
    assert prompt.continuations == (" A", " B", " C", " D")
    cloze = build_prompts(benchmark("mmlu"), [item], n_shot=0, choice_format="text")[0]
    assert cloze.continuations == (" a", " b", " c", " d") and "A. a" not in cloze.text


def test_chat_template_wraps_prompt() -> None:
    item = EvalItem("q", "2 plus 2?", "4")
    with pytest.raises(ConfigError, match="no chat template"):
        build_prompts(benchmark("gsm8k"), [item], n_shot=0, chat_tokenizer=make_tiny_tokenizer())
    tok = make_tiny_tokenizer()
    tok.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</>{% endfor %}<assistant>"
    prompt = build_prompts(benchmark("gsm8k"), [item], n_shot=1, chat_tokenizer=tok)[0]
    assert prompt.text.startswith("<user>Q: There are 15 trees") and prompt.text.endswith("Q: 2 plus 2?</><assistant>")


# -- generation -------------------------------------------------------------------------------------------

def test_batched_greedy_matches_unpadded_greedy_loop() -> None:
    """Left-padded batched generate == an argmax loop over full forward passes of each prompt alone.

    float32: transformers' eager padding mask gives NaN rows in float64 (a float64 model cannot be left-padded).
    """
    handle = tiny_handle("llama", torch.float32)
    prompts = ["Q: 1?\nA:", "Question: what is two?\nAnswer:", "xy"]
    outs = generate_greedy(handle.model, handle.tokenizer, prompts, max_new_tokens=6, batch_size=3)
    for prompt, out in zip(prompts, outs, strict=True):
        ids = handle.tokenizer(prompt)["input_ids"]
        for _ in range(6):
            with torch.no_grad():
                ids.append(int(handle.model(torch.tensor([ids])).logits[0, -1].argmax()))
        want = handle.tokenizer.decode(ids[len(handle.tokenizer(prompt)["input_ids"]):], skip_special_tokens=True)
        assert out.text == want and out.n_tokens == 6 and not out.truncated


def test_generation_longer_than_the_context_stops_at_its_end() -> None:
    """GPT-2 has a learned position table (128 rows here): max_new_tokens past it ends at the context's end."""
    handle = tiny_handle("gpt2", torch.float32)
    prompts = ["Q: 1?\nA:", "Question: what is two?\nAnswer:"]
    outs = generate_greedy(handle.model, handle.tokenizer, prompts, max_new_tokens=300, batch_size=2)
    widest = max(len(handle.tokenizer(p)["input_ids"]) for p in prompts)
    assert all(out.n_tokens <= 128 - widest and not out.truncated for out in outs)
    assert any(out.n_tokens == 128 - widest for out in outs)  # random weights never emit end-of-sequence here


def test_stop_criterion_marks_rows_whose_new_text_holds_a_stop() -> None:
    from arithmech.evaluate.generation import _StopOnStrings

    tok = make_tiny_tokenizer()
    prompt = list(b"Q:\nA:")  # the prompt's own "Q:" must not count
    rows = torch.tensor([prompt + list(b" 4.\n\nQ: x"), prompt + list(b" 4. The a"), prompt + list(b"Question:")])
    done = _StopOnStrings(tok, ("\n\n", "Question:"), len(prompt))(rows, torch.zeros(3, 1))
    assert done.tolist() == [True, False, True]


def test_cut_at_stop() -> None:
    assert cut_at_stop("The answer is 4.\n\nQ: next", ("\n\n", "\nQ:")) == ("The answer is 4.", True)
    assert cut_at_stop("no stop", ("\n\n",)) == ("no stop", False)


# -- general text -----------------------------------------------------------------------------------------

def direct_nll(model: torch.nn.Module, ids: list[int]) -> tuple[float, torch.Tensor]:
    with torch.no_grad():
        logprobs = model(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)  # [n-1, d_vocab]
    return -float(logprobs.gather(1, torch.tensor(ids[1:])[:, None]).sum()), logprobs


def test_perplexity_is_exp_mean_nll_and_kl_to_itself_is_zero() -> None:
    handle = tiny_handle("gemma2", torch.float64)  # soft-capped logits
    texts = [GeneralText("a", "The river begins as a thin stream."), GeneralText("b", "Bread needs flour.")]
    result = general_scores(handle.view, handle.tokenizer, texts, base_view=handle.view,
                            base_tokenizer=handle.tokenizer, batch_size=2)
    nlls, counts = [], []
    for t in texts:
        ids = handle.tokenizer(t.text)["input_ids"]
        nlls.append(direct_nll(handle.model, ids)[0])
        counts.append(len(ids) - 1)
    assert [t.nll for t in result.texts] == pytest.approx(nlls, abs=1e-8)
    assert result.perplexity == pytest.approx(math.exp(sum(nlls) / sum(counts)), rel=1e-10)
    assert result.kl == pytest.approx(0.0, abs=1e-12) and result.base_perplexity == pytest.approx(result.perplexity)


def test_kl_between_two_models_matches_direct() -> None:
    base, tuned = tiny_handle("llama", torch.float64), tiny_handle("llama", torch.float64)
    with torch.no_grad():
        tuned.view.o_proj(1).weight.mul_(1.5)
    texts = [GeneralText("a", "Light from the Sun takes time.")]
    result = general_scores(tuned.view, tuned.tokenizer, texts, base_view=base.view)
    ids = base.tokenizer(texts[0].text)["input_ids"]
    _, lp_base = direct_nll(base.model, ids)
    _, lp_tuned = direct_nll(tuned.model, ids)
    want = float((lp_base.exp() * (lp_base - lp_tuned)).sum()) / (len(ids) - 1)
    assert result.kl == pytest.approx(want, rel=1e-8) and result.kl > 0


def test_general_text_sources(tmp_path: Path) -> None:
    builtin = load_general_texts()
    assert len(builtin) == 30 and len({t.id for t in builtin}) == 30
    plain = tmp_path / "text.txt"
    plain.write_text("First paragraph.\n\nSecond\nparagraph.\n\n\n")
    assert [t.text for t in load_general_texts(plain)] == ["First paragraph.", "Second\nparagraph."]
    plain.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())  # "UTF-8 with BOM": the mark is not text
    assert load_general_texts(plain)[0].text == "First paragraph."
    (tmp_path / "latin1.txt").write_bytes("Caf\xe9.\n".encode("latin-1"))
    with pytest.raises(DataError, match="is not UTF-8 text"):
        load_general_texts(tmp_path / "latin1.txt")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(DataError, match="no text"):
        load_general_texts(tmp_path / "empty.txt")


def test_evaluate_api_with_base_handle(handle: ModelHandle) -> None:
    result = evaluate(handle, ["general"], limit=2, base_handle=handle, general_max_tokens=16)
    general = result.benchmarks["general"]
    assert general.n == 2 and general.info["kl"] == pytest.approx(0.0, abs=1e-6)


# -- hub ----------------------------------------------------------------------------------------------------

def test_hub_rows_are_converted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No network here: a stand-in `datasets` module serves CommonsenseQA-shaped rows."""
    fake = types.ModuleType("datasets")
    rows = [{"id": "x1", "question": "Where?", "answerKey": "B",
             "choices": {"label": ["A", "B", "C"], "text": ["bank", "park", "sea"]}}]
    fake.load_dataset = lambda repo, config, split: rows  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.delenv(locate.DATA_ENV, raising=False)
    monkeypatch.setattr(locate, "SHIPPED_DATA", tmp_path)  # no local copy
    loaded = load_rows("csqa/validation", str(tmp_path), ("tau/commonsense_qa", None, "validation"))
    assert loaded.origin == "hf:tau/commonsense_qa:validation"
    assert loaded.rows == [{"id": "x1", "question": "Where?", "choices": ["bank", "park", "sea"], "answer": 1}]
    gsm = hub_row("openai/gsm8k", {"question": "q", "answer": "work\n#### 1,200"}, 3)
    assert gsm == {"id": "gsm8k-hub-0003", "question": "q", "answer": "1200"}

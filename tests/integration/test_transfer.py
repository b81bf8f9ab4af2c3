"""transfer end to end: identify run folders on a tiny model -> the source x target matrix, its figure and
metadata; its cells equal a knockout written by hand (tests/reference_knockout.py, no `arithmech.knockout`) on a
generated set and a word-problem set; bad input is one clear error; and on the real default model."""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from arithmech.cli import main
from arithmech.data import PromptPair
from arithmech.data.target_sets import build_target_pairs, target_set
from arithmech.errors import ConfigError
from arithmech.models.hooks import count_hooks
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.stages.identify import identify
from arithmech.stages.identify_config import IdentifyConfig
from arithmech.stages.identify_run import read_identify_run
from arithmech.stages.transfer import CSV_COLUMNS, TransferResult, TransferRow, read_transfer_csv, transfer
from arithmech.stages.transfer_config import TransferConfig

from reference_knockout import knocked_logits, mean_values
from tiny_models import single_thread

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
TARGETS = ("addition-equation", "decimals-addition-equation")
FORMATIONS = ("equation", "qa")
"""The sources: identify runs on equation and on question-answer prompts, so their rankings differ."""


@pytest.fixture(autouse=True)
def tiny_tests_on_one_thread(request: pytest.FixtureRequest) -> Iterator[None]:
    """`single_thread` for the tiny-model tests (the module fixtures use it too), not for the default model."""
    if request.node.get_closest_marker("default_model"):
        yield
        return
    with single_thread():
        yield


@pytest.fixture(scope="module")
def tiny(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelHandle, list[Path]]:
    """The tiny llama and two source folders: identify runs on two formations."""
    model_dir = tiny_model_dir("llama")
    root = tmp_path_factory.mktemp("identify")
    for formation in FORMATIONS:
        args = ["identify", "--model", str(model_dir), "--keep-incorrect", "--formations", formation]
        with single_thread():
            assert main([*args, "--n-per-template", "2", "--out", str(root / formation), "--quiet"]) == 0
    return load_model(ModelConfig(model=str(model_dir))), [root / f for f in FORMATIONS]


def small(sources: list[Path], **changes: object) -> TransferConfig:
    """Whole target sets (no filtering, max_prompts above their size) of 8 prompts per template: every
    (template, token length) group of the mean ablation holds 8 prompts of the tiny byte-level tokenizer."""
    settings: dict[str, object] = {
        "sources": tuple(str(s) for s in sources), "targets": TARGETS, "n_random": 2, "n_per_template": 8,
        "max_prompts": 64, "limit": 3, "filter_correct": False, "data_dir": str(SHARED), "batch_size": 16,
    }
    return TransferConfig(**{**settings, **changes})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def result(tiny: tuple[ModelHandle, list[Path]], tmp_path_factory: pytest.TempPathFactory) -> TransferResult:
    handle, sources = tiny
    targets = (*TARGETS, "svamp") if (SHARED / "svamp" / "test.jsonl").is_file() else TARGETS
    out = tmp_path_factory.mktemp("transfer") / "out"
    with single_thread():
        return transfer(handle, small(sources, targets=targets, k=2), out, quiet=True)


def csv_row(out: Path, target: str, source: Path) -> dict[str, str]:
    rows = list(csv.DictReader((out / "transfer.csv").open()))
    return next(r for r in rows if r["target"] == target and r["source"] == str(source))


def test_writes_matrix_figure_and_metadata(tiny: tuple[ModelHandle, list[Path]], result: TransferResult) -> None:
    handle, sources = tiny
    out = result.out_dir
    assert {p.name for p in out.iterdir()} == {"transfer.csv", "transfer.png", "transfer.svg", "metadata.json"}
    assert count_hooks(handle.model) == 0
    rows = list(csv.DictReader((out / "transfer.csv").open()))
    targets = result.metadata["config"]["targets"]
    assert list(rows[0]) == list(CSV_COLUMNS) and len(rows) == len(sources) * len(targets)
    assert [(r["target"], r["source"]) for r in rows] == [(t, str(s)) for t in targets for s in sources]
    for row in rows:
        if row["target"] in TARGETS:
            assert int(row["n_prompts"]) == int(row["n_total"]) == 32 and row["k"] == "2"
            assert len(row["components"].split()) == 2 and row["note"] == ""
        else:  # svamp prompts are longer than the tiny model's 128 positions: empty cells and a note, no crash
            assert row["effect_accuracy"] == row["base_accuracy"] == "" and "longer than the context" in row["note"]
            assert json.loads((out / "metadata.json").read_text())["targets"][row["target"]]["base_accuracy"] is None
    again = read_transfer_csv(out / "transfer.csv")
    for read, kept in zip(again, result.rows, strict=True):
        assert (read.source, read.target, read.k, read.note) == (kept.source, kept.target, kept.k, kept.note)
        assert read.effect_prob == pytest.approx(kept.effect_prob, abs=1e-6, nan_ok=True)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["stage"] == "transfer" and meta["sources"][0]["k"] == 2
    assert meta["targets"]["addition-equation"]["ablation"].startswith("mean over the set's counterfactual")
    assert (out / "metadata.json").stat().st_mtime_ns >= (out / "transfer.png").stat().st_mtime_ns


@torch.no_grad()
def hand_knockout(
    handle: ModelHandle, pairs: list[PromptPair], heads: list[tuple[int, int]], end_only: bool, digits: bool = True
) -> dict[str, float]:
    """Accuracy and mean answer probability of `pairs` at END, unablated and with `heads` mean-ablated, by the
    reference knockout (tests/reference_knockout.py `mean_values`), one unpadded prompt per forward pass.
    With `digits`, a whole answer is scored: one prompt per answer token, its earlier tokens appended to the
    reference and the counterfactual (teacher forcing); a pair is right when every token is the top token, and
    its probability is the product of its tokens'. The tiny tokenizer has one token per byte."""
    model, tokenizer = handle.model, handle.tokenizer
    ref, cf, answers, owner, keys = [], [], [], [], []
    for n, p in enumerate(pairs):
        answer = tokenizer(p.answer).input_ids if digits else tokenizer(p.answer).input_ids[:1]
        for j, token in enumerate(answer):
            ref.append(torch.tensor([tokenizer(p.reference).input_ids + answer[:j]]))  # [1, pos]
            cf.append(torch.tensor([tokenizer(p.counterfactual).input_ids + answer[:j]]))
            answers.append(token)
            owner.append(n)
            keys.append(f"{p.template_id}#{j}")
    targets, rows, pair_of = torch.tensor(answers), torch.arange(len(answers)), torch.tensor(owner)
    values, where = mean_values(model, cf, keys, end_only)
    plain = torch.cat([model(input_ids=ids).logits[:, -1] for ids in ref])  # [row, d_vocab]
    knocked = torch.cat([
        knocked_logits(model, ids, heads, [], z, mlp, where)[:, -1] for ids, (z, mlp) in zip(ref, values, strict=True)
    ])  # fmt: skip

    def whole(logits: torch.Tensor) -> tuple[float, float]:  # (accuracy, mean probability) of whole answers
        wrong = torch.zeros(len(pairs)).index_add_(0, pair_of, (logits.argmax(-1) != targets).float())
        log_prob = torch.zeros(len(pairs), dtype=torch.float64).index_add_(
            0, pair_of, logits.softmax(-1)[rows, targets].double().log())
        return float((wrong == 0).float().mean()), float(log_prob.exp().mean())

    (base, base_prob), (effect, effect_prob) = whole(plain), whole(knocked)
    per_token = float((knocked.argmax(-1) == targets).float().mean())
    return {"base_accuracy": base, "unablated_prob": base_prob, "effect_accuracy": effect, "effect_prob": effect_prob,
            "effect_token_accuracy": per_token}


def assert_cell(row: dict[str, str], kept: TransferRow, expected: dict[str, float]) -> None:
    """transfer.csv (6 decimals) and the row in memory against the reference; the knockout must move the
    probability well past their agreement: ten times the relative tolerance of the row in memory (the CSV's 6
    decimals cannot tell the probabilities of whole answers of several tokens, far below 1e-6, apart)."""
    for name in ("base_accuracy", "effect_accuracy", "effect_token_accuracy"):
        assert float(row[name]) == pytest.approx(expected[name], abs=1e-6), name
    for name in ("unablated_prob", "effect_prob"):
        assert float(row[name]) == pytest.approx(expected[name], abs=2e-6), name
        assert getattr(kept, name) == pytest.approx(expected[name], rel=1e-4), name
    assert abs(expected["effect_prob"] - expected["unablated_prob"]) > 1e-3 * expected["unablated_prob"]


def heads_of(row: dict[str, str]) -> list[tuple[int, int]]:
    return [(int(layer), int(head)) for layer, head in (name.split(".") for name in row["components"].split())]


def held_out_here(target: str, sources: list[Path]) -> list[PromptPair]:
    """The target's prompts held out from the sources' ranked prompts, worked out here: queries among the addition
    facts (sum, smaller, larger operand) no source's prompts.jsonl states, and no ranked prompt's text."""
    ranked = [json.loads(line) for s in sources for line in (s / "prompts.jsonl").read_text().splitlines()]
    facts = {(int(r["a"]) + int(r["b"]), *sorted((int(r["a"]), int(r["b"])))) for r in ranked}
    texts = {r["reference"] for r in ranked}
    built = build_target_pairs(target_set(target), small(sources).target_options(),
                               keep=lambda _, ab: (sum(ab), *sorted(ab)) not in facts)  # fmt: skip
    return [p for p in built if p.reference not in texts]


def test_targets_hold_out_the_sources_ranked_prompts(
    tiny: tuple[ModelHandle, list[Path]], result: TransferResult
) -> None:
    """The addition target, generated with the equation source's templates and seed, would hold that source's
    very prompts: it is built again from the facts no source ranked on, and each row counts what was replaced;
    the decimals target shares nothing and is built as before."""
    _, sources = tiny
    unrestricted = build_target_pairs(target_set("addition-equation"), small(sources).target_options())
    ranked = [json.loads(line)["reference"] for line in (sources[0] / "prompts.jsonl").read_text().splitlines()]
    assert set(ranked) <= {p.reference for p in unrestricted}  # the in-sample cell this replaces
    equation, qa = (csv_row(result.out_dir, "addition-equation", s) for s in sources)
    assert int(equation["replaced_in_sample"]) >= len(ranked) == 8 and int(qa["replaced_in_sample"]) > 0
    assert len(held_out_here("addition-equation", sources)) == int(equation["n_total"]) == 32
    record = result.metadata["targets"]["addition-equation"]["held_out"]
    assert record["prompts"] == 32 and record["replaced"] == int(equation["replaced_in_sample"])
    decimals = [csv_row(result.out_dir, "decimals-addition-equation", s) for s in sources]
    assert [r["replaced_in_sample"] for r in decimals] == ["0", "0"]
    assert result.metadata["targets"]["decimals-addition-equation"]["held_out"] is None


@pytest.mark.parametrize("target", TARGETS)
def test_effect_cells_equal_a_hand_written_knockout(
    tiny: tuple[ModelHandle, list[Path]], result: TransferResult, target: str
) -> None:
    handle, sources = tiny
    pairs = held_out_here(target, sources)
    tops = []
    for source in sources:
        row = csv_row(result.out_dir, target, source)
        assert row["components"] == " ".join(c.name for c in read_identify_run(source, handle).ranked("head")[:2])
        kept = next(r for r in result.rows if r.target == target and r.source == str(source))
        assert_cell(row, kept, hand_knockout(handle, pairs, heads_of(row), end_only=False))
        tops.append(row["components"])
    assert tops[0] != tops[1]  # two sources that knock out different heads


def test_word_problems_knock_out_at_end_with_the_data_set_mean(
    tiny: tuple[ModelHandle, list[Path]], tmp_path: Path
) -> None:
    handle, sources = tiny
    rows = [{"id": f"w{i}", "question": f"Tom has {i} and {i + 2} more. How many?", "answer": str(2 * i + 2)}
            for i in range(10)]
    path = tmp_path / "word.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # k=4: the END-mean knockout of the top 3 heads moves the mean answer probability by < 1e-6 here
    cfg = small(sources[:1], targets=(str(path),), few_shot=1, k=4, limit=10)
    res = transfer(handle, cfg, tmp_path / "t", quiet=True)
    row = csv_row(tmp_path / "t", str(path), sources[0])
    assert int(row["n_prompts"]) == int(row["n_total"]) == 9
    assert res.metadata["targets"][str(path)]["shared_prefix_tokens"] > 20  # the stage ran its shared-prefix path
    pairs = build_target_pairs(target_set(str(path)), cfg.target_options())
    assert_cell(row, res.rows[0], hand_knockout(handle, pairs, heads_of(row), end_only=True, digits=False))


def test_default_k_is_the_key_heads_and_filtering_keeps_answered(
    tiny: tuple[ModelHandle, list[Path]], tmp_path: Path
) -> None:
    handle, sources = tiny
    run = read_identify_run(sources[0], handle)
    res = transfer(handle, small(sources[:1], targets=TARGETS[:1], filter_correct=True, n_random=1),
                   tmp_path / "t", quiet=True)
    row = res.rows[0]
    assert row.k == min(max(len(run.key["key_heads"]), 1), 32)
    assert row.n_prompts == row.n_answered == round(row.base_accuracy * row.n_total)
    if row.n_prompts:
        assert row.unablated_accuracy == pytest.approx(1.0)
    else:
        assert math.isnan(row.effect_drop) and "answered none" in row.note


def test_a_source_without_key_heads_says_which_head_it_takes_and_why(
    tiny: tuple[ModelHandle, list[Path]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 22.7: a run with no key heads (here the qa run) falls back to its top head by effect, out loud."""
    handle, sources = tiny
    run = read_identify_run(sources[1], handle)
    assert run.key["key_heads"] == []
    with caplog.at_level(logging.WARNING):
        res = transfer(handle, small(sources[1:], targets=TARGETS[:1], n_random=1), tmp_path / "t", quiet=True)
    top = run.ranked("head")[0]
    source = res.metadata["sources"][0]
    assert source["components"] == [top.name] and "the run has no key heads (rule: effect < -0.05)" in source["why"]
    assert "give --k N" in source["why"]
    assert f"knocks out {top.name} ({run.effects[top]:+.1%}): its top head by effect, since the run" in caplog.text
    res = transfer(handle, small(sources[1:], targets=TARGETS[:1], n_random=1, k=2), tmp_path / "k", quiet=True)
    assert res.metadata["sources"][0]["why"] == "its top 2 heads by effect (--k 2)"


def test_bad_input_is_one_clear_error(tiny: tuple[ModelHandle, list[Path]], tmp_path: Path) -> None:
    handle, sources = tiny
    with pytest.raises(ConfigError, match="no sources given"):
        TransferConfig()
    with pytest.raises(ConfigError, match="unknown target set 'cubes'"):
        TransferConfig(sources=("x",), targets=("cubes",))
    with pytest.raises(ConfigError, match="targets svamp given twice"):
        TransferConfig(sources=("x",), targets=("svamp", "svamp"))
    with pytest.raises(ConfigError, match="k must be at least 1"):
        TransferConfig(sources=("x",), k=0)
    with pytest.raises(ConfigError, match="is a source run folder"):
        transfer(handle, small(sources[:1]), sources[0], quiet=True)
    with pytest.raises(ConfigError, match="does not exist"):
        transfer(handle, small([tmp_path / "missing"]), tmp_path / "out", quiet=True)
    with pytest.raises(ConfigError, match="larger than"):
        transfer(handle, small(sources[:1], k=10_000), tmp_path / "out", quiet=True)
    assert not (tmp_path / "out" / "metadata.json").exists()


@pytest.mark.default_model
def test_default_model_transfer(tmp_path: Path) -> None:
    """SmolLM2-135M: the key heads of a small equation-addition run, knocked out on fresh equation prompts and
    on decimals; the model answers most of them, the kept prompts start at 100%, and the knockout lowers the
    answer's probability below the unablated and the random-rank runs (measured: 0.69 -> 0.58 on equations,
    0.54 -> 0.35 on decimals, random heads 0.69 and 0.55)."""
    pytest.importorskip("gguf")
    handle = load_model()
    run = tmp_path / "run"  # the identify stage called directly, so the model is loaded once
    identify(handle, IdentifyConfig(formations=("equation",), n_per_template=1, max_prompts=4), run, quiet=True)
    cfg = TransferConfig(sources=(str(run),), targets=("addition-equation", "decimals-addition-equation"),
                         n_per_template=4, max_prompts=8, n_random=1)  # groups of 4: a per-position mean
    res = transfer(handle, cfg, tmp_path / "transfer", quiet=True)
    assert [r.target for r in res.rows] == list(cfg.targets)
    own = res.rows[0]
    assert own.n_total == 16 and own.n_answered >= 4 and own.unablated_accuracy == pytest.approx(1.0)
    for row in res.rows:  # the key heads lower the answer's probability, and more than as many random heads
        assert row.n_prompts > 0 and row.effect_prob < min(row.unablated_prob, row.random_prob_mean)
    assert count_hooks(handle.model) == 0 and (tmp_path / "transfer" / "metadata.json").is_file()

"""transfer end to end: identify run folders on a tiny model -> the source x target matrix, its figure and
metadata; the effect cell equals a plain knockout; bad input is one clear error; and on the real default model."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

from arithmech.cli import main
from arithmech.data import tokenize_pairs
from arithmech.data.target_sets import TargetOptions, build_target_pairs, target_set
from arithmech.errors import ConfigError
from arithmech.knockout.ablation import ablation_sources, alignment_groups
from arithmech.knockout.batched import knockout_scores
from arithmech.models.hooks import count_hooks
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.patching.path import PatchingBatch
from arithmech.stages.identify import IdentifyConfig, identify
from arithmech.stages.identify_run import read_identify_run
from arithmech.stages.transfer import CSV_COLUMNS, TransferConfig, TransferResult, read_transfer_csv, transfer

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
TARGETS = ("addition-equation", "decimals-addition-equation")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelHandle, list[Path]]:
    """The tiny llama and two source folders (one identify run, and a copy under another name)."""
    model_dir = tiny_model_dir("llama")
    run = tmp_path_factory.mktemp("identify") / "run"
    args = ["identify", "--model", str(model_dir), "--keep-incorrect", "--formations", "equation"]
    assert main([*args, "--n-per-template", "2", "--out", str(run), "--quiet"]) == 0
    copy = run.parent / "copy"
    shutil.copytree(run, copy)
    return load_model(ModelConfig(model=str(model_dir))), [run, copy]


def small(sources: list[Path], **changes: object) -> TransferConfig:
    settings: dict[str, object] = {
        "sources": tuple(str(s) for s in sources), "targets": TARGETS, "n_random": 2, "n_per_template": 2,
        "max_prompts": 64, "limit": 3, "filter_correct": False, "data_dir": str(SHARED), "batch_size": 16,
    }
    return TransferConfig(**{**settings, **changes})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def result(tiny: tuple[ModelHandle, list[Path]], tmp_path_factory: pytest.TempPathFactory) -> TransferResult:
    handle, sources = tiny
    targets = (*TARGETS, "svamp") if (SHARED / "svamp" / "test.jsonl").is_file() else TARGETS
    out = tmp_path_factory.mktemp("transfer") / "out"
    return transfer(handle, small(sources, targets=targets, k=2), out, quiet=True)


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
            assert int(row["n_prompts"]) == int(row["n_total"]) > 0 and row["k"] == "2"
            assert all(0.0 <= float(row[c]) <= 1.0 for c in ("base_accuracy", "effect_accuracy", "effect_prob"))
            assert len(row["components"].split()) == 2 and row["note"] == ""
        else:  # svamp prompts are longer than the tiny model's 128 positions: a NaN row and a note, no crash
            assert math.isnan(float(row["effect_accuracy"])) and "longer than the context" in row["note"]
    by_source = {s: [r for r in rows if r["source"] == str(s)] for s in sources}
    effect = {s: [r["effect_accuracy"] for r in by_source[s]] for s in sources}
    assert effect[sources[0]] == effect[sources[1]]
    again = read_transfer_csv(out / "transfer.csv")
    for read, kept in zip(again, result.rows, strict=True):
        assert (read.source, read.target, read.k, read.note) == (kept.source, kept.target, kept.k, kept.note)
        assert read.effect_prob == pytest.approx(kept.effect_prob, abs=1e-6, nan_ok=True)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["stage"] == "transfer" and meta["sources"][0]["k"] == 2
    assert meta["targets"]["addition-equation"]["ablation"].startswith("mean over the set's counterfactual")
    assert (out / "metadata.json").stat().st_mtime_ns >= (out / "transfer.png").stat().st_mtime_ns


def test_effect_cell_equals_a_plain_knockout(tiny: tuple[ModelHandle, list[Path]], result: TransferResult) -> None:
    handle, sources = tiny
    name = "decimals-addition-equation"
    pairs = build_target_pairs(target_set(name), TargetOptions(n_per_template=2, few_shot=3, seed=0))
    t, _ = tokenize_pairs(handle.tokenizer, pairs)
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    groups = alignment_groups([p.template_id for p in t.pairs], t.end + 1)
    ablation = ablation_sources(handle.view, batch, "mean", groups)
    top = read_identify_run(sources[0], handle).ranked("head")[:2]
    scores = knockout_scores(handle.view, batch, ablation, [[], top], batch_size=5)
    row = next(r for r in result.rows if r.target == name and r.source == str(sources[0]))
    assert row.components == " ".join(c.name for c in top)
    assert row.effect_accuracy == pytest.approx(float(scores.accuracy[1]))
    assert row.effect_prob == pytest.approx(float(scores.mean_prob[1]), abs=1e-5)
    assert row.unablated_prob == pytest.approx(float(scores.mean_prob[0]), abs=1e-5)
    assert row.base_accuracy == pytest.approx(float(scores.accuracy[0]))


def test_word_problems_knock_out_at_end_with_the_data_set_mean(
    tiny: tuple[ModelHandle, list[Path]], tmp_path: Path
) -> None:
    handle, sources = tiny
    rows = [{"id": f"w{i}", "question": f"Tom has {i} and {i + 2} more. How many?", "answer": str(2 * i + 2)}
            for i in range(7)]
    path = tmp_path / "word.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = small(sources[:1], targets=(str(path),), few_shot=1, k=3, limit=10)
    res = transfer(handle, cfg, tmp_path / "t", quiet=True)
    row = res.rows[0]
    assert row.n_prompts == row.n_total == 6 and res.metadata["targets"][str(path)]["shared_prefix_tokens"] > 20
    # the same knockout with whole-prompt passes: END-only mean over the prompts (counterfactual == reference)
    pairs = build_target_pairs(target_set(str(path)), TargetOptions(few_shot=1, limit=10))
    t, _ = tokenize_pairs(handle.tokenizer, pairs)
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    ablation = ablation_sources(handle.view, batch, "mean", [0] * len(batch), end_only=True)
    top = read_identify_run(sources[0], handle).ranked("head")[:3]
    scores = knockout_scores(handle.view, batch, ablation, [[], top])
    assert row.effect_accuracy == pytest.approx(float(scores.accuracy[1]))
    assert row.effect_prob == pytest.approx(float(scores.mean_prob[1]), abs=1e-5)
    assert row.unablated_prob == pytest.approx(float(scores.mean_prob[0]), abs=1e-5)


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
    on decimals; the model answers most of them, and the kept prompts start at 100%."""
    pytest.importorskip("gguf")
    handle = load_model()
    run = tmp_path / "run"  # the identify stage called directly, so the model is loaded once
    identify(handle, IdentifyConfig(formations=("equation",), n_per_template=1, max_prompts=4), run, quiet=True)
    cfg = TransferConfig(sources=(str(run),), targets=("addition-equation", "decimals-addition-equation"),
                         n_per_template=1, max_prompts=4, n_random=1)
    res = transfer(handle, cfg, tmp_path / "transfer", quiet=True)
    assert [r.target for r in res.rows] == list(cfg.targets)
    own = res.rows[0]
    assert own.n_total == 4 and own.n_answered >= 2 and own.unablated_accuracy == pytest.approx(1.0)
    for row in res.rows:
        assert row.k >= 1 and (row.n_prompts == 0 or 0.0 <= row.effect_drop <= 1.0)
    assert count_hooks(handle.model) == 0 and (tmp_path / "transfer" / "metadata.json").is_file()

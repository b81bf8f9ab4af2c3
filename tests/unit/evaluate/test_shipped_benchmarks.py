"""Every data set a command needs loads from the copy shipped in the package, with ../shared hidden and no network.

`offline_guard.hidden` refuses (and records) any open() under the folder that holds ../shared/data and any
internet connection; the HF offline variables are set and $ARITHMECH_DATA is unset, as on a stranger's clone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from arithmech.data import locate
from arithmech.data.target_sets import WORD_PROBLEM_SETS, TargetOptions, build_target_pairs, target_set
from arithmech.evaluate.benchmarks import benchmark, benchmark_names
from arithmech.evaluate.runner import EvalOptions, load_items
from arithmech.finetune.sft_rows import read_sft_examples, resolve_sft_data
from arithmech.stages.finetune_config import FinetuneConfig

from offline_guard import BLOCKED, hidden

SHARED = Path(__file__).resolve().parents[3].parent / "shared"
DATA_BENCHMARKS = [name for name in benchmark_names() if benchmark(name).data is not None]


@pytest.fixture
def stranger(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A working folder of its own, no $ARITHMECH_DATA, the hub offline, ../shared and the network refused."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(locate.DATA_ENV, raising=False)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    before = len(BLOCKED)
    with hidden(SHARED):
        yield
    assert BLOCKED[before:] == []  # nothing even tried to read ../shared or go online


@pytest.mark.usefixtures("stranger")
@pytest.mark.parametrize("name", DATA_BENCHMARKS)
def test_every_benchmark_loads_from_the_shipped_copy(name: str) -> None:
    bench = benchmark(name)
    items, exemplars, info = load_items(bench, EvalOptions(limit=3, exclude_train_overlap=bench.kind == "generate"))
    assert len(items) == 3 and info["data_from"] == "shipped"
    assert Path(info["data"]).is_relative_to(locate.SHIPPED_DATA) and len(info["data_sha256"]) == 64
    if bench.kind == "generate":  # the overlap rule reads finetune's default training data, shipped too
        assert Path(info["train_file"]).is_relative_to(locate.SHIPPED_DATA)
    if bench.exemplars:
        assert len(exemplars) == 285 and Path(info["exemplars"]).is_relative_to(locate.SHIPPED_DATA)


@pytest.mark.usefixtures("stranger")
@pytest.mark.parametrize("name", WORD_PROBLEM_SETS)
def test_transfer_word_problems_load_from_the_shipped_copy(name: str) -> None:
    pairs = build_target_pairs(target_set(name), TargetOptions(limit=3))
    assert len(pairs) == 3 and all(p.reference.count("Question: ") == 4 for p in pairs)


@pytest.mark.usefixtures("stranger")
def test_finetune_default_training_data_loads_from_the_shipped_copy() -> None:
    path = resolve_sft_data(FinetuneConfig(method="full").data)
    assert path == locate.SHIPPED_DATA / "llm_adapters_math_v1" / "train.jsonl.gz"
    examples, counts = read_sft_examples(path, "rationale")
    assert counts["rows"] == 3260 and counts["kept"] == len(examples) == 2480  # correct rationales only

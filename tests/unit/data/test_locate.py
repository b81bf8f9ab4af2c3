"""Finding data sets: lookup order, .jsonl.gz wherever a file is given, and the not-found message."""

from __future__ import annotations

import gzip
import json
import sys
import types
from pathlib import Path

import pytest

from arithmech.data import locate
from arithmech.data.locate import SHIPPED_DATA, data_roots, data_sha256, find_data_file
from arithmech.data.target_sets import TargetOptions, build_target_pairs, resolve_word_problems, target_set
from arithmech.errors import DataError
from arithmech.evaluate.benchmarks import benchmark
from arithmech.evaluate.loading import load_rows
from arithmech.finetune.sft_rows import read_sft_examples, resolve_sft_data
from arithmech.stages.evaluate import file_stem
from arithmech.stages.evaluate_config import EvaluateConfig

ROOT = Path(__file__).resolve().parents[3]
ROWS = [{"id": f"r{i}", "question": f"Tom has {i} apples. How many?", "answer": str(i), "rationale": f"{i}."}
        for i in range(6)]  # fmt: skip


def write(path: Path, rows: list[dict] = ROWS, packed: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if packed else data)
    return path


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(locate.DATA_ENV, raising=False)


@pytest.mark.usefixtures("no_env")
def test_data_dir_then_env_then_shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert [r.label for r in data_roots()] == ["shipped"]
    assert find_data_file("svamp/test") == locate.DataFile(SHIPPED_DATA / "svamp" / "test.jsonl.gz", "shipped")
    env = write(tmp_path / "env" / "svamp" / "test.jsonl.gz", packed=True)
    monkeypatch.setenv(locate.DATA_ENV, str(tmp_path / "env"))
    assert find_data_file("svamp/test") == locate.DataFile(env, "$ARITHMECH_DATA")
    mine = write(tmp_path / "mine" / "svamp" / "test.jsonl")
    assert find_data_file("svamp/test", tmp_path / "mine") == locate.DataFile(mine, "--data-dir")
    assert find_data_file("gsm8k/test", tmp_path / "mine").label == "shipped"  # a set the folder lacks
    assert [r.label for r in data_roots(tmp_path)] == ["--data-dir", "$ARITHMECH_DATA", "shipped"]


def test_no_data_root_or_source_file_points_at_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(locate.DATA_ENV, raising=False)
    assert not any("shared" in str(root.path) for root in data_roots())
    texts = {p: p.read_text(encoding="utf-8") for p in (ROOT / "src").rglob("*.py")}
    assert [p for p, text in texts.items() if "../shared" in text or "shared/data" in text] == []


def test_gz_and_plain_files_read_alike_everywhere(tmp_path: Path) -> None:
    plain, packed = write(tmp_path / "p.jsonl"), write(tmp_path / "p.jsonl.gz", packed=True)
    assert data_sha256(plain) == data_sha256(packed)  # the checksum of the JSONL bytes, not of the .gz
    assert load_rows(str(packed)).rows == load_rows(str(plain)).rows == ROWS
    assert load_rows(str(packed)).sha256 == load_rows(str(plain)).sha256
    assert benchmark(str(packed), ROWS).kind == "generate"
    assert EvaluateConfig(benchmarks=(str(packed),)).benchmarks == (str(packed),)
    assert file_stem(str(packed)).startswith("p-") and file_stem(str(packed)) != file_stem(str(plain))
    pairs = build_target_pairs(target_set(str(packed)), TargetOptions(limit=2))
    assert len(pairs) == 2 and {p.extra["id"] for p in pairs} <= {r["id"] for r in ROWS}
    examples, counts = read_sft_examples(resolve_sft_data(str(packed)))
    assert counts["rows"] == 6 and examples == read_sft_examples(plain)[0]


@pytest.mark.usefixtures("no_env")
def test_a_folder_of_gz_sets_is_a_data_dir(tmp_path: Path) -> None:
    write(tmp_path / "gsm8k" / "test.jsonl.gz", packed=True)
    write(tmp_path / "gsm8k" / "train.jsonl.gz", [dict(r, question=f"Train {i}?") for i, r in enumerate(ROWS)], True)
    assert load_rows("gsm8k/test", str(tmp_path)).found_in == "--data-dir"
    assert resolve_word_problems("gsm8k", "test", tmp_path) == tmp_path / "gsm8k" / "test.jsonl.gz"
    prefix = build_target_pairs(target_set("gsm8k"), TargetOptions(limit=2, data_dir=str(tmp_path)))[0].reference
    assert prefix.count("Question: Train ") == 3  # solved examples from the train file beside the test file
    assert resolve_sft_data("gsm8k", tmp_path) == tmp_path / "gsm8k" / "train.jsonl.gz"


def fake_datasets(error: Exception) -> types.ModuleType:
    module = types.ModuleType("datasets")

    def load_dataset(repo: str, config: str | None, split: str) -> None:
        raise error

    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    return module


@pytest.mark.usefixtures("no_env")
def test_not_found_says_where_it_looked_what_the_hub_did_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(locate, "SHIPPED_DATA", tmp_path / "shipped")
    monkeypatch.setenv(locate.DATA_ENV, str(tmp_path / "env"))
    (tmp_path / "env").mkdir()
    hub = ("ChilleD/SVAMP", None, "test")
    where = (f"looked for {tmp_path}/mine/svamp/test.jsonl(.gz) (--data-dir, no such folder), "
             f"{tmp_path}/env/svamp/test.jsonl(.gz) ($ARITHMECH_DATA), "
             f"{tmp_path}/shipped/svamp/test.jsonl(.gz) (shipped, no such folder)")  # fmt: skip
    fix = "pass --data-dir FOLDER holding svamp/test.jsonl, set $ARITHMECH_DATA=FOLDER, or give a .jsonl path"

    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed: `import datasets` fails
    with pytest.raises(DataError) as missing:
        load_rows("svamp/test", str(tmp_path / "mine"), hub)
    message = str(missing.value)
    assert message.startswith(f"could not find the svamp test set: {where}; ") and fix in message
    assert "the hub copy ChilleD/SVAMP was not tried: the datasets package is not installed" in message

    offline = ConnectionError("Couldn't reach 'ChilleD/SVAMP' on the Hub (OfflineModeIsEnabled)")
    monkeypatch.setitem(sys.modules, "datasets", fake_datasets(offline))  # installed, hub unreachable
    with pytest.raises(DataError) as unreachable:
        load_rows("svamp/test", str(tmp_path / "mine"), hub)
    message = str(unreachable.value)
    assert where in message and fix in message and "not installed" not in message
    assert ("the hub copy ChilleD/SVAMP test could not be loaded: the hub could not be reached or has no such split "
            "(ConnectionError: Couldn't reach 'ChilleD/SVAMP' on the Hub (OfflineModeIsEnabled))") in message

    with pytest.raises(DataError, match="could not find the svamp test set: .*ChilleD/SVAMP test could not be loaded"):
        resolve_word_problems("svamp")  # transfer's lookup says the same
    with pytest.raises(DataError, match="could not find the addsub test set: .*; no hub copy of it is known; "):
        load_rows("addsub/test")
    with pytest.raises(DataError, match=r"llm_adapters_math_v1 train set: .*or give a \.jsonl path to --data$"):
        resolve_sft_data("llm_adapters_math_v1")

"""The benchmark data shipped in the package: equal to the tests' reference copy, documented, reproducible, packaged.

../shared/data (beside the checkout) is the reference copy the shipped files were made from; the first test
compares them row for row and is skipped only where that folder is absent. The others need nothing outside
the repository.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from arithmech.data.locate import SHIPPED_DATA
from arithmech.data.target_sets import WORD_PROBLEM_SETS
from arithmech.evaluate.benchmarks import benchmark, benchmark_names
from arithmech.finetune.sft_rows import KNOWN_TRAIN_SETS

ROOT = Path(__file__).resolve().parents[3]
SHARED = ROOT.parent / "shared" / "data"
SHIPPED = sorted(SHIPPED_DATA.glob("*/*.jsonl.gz"))
SETS = ("gsm8k", "svamp", "addsub", "singleeq", "llm_adapters_math_v1", "mmlu", "csqa")


def jsonl_rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.split("\n") if line.strip()]


def shipped_text(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode("utf-8")


def test_every_set_is_shipped() -> None:
    assert {p.parent.name for p in SHIPPED} == set(SETS)
    assert len(SHIPPED) == 10  # gsm8k test+train, svamp, addsub, singleeq, llm_adapters train+test, mmlu test+dev, csqa
    shipped = {f"{p.parent.name}/{p.name.removesuffix('.jsonl.gz')}" for p in SHIPPED}
    registry = [benchmark(name) for name in benchmark_names()]
    needed = {b.data for b in registry if b.data} | {b.exemplars for b in registry if b.exemplars}
    needed |= {f"{name}/test" for name in WORD_PROBLEM_SETS}  # transfer's targets (gsm8k's examples: train)
    needed |= {f"{folder}/train" for folder in KNOWN_TRAIN_SETS.values()}  # finetune's named training sets
    assert needed == shipped  # every set a command names by default, and nothing else


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"the reference copy {SHARED} is absent (a clone without ../shared)")
def test_shipped_files_equal_the_reference_copy_row_for_row() -> None:
    reference = sorted(SHARED.glob("*/*.jsonl"))
    assert [f"{p.parent.name}/{p.name}.gz" for p in reference] == [f"{p.parent.name}/{p.name}" for p in SHIPPED]
    for original, shipped in zip(reference, SHIPPED, strict=True):
        expected, got = jsonl_rows(original.read_text(encoding="utf-8")), jsonl_rows(shipped_text(shipped))
        assert len(got) == len(expected), shipped
        for number, (row, want) in enumerate(zip(got, expected, strict=True), 1):
            assert row == want, f"{shipped} row {number}"


@pytest.mark.parametrize("name", SETS)
def test_each_set_has_a_provenance_listing_its_files(name: str) -> None:
    """Source, licence and, per file, the row count and the sha256 of the decompressed JSONL (as recorded)."""
    text = (SHIPPED_DATA / name / "PROVENANCE.md").read_text(encoding="utf-8")
    assert "## Source and licence" in text and "## Cleaning and caveats" in text and " @ " in text
    assert "licence" in text.lower()
    for path in sorted((SHIPPED_DATA / name).glob("*.jsonl.gz")):
        data = gzip.decompress(path.read_bytes())
        rows = len(jsonl_rows(data.decode("utf-8")))
        assert f"| `{path.name}` | {rows:,} | `{hashlib.sha256(data).hexdigest()}` |" in text, path
    if name in ("addsub", "singleeq"):
        assert "**Licence: unclear.**" in text


def test_regenerating_gives_identical_bytes(tmp_path: Path) -> None:
    """scripts/ship_benchmark_data.py on the decompressed files writes the shipped bytes again (gzip mtime 0)."""
    spec = importlib.util.spec_from_file_location("ship", ROOT / "scripts" / "ship_benchmark_data.py")
    assert spec is not None and spec.loader is not None
    ship = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ship)
    source = tmp_path / "data"
    for path in SHIPPED[:3]:  # three suffice: the same code writes every file
        (source / path.parent.name).mkdir(parents=True, exist_ok=True)
        (source / path.parent.name / path.name.removesuffix(".gz")).write_bytes(gzip.decompress(path.read_bytes()))
    listing = ship.ship(source, tmp_path / "out")
    assert [name for name, _, _ in listing] == [f"{p.parent.name}/{p.name.removesuffix('.gz')}" for p in SHIPPED[:3]]
    for path in SHIPPED[:3]:
        assert (tmp_path / "out" / path.parent.name / path.name).read_bytes() == path.read_bytes(), path
    assert all(p.read_bytes()[4:8] == b"\0\0\0\0" for p in SHIPPED)  # gzip header mtime 0 everywhere


def test_package_data_globs_match_every_shipped_file() -> None:
    """What pyproject.toml puts in the wheel and sdist covers every data file and PROVENANCE.md."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["arithmech"]
    package = ROOT / "src" / "arithmech"
    packaged = {p for pattern in globs for p in package.glob(pattern)}
    files = {p for p in SHIPPED_DATA.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert files and files <= packaged, sorted(str(p) for p in files - packaged)


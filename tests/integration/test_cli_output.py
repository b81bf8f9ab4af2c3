"""What the commands print and record, checked against their own files (issue 22, items 8-15 and 17).

Each test runs a command on a tiny random-init model and compares its screen lines and metadata with the facts
they describe: the ablation it ran, the numbers and frequencies it used, the output folder it chose.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arithmech.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_heuristics_names_the_ablation_it_ran(tiny_model_dir, tmp_path: Path, capsys) -> None:
    out = tmp_path / "h"
    args = ["analyze", "heuristics", "--model", str(tiny_model_dir("llama")), "--operations", "addition",
            "--grid-size", "4", "--few-shot", "0", "--no-filter-correct", "--ks", "1", "--n-random", "1",
            "--ablations", "zero", "--out", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("addition"))
    assert "zero-ablated" in line and "mean-ablated" not in line and "nan" not in line, line


IDENTIFY = ["--keep-incorrect", "--formations", "equation", "--n-per-template", "2", "--quiet"]


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the tiny llama's folder, an identify run made with it, prompts kept even where it is wrong)."""
    model_dir = tiny_model_dir("llama")
    folder = tmp_path_factory.mktemp("identify") / "run"
    assert main(["identify", "--model", str(model_dir), *IDENTIFY, "--out", str(folder)]) == 0
    return model_dir, folder


def test_fourier_says_which_numbers_and_frequencies(run: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    model_dir, folder = run
    out = tmp_path / "f"
    assert main(["analyze", "fourier", "--from", str(folder), "--model", str(model_dir), "--numbers", "6",
                 "--cutoffs", "1", "--out", str(out), "--quiet"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    numbers = json.loads((out / "metadata.json").read_text())["numbers"]
    assert (numbers["count"], numbers["single_token_numbers"], numbers["max_frequency"]) == (6, 10, 3)
    assert "number index 0..5: 6 of the 10 single-token numbers" in text and "frequencies 0..3" in text, text
    assert "0..5 only" not in text
    strongest = [line for line in text.splitlines() if "strongest frequency" in line]
    assert len(strongest) == 2 and all("f = 0, the mean over the numbers, left out" in x for x in strongest), text

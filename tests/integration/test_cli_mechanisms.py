"""`arithmech mediate` and `arithmech neurons` end to end on a tiny model, and their bad inputs."""

from __future__ import annotations

from pathlib import Path

from arithmech.cli import main


def test_mediate_cli(tiny_model_dir, tmp_path: Path, capsys) -> None:
    out = tmp_path / "med"
    args = ["mediate", "--model", str(tiny_model_dir("gpt2")), "--n-pairs", "2", "--few-shot", "0", "--neuron-k", "3",
            "--out", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    stdout = capsys.readouterr().out
    assert "last-token median IE peaks" in stdout and "neuron overlap" in stdout
    for name in ("mediation_by_class.csv", "mediation_total.csv", "neuron_overlap.csv", "metadata.json"):
        assert (out / name).is_file(), name
    assert main(["mediate", "--model", str(tiny_model_dir("gpt2")), "--tasks", "addition,poetry", "--quiet"]) == 2
    assert "poetry" in capsys.readouterr().err


def test_neurons_cli(tiny_model_dir, tmp_path: Path, capsys) -> None:
    out = tmp_path / "neu"
    args = ["neurons", "--model", str(tiny_model_dir("llama")), "--operations", "addition,division", "--max-prompts",
            "2", "--no-filter-correct", "--top-neurons", "3", "--keep-sizes", "0,5", "--n-random", "1",
            "--lora-steps", "1", "--out", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    stdout = capsys.readouterr().out
    assert "addition" in stdout and "pruning (held-out prompts): keep 0" in stdout
    assert (out / "metadata.json").is_file() and (out / "pruning.png").is_file()
    assert main([*args[:-3], "--keep-sizes", "5,x", "--quiet"]) == 2
    assert "whole numbers" in capsys.readouterr().err

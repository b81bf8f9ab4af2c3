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


def test_knockout_of_given_components(run: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    """The README's `--components 14.2,18.5,mlp.19` works as written (k up to the components given), the random
    control draws as many heads and MLPs as the ranked set, and its spread is the sample sd (ddof 1)."""
    import csv
    import statistics

    model_dir, folder = run
    out = tmp_path / "k"
    assert main(["knockout", "--from", str(folder), "--model", str(model_dir), "--components", "1.2,0.1,mlp.1",
                 "--ablation", "zero", "--end-only", "--n-random", "3", "--out", str(out), "--quiet"]) == 0  # fmt: skip
    capsys.readouterr()
    rows = list(csv.DictReader((out / "knockout.csv").open()))
    assert sorted({int(r["k"]) for r in rows}) == [0, 1, 2, 3]
    for row in rows:
        if row["ranking"] == "random":
            names = row["components"].split()
            assert sum(n.startswith("mlp.") for n in names) == (1 if row["k"] == "3" else 0), row
    summary = {(r["prompt_set"], r["k"]): r for r in csv.DictReader((out / "knockout_summary.csv").open())}
    assert {prompt_set for prompt_set, _ in summary} == {"held_out", "in_sample"}
    for (prompt_set, k), row in summary.items():
        accuracy = [float(r["accuracy"]) for r in rows
                    if (r["prompt_set"], r["k"], r["ranking"]) == (prompt_set, k, "random")]  # fmt: skip
        assert len(accuracy) == 3
        assert float(row["random_accuracy_std"]) == pytest.approx(statistics.stdev(accuracy), abs=1e-6)
    one = tmp_path / "k1"
    assert main(["knockout", "--from", str(folder), "--model", str(model_dir), "--components", "1.2",
                 "--n-random", "1", "--out", str(one), "--quiet"]) == 0  # fmt: skip
    assert "± n/a (one draw)" in capsys.readouterr().out
    assert [r["random_accuracy_std"] for r in csv.DictReader((one / "knockout_summary.csv").open())] == ["", ""]


def test_identify_of_one_prompt_and_unfiltered_counts(tiny_model_dir, tmp_path: Path, capsys) -> None:
    """effect_std of one prompt is undefined (an empty cell, not 0); --keep-incorrect says the prompts were not
    filtered instead of "N prompts (of 0 answered correctly)"."""
    import csv

    out = tmp_path / "i"
    assert main(["identify", "--model", str(tiny_model_dir("llama")), *IDENTIFY, "--max-prompts", "1",
                 "--out", str(out)]) == 0  # fmt: skip
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("reference set"))
    counts = json.loads((out / "metadata.json").read_text())["counts"]
    checked = counts["pairs"] - counts["rejected_length_mismatch"]
    assert line.startswith(f"reference set: 1 prompt of {checked}, answered or not (--keep-incorrect); "
                           f"{counts['answered_correctly']} of the {checked} answered correctly"), line  # fmt: skip
    assert {r["effect_std"] for r in csv.DictReader((out / "effects.csv").open())} == {""}


def test_report_of_a_read_only_folder_or_a_file(run: tuple[Path, Path], tmp_path: Path, monkeypatch, capsys) -> None:
    import errno

    import arithmech.report.html as html

    _, folder = run
    assert main(["report", str(folder / "effects.csv")]) == 2
    said = capsys.readouterr().err
    assert "is a file, not a run folder" in said and f"arithmech report {folder}" in said, said

    def read_only(path: object, text: str) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(html, "atomic_write_text", read_only)
    assert main(["report", str(folder)]) == 2
    said = capsys.readouterr().err
    assert said.startswith("error: the report cannot be written") and "--out" in said and said.count("\n") == 1


def test_one_name_per_concept_and_names_in_messages(run: tuple[Path, Path], tiny_model_dir, capsys) -> None:
    """finetune takes --heads as attention does; a model mismatch names both models, not a checksum alone."""
    from arithmech.errors import ConfigError
    from arithmech.models.archs import spec_for_model_type
    from arithmech.models.load import ModelHandle
    from arithmech.models.view import ModelView
    from arithmech.stages.identify_run import read_identify_run

    from tiny_models import make_tiny_model, make_tiny_tokenizer

    _, folder = run
    assert main(["finetune", "--model", str(tiny_model_dir("llama")), "--heads", "99.0", "--quiet"]) == 2
    said = capsys.readouterr().err
    assert "No such option" not in said and "99" in said, said
    model = make_tiny_model("llama")
    source = {"model": "SmolLM2-135M-Instruct", "gguf_file": "x.gguf", "gguf_sha256": "ab" * 32}
    handle = ModelHandle(model, make_tiny_tokenizer(), ModelView(model, spec_for_model_type("llama")), source)
    mismatch = r"made with model \S*llama\d*, not the loaded SmolLM2-135M-Instruct \(GGUF sha256 abab"
    with pytest.raises(ConfigError, match=mismatch):
        read_identify_run(folder, handle)


def test_prompt_file_never_answered_advises_keep_incorrect(tiny_model_dir, tmp_path: Path, capsys) -> None:
    rows = [("3 + 4 = ", "7"), ("2 + 5 = ", "7"), ("1 + 1 = ", "2"), ("4 + 4 = ", "8")]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"reference": r, "counterfactual": r.replace("+", "@"), "answer": a}) + "\n"
                               for r, a in rows))  # fmt: skip
    args = ["identify", "--model", str(tiny_model_dir("llama")), "--prompts", str(prompts), "--quiet"]
    assert main([*args, "--out", str(tmp_path / "i")]) == 2
    said = capsys.readouterr().err
    assert "answered none" in said and "--keep-incorrect" in said and "--few-shot" not in said, said
    assert main([*args, "--keep-incorrect", "--out", str(tmp_path / "j")]) == 0


@pytest.mark.parametrize(
    ("stage", "few_shot"),
    [
        (["identify"], ["--few-shot", "12"]),
        (["analyze", "heuristics", "--operations", "addition"], ["--few-shot", "40"]),
    ],
)
def test_prompts_longer_than_the_context(
    tiny_model_dir, tmp_path: Path, capsys, stage: list[str], few_shot: list[str]
) -> None:
    """The tiny GPT-2 takes 128 positions (learned embeddings: a longer prompt would raise IndexError)."""
    assert main([*stage, "--model", str(tiny_model_dir("gpt2")), *few_shot, "--quiet",
                 "--out", str(tmp_path / "x")]) == 2  # fmt: skip
    said = capsys.readouterr().err.splitlines()[-1]
    assert said.startswith("error: the longest prompt has") and "more than the 128 positions" in said, said
    assert "--few-shot" in said


def test_warnings_of_slow_or_diverging_settings(tiny_model_dir, tmp_path: Path, caplog) -> None:
    """float16 on a CPU, a learning rate far out of range, and a training loss that rose are each warned about."""
    import logging

    from arithmech.finetune.train import diverged
    from arithmech.models.load import ModelConfig, load_model

    model_dir = str(tiny_model_dir("llama"))
    with caplog.at_level(logging.WARNING, logger="arithmech"):
        load_model(ModelConfig(model=model_dir, dtype="float16"))
    assert any("float16 on a CPU" in r.getMessage() for r in caplog.records)
    caplog.clear()
    args = ["finetune", "--model", model_dir, "--heads", "1.0", "--data", "arithmetic", "--max-samples", "4",
            "--batch-size", "2", "--micro-batch-size", "2", "--max-steps", "2", "--out", str(tmp_path / "f"),
            "--quiet"]  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="arithmech"):
        main([*args, "--lr", "1e6"])
    assert any("--lr 1e+06 is above 0.001" in r.getMessage() for r in caplog.records), caplog.text
    assert diverged([{"step": 1, "loss": 0.8}, {"step": 2, "loss": 10.8}])
    assert not diverged([{"step": 1, "loss": 0.8}, {"step": 2, "loss": 1.2}]) and not diverged([{"loss": 9.0}])


def test_default_folders_and_stand_alone_report(run: tuple[Path, Path], tmp_path: Path, monkeypatch, capsys) -> None:
    """knockout --from a run writes into the run (as attention does), so its report shows it done; a stage run
    without one writes runs/<stage>-<time>, and `report` reads that folder alone."""
    from arithmech.report.run_folder import DONE, open_run

    model_dir, folder = run
    monkeypatch.chdir(tmp_path)
    assert main(["knockout", "--from", str(folder), "--model", str(model_dir), "--components", "1.2",
                 "--n-random", "0", "--quiet"]) == 0  # fmt: skip
    assert (folder / "knockout" / "metadata.json").is_file()
    assert open_run(folder).stage("knockout").status == DONE
    assert main(["analyze", "heuristics", "--model", str(model_dir), "--operations", "addition", "--grid-size", "4",
                 "--few-shot", "0", "--no-filter-correct", "--ks", "1", "--n-random", "1", "--quiet"]) == 0  # fmt: skip
    (alone,) = (tmp_path / "runs").iterdir()
    assert alone.name.startswith("heuristics-")
    capsys.readouterr()
    assert main(["report", str(alone)]) == 0
    assert (alone / "report.html").is_file()
    opened = open_run(alone)
    assert opened.layout == "stage" and [s.name for s in opened.present()] == ["heuristics"]


def test_run_help_names_every_stage(capsys) -> None:
    from arithmech.pipeline import STAGES

    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    missing = [s.name for s in STAGES if f" {s.name}," not in text and f" {s.name}." not in text]
    assert not missing, text


def test_evaluate_records_the_delta_it_applied(tiny_model_dir, tmp_path: Path, capsys) -> None:
    model_dir = str(tiny_model_dir("llama"))
    tuned = tmp_path / "f"
    assert main(["finetune", "--model", model_dir, "--heads", "1.0", "--data", "arithmetic", "--max-samples", "4",
                 "--batch-size", "2", "--micro-batch-size", "2", "--max-steps", "1", "--out", str(tuned),
                 "--quiet"]) == 0  # fmt: skip
    out = tmp_path / "e"
    assert main(["evaluate", "--model", model_dir, "--delta", str(tuned), "--benchmarks", "arithmetic-addition",
                 "--limit", "4", "--out", str(out), "--quiet"]) == 0  # fmt: skip
    assert f"finetune delta of {tuned} applied" in capsys.readouterr().out
    delta = json.loads((out / "metadata.json").read_text())["delta"]
    assert delta["path"] == str(tuned.resolve()) and delta["method"] == "precise" and delta["tensors"] > 0


def test_rotary_positions_past_the_context_are_warned_about(caplog) -> None:
    """Rotary positions compute past the context (so they are not refused), but those positions are extrapolation."""
    import logging

    from arithmech.errors import ConfigError
    from arithmech.models.context import check_fits_context

    from tiny_models import make_tiny_model

    with caplog.at_level(logging.WARNING, logger="arithmech"):
        check_fits_context(make_tiny_model("llama"), 128)
        assert not caplog.records
        check_fits_context(make_tiny_model("llama"), 200)
    assert "200 tokens, more than the 128 positions the model was built for" in caplog.text
    with pytest.raises(ConfigError, match="200 tokens, more than the 128 positions the model takes"):
        check_fits_context(make_tiny_model("gpt2"), 200)

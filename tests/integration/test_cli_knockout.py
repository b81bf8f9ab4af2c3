"""`arithmech knockout` end to end on a tiny saved model, and its bad inputs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from arithmech.cli import main


@pytest.fixture(scope="module")
def identify_run(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    model = tiny_model_dir("llama")
    run = tmp_path_factory.mktemp("identify") / "run"
    args = [
        "identify",
        "--model",
        str(model),
        "--keep-incorrect",
        "--formations",
        "equation",
        "--n-per-template",
        "2",
        "--out",
        str(run),
        "--quiet",
    ]
    assert main(args) == 0
    return model, run


def test_knockout_from_run(identify_run: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    model, run = identify_run
    out = tmp_path / "ko"
    args = [
        "knockout",
        "--model",
        str(model),
        "--from",
        str(run),
        "--max-k",
        "4",
        "--n-random",
        "2",
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(args) == 0
    stdout = capsys.readouterr().out
    assert "effect-rank" in stdout and str(out) in stdout
    rows = list(csv.DictReader((out / "knockout.csv").open()))
    assert len(rows) == 1 + 3 * 3  # baseline + k in (1, 2, 4) x (effect + 2 random)
    ranked = [r["component"] for r in csv.DictReader((run / "effects.csv").open()) if r["kind"] == "head"]
    effects = {r["component"]: float(r["effect"]) for r in csv.DictReader((run / "effects.csv").open())}
    top = sorted(ranked, key=lambda name: effects[name])[:2]
    effect_k2 = next(r for r in rows if r["ranking"] == "effect" and r["k"] == "2")
    assert effect_k2["components"].split() == top
    summary = list(csv.DictReader((out / "knockout_summary.csv").open()))
    assert [int(r["k"]) for r in summary] == [1, 2, 4]
    assert (out / "knockout.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "metadata.json").read_text())["stage"] == "knockout"


def test_knockout_with_components(identify_run: tuple[Path, Path], tmp_path: Path) -> None:
    model, run = identify_run
    out = tmp_path / "ko"
    args = [
        "knockout",
        "--model",
        str(model),
        "--from",
        str(run),
        "--components",
        "1.0,mlp.2,0.3",
        "--max-k",
        "3",
        "--n-random",
        "1",
        "--ablation",
        "zero",
        "--end-only",
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(args) == 0
    rows = list(csv.DictReader((out / "knockout.csv").open()))
    assert next(r for r in rows if r["ranking"] == "effect" and r["k"] == "3")["components"] == "1.0 mlp.2 0.3"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--components", "9.0"], "does not exist"),
        (["--components", "1.0", "--max-k", "2"], "larger than"),
        (["--max-k", "1000"], "larger than"),
        (["--ablation", "shuffle"], "ablation"),
    ],
)
def test_knockout_bad_input(identify_run, tmp_path: Path, capsys, extra: list[str], expected: str) -> None:
    model, run = identify_run
    out = tmp_path / "ko"
    code = main(["knockout", "--model", str(model), "--from", str(run), *extra, "--out", str(out), "--quiet"])
    stderr = capsys.readouterr().err
    assert code == 2 and expected in stderr and "Traceback" not in stderr
    assert not (out / "metadata.json").exists()


def test_knockout_needs_a_source(tmp_path: Path, capsys) -> None:
    assert main(["knockout", "--out", str(tmp_path / "x")]) == 2
    assert "--from" in capsys.readouterr().err


def test_run_folder_of_another_model_is_refused(identify_run, tiny_model_dir, tmp_path: Path, capsys) -> None:
    _, run = identify_run
    other = tiny_model_dir("gpt2")
    assert main(["knockout", "--model", str(other), "--from", str(run), "--out", str(tmp_path / "x")]) == 2
    assert "was made with model" in capsys.readouterr().err


def test_unfinished_run_folder_is_refused(identify_run, tmp_path: Path, capsys) -> None:
    model, _ = identify_run
    (tmp_path / "half").mkdir()
    assert main(["knockout", "--model", str(model), "--from", str(tmp_path / "half")]) == 2
    assert "did not finish" in capsys.readouterr().err


def test_analyze_commands(identify_run, tmp_path: Path, capsys) -> None:
    model, run = identify_run
    assert (
        main(["analyze", "mlp", "--model", str(model), "--from", str(run), "--out", str(tmp_path / "mlp"), "--quiet"])
        == 0
    )
    assert (tmp_path / "mlp" / "mlp_cosines.csv").exists()
    assert (
        main(
            [
                "analyze",
                "attention",
                "--model",
                str(model),
                "--from",
                str(run),
                "--heads",
                "1.0,2.3",
                "--out",
                str(tmp_path / "att"),
                "--quiet",
            ]
        )
        == 0
    )
    stdout = capsys.readouterr().out
    assert "1.0" in stdout and "2.3" in stdout
    assert (tmp_path / "att" / "attention_roles.csv").exists()
    assert main(["analyze", "mlp", "--model", str(model), "--from", str(run), "--layers", "1,x"]) == 2
    assert "--layers" in capsys.readouterr().err


def test_transfer_command(identify_run, tmp_path: Path, capsys) -> None:
    model, run = identify_run
    out = tmp_path / "tr"
    args = [
        "transfer",
        "--model",
        str(model),
        "--from",
        str(run),
        "--targets",
        "addition,multiplication-qa",
        "--max-prompts",
        "4",
        "--n-random",
        "1",
        "--k",
        "2",
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(args) == 0, capsys.readouterr().err
    assert "-> addition" in capsys.readouterr().out
    rows = list(csv.DictReader((out / "transfer.csv").open()))
    assert [r["target"] for r in rows] == ["addition", "multiplication-qa"]
    assert (out / "metadata.json").exists()
    assert main(["transfer", "--model", str(model), "--from", str(run), "--targets", "poetry"]) == 2
    assert "poetry" in capsys.readouterr().err


def test_stages_score_a_stratified_sample_and_record_it(identify_run, tmp_path: Path) -> None:
    """The run's pairs are in template order (4 Equation templates x 2); 4 prompts must cover all 4 templates,
    not the first two, and every stage records which prompts it used."""
    model, run = identify_run
    pairs = [json.loads(line) for line in (run / "prompts.jsonl").read_text().splitlines()]
    templates = sorted({p["template_id"] for p in pairs})
    assert len(templates) == 4 and len(pairs) == 8
    common = ["--model", str(model), "--from", str(run), "--max-prompts", "4", "--quiet"]
    assert main(["knockout", *common, "--max-k", "1", "--n-random", "1", "--out", str(tmp_path / "ko")]) == 0
    assert main(["analyze", "attention", *common, "--heads", "1.0", "--out", str(tmp_path / "att")]) == 0
    assert main(["analyze", "mlp", *common, "--out", str(tmp_path / "mlp")]) == 0
    for stage in ("ko", "att", "mlp"):
        record = json.loads((tmp_path / stage / "metadata.json").read_text())["prompts"]
        assert record["per_template"] == dict.fromkeys(templates, 1), stage
        assert [pairs[i]["template_id"] for i in record["indices"]] == templates
    ablation = json.loads((tmp_path / "ko" / "metadata.json").read_text())["ablation"]
    assert ablation["min_group_size"] == 4 and set(ablation["groups"].values()) == {2}
    assert ablation["end_fallback_prompts"] == 8  # groups of 2 are too small: END mean over the whole set
    args = ["knockout", *common, "--max-k", "1", "--n-random", "1", "--min-group-size", "2", "--out",
            str(tmp_path / "ko2")]  # fmt: skip
    assert main(args) == 0
    assert json.loads((tmp_path / "ko2" / "metadata.json").read_text())["ablation"]["end_fallback_prompts"] == 0

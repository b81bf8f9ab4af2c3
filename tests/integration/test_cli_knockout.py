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


def _fact(pair: dict) -> tuple[str, int, int, int]:
    """The fact an addition query states, worked out here: its sum and sorted operands (3 + 5 is 5 + 3)."""
    assert pair["operation"] == "addition"
    a, b = int(pair["a"]), int(pair["b"])
    return ("sum", a + b, min(a, b), max(a, b))


def _read_prompts(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_knockout_from_run(identify_run: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    """Both curves are written, held out first; the held-out prompts share no prompt and no fact with the ranked
    ones, use the run's templates, and the counts in metadata.json are the files' own."""
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
    assert stdout.index("held-out, 8 prompts") < stdout.index("in-sample, 8 prompts")
    rows = list(csv.DictReader((out / "knockout.csv").open()))
    per_set = 1 + 3 * 3  # baseline + k in (1, 2, 4) x (effect + 2 random)
    assert [r["prompt_set"] for r in rows] == ["held_out"] * per_set + ["in_sample"] * per_set
    ranked = [r["component"] for r in csv.DictReader((run / "effects.csv").open()) if r["kind"] == "head"]
    effects = {r["component"]: float(r["effect"]) for r in csv.DictReader((run / "effects.csv").open())}
    top = sorted(ranked, key=lambda name: effects[name])[:2]
    for prompt_set in ("held_out", "in_sample"):
        effect_k2 = next(r for r in rows if (r["prompt_set"], r["ranking"], r["k"]) == (prompt_set, "effect", "2"))
        assert effect_k2["components"].split() == top
    draws = [[r["components"] for r in rows if r["prompt_set"] == s and r["ranking"] == "random"]
             for s in ("held_out", "in_sample")]  # fmt: skip
    assert draws[0] == draws[1]  # the same random configurations on both sets
    summary = list(csv.DictReader((out / "knockout_summary.csv").open()))
    assert [(r["prompt_set"], int(r["k"])) for r in summary] == [
        (s, k) for s in ("held_out", "in_sample") for k in (1, 2, 4)
    ]
    assert (out / "knockout.png").read_bytes()[:4] == b"\x89PNG"
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["stage"] == "knockout" and list(meta["prompt_sets"]) == ["held_out", "in_sample"]
    ranked_prompts = _read_prompts(run / "prompts.jsonl")
    held, in_sample = _read_prompts(out / "prompts_held_out.jsonl"), _read_prompts(out / "prompts_in_sample.jsonl")
    assert in_sample == ranked_prompts and len(held) == len(ranked_prompts) == 8
    assert meta["counts"]["prompts"] == {"held_out": 8, "in_sample": 8}
    assert {r["reference"] for r in held}.isdisjoint(r["reference"] for r in ranked_prompts)
    assert {_fact(r) for r in held}.isdisjoint(_fact(r) for r in ranked_prompts)
    assert {r["template_id"] for r in held} == {r["template_id"] for r in ranked_prompts}
    record = meta["prompt_sets"]["held_out"]
    assert record["shared_with_ranked"] == {"prompts": 0, "facts": 0}
    assert record["ranked"]["facts"] == len({_fact(r) for r in ranked_prompts})
    assert record["facts"] == len({_fact(r) for r in held}) and record["file"] == "prompts_held_out.jsonl"
    assert record["ablation"]["prompts"] == 8  # the held-out means are over the held-out set itself
    assert meta["split"].startswith("held out")


def test_knockout_without_held_out(identify_run: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    model, run = identify_run
    out = tmp_path / "ko"
    args = ["knockout", "--model", str(model), "--from", str(run), "--max-k", "1", "--n-random", "1",
            "--no-held-out", "--out", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    assert {r["prompt_set"] for r in csv.DictReader((out / "knockout.csv").open())} == {"in_sample"}
    meta = json.loads((out / "metadata.json").read_text())
    assert list(meta["prompt_sets"]) == ["in_sample"] and meta["split"].startswith("in sample only")
    assert "held-out, " not in capsys.readouterr().out  # no held-out block


def test_no_fresh_fact_leaves_the_in_sample_curve_with_the_reason(tiny_model_dir, tmp_path: Path, capsys) -> None:
    """Operands 0-1 give three addition facts; a run that ranked on all of them leaves no held-out prompt: knockout
    scores the ranked prompts only and says why (stdout, metadata.json), not an error."""
    model = tiny_model_dir("llama")
    run = tmp_path / "run"
    args = ["identify", "--model", str(model), "--keep-incorrect", "--formations", "equation", "--operand-max", "1",
            "--n-per-template", "4", "--out", str(run), "--quiet"]  # fmt: skip
    assert main(args) == 0
    out = tmp_path / "ko"
    args = ["knockout", "--model", str(model), "--from", str(run), "--max-k", "1", "--n-random", "1", "--out",
            str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    stdout = capsys.readouterr().out
    assert "no held-out prompts (every candidate prompt states one of the 3 ranked facts" in stdout
    meta = json.loads((out / "metadata.json").read_text())
    assert list(meta["prompt_sets"]) == ["in_sample"] and "3 ranked facts" in meta["split"]
    assert {r["prompt_set"] for r in csv.DictReader((out / "knockout.csv").open())} == {"in_sample"}
    assert not (out / "prompts_held_out.jsonl").exists()


def test_components_without_a_run_have_no_split(tiny_model_dir, tmp_path: Path, monkeypatch, capsys) -> None:
    """--components without --from: nothing was ranked on prompts, so the one prompt set is "unranked", and
    metadata.json and stdout say there is no in-sample or held-out set."""
    import dataclasses

    from arithmech.stages import knockout as stage

    build = stage.build_reference_set
    monkeypatch.setattr(stage, "build_reference_set", lambda handle, cfg: build(  # the random model answers none
        handle, dataclasses.replace(cfg, filter_correct=False, formations=("equation",), n_per_template=2)))
    out = tmp_path / "ko"
    args = ["knockout", "--model", str(tiny_model_dir("llama")), "--components", "1.0,0.2", "--n-random", "1",
            "--out", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    stdout = capsys.readouterr().out
    assert "no prompt is in sample or held out" in stdout and "held-out, " not in stdout
    rows = list(csv.DictReader((out / "knockout.csv").open()))
    assert {r["prompt_set"] for r in rows} == {"unranked"} and len(rows) == 1 + 2 * 2
    meta = json.loads((out / "metadata.json").read_text())
    assert list(meta["prompt_sets"]) == ["unranked"] and "not ranked on prompts" in meta["split"]
    assert meta["counts"]["prompts"] == {"unranked": 8} and meta["identify_runs"] == []
    assert len(_read_prompts(out / "prompts_unranked.jsonl")) == 8


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
    knockout_sets = json.loads((tmp_path / "ko" / "metadata.json").read_text())["prompt_sets"]
    for stage in ("ko", "att", "mlp"):
        meta = json.loads((tmp_path / stage / "metadata.json").read_text())
        record = knockout_sets["in_sample"]["scored"] if stage == "ko" else meta["prompts"]
        assert record["per_template"] == dict.fromkeys(templates, 1), stage
        assert [pairs[i]["template_id"] for i in record["indices"]] == templates
    held = _read_prompts(tmp_path / "ko" / "prompts_held_out.jsonl")  # the held-out sample is stratified too
    assert knockout_sets["held_out"]["scored"]["per_template"] == dict.fromkeys(templates, 1)
    assert [held[i]["template_id"] for i in knockout_sets["held_out"]["scored"]["indices"]] == templates
    for record in knockout_sets.values():
        ablation = record["ablation"]
        assert ablation["min_group_size"] == 4 and set(ablation["groups"].values()) == {2}
        assert ablation["end_fallback_prompts"] == 8  # groups of 2 are too small: END mean over the whole set
    args = ["knockout", *common, "--max-k", "1", "--n-random", "1", "--min-group-size", "2", "--out",
            str(tmp_path / "ko2")]  # fmt: skip
    assert main(args) == 0
    sets = json.loads((tmp_path / "ko2" / "metadata.json").read_text())["prompt_sets"]
    assert [s["ablation"]["end_fallback_prompts"] for s in sets.values()] == [0, 0]

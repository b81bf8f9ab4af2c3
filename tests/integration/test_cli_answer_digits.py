"""`identify --answer-digits` and knockout of its run, end to end on a tiny saved model; the analyses that read one
answer token per prompt refuse such a run in one sentence, before a model loads."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from arithmech.cli import main

from tiny_models import TINY_ARCHS

PAIRS = [(27, 15), (21, 15), (95, 17), (3, 4), (40, 52), (38, 45)]  # answers of 2, 3 and 1 digits


def spans(a: int, b: int) -> dict[str, list[int]]:
    """Character spans of "9+1=10\n{a}+{b}=": the few-shot line, A, the operator, B."""
    start = len("9+1=10\n")
    op = start + len(str(a))
    return {"prefix": [0, start], "A": [start, op], "operator": [op, op + 1], "B": [op + 1, op + 1 + len(str(b))]}


def prompts_file(folder: Path) -> Path:
    rows = [{"reference": f"9+1=10\n{a}+{b}=", "counterfactual": f"9+1=10\n{a}&{b}=", "answer": str(a + b),
             "operation": "addition", "a": a, "b": b, "spans": spans(a, b)} for a, b in PAIRS]  # fmt: skip
    path = folder / "digits.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def digits_run(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(model folder, identify run of --answer-digits on every prompt, the tiny model's answers kept)."""
    model = tiny_model_dir("llama")
    folder = tmp_path_factory.mktemp("digits")
    out = folder / "identify"
    args = ["identify", "--model", str(model), "--prompts", str(prompts_file(folder)), "--answer-digits",
            "--keep-incorrect", "--out", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    return model, out


def test_identify_writes_effects_per_answer_place(digits_run) -> None:
    _, out = digits_run
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["answer_places"] == {"units": 6, "tens": 5, "hundreds": 1}  # 7 has one digit, 112 three
    assert metadata["counts"]["used"] == 6 and metadata["counts"]["scored_tokens"] == 12
    carry = metadata["carry_accuracy"]  # --keep-incorrect: every pair kept, whatever the tiny model answers
    assert {g: v["pairs"] for g, v in carry.items()} == {"carry": 3, "no carry": 3}
    assert len((out / "prompts.jsonl").read_text().splitlines()) == 6  # pairs, not rows
    by_place = read_csv(out / "effects_by_place.csv")
    overall = {r["component"]: float(r["effect"]) for r in read_csv(out / "effects.csv")}
    at = {(r["component"], r["place"]): (float(r["effect"]), int(r["prompts"])) for r in by_place
          if r["group"] == "all"}  # fmt: skip
    for component, effect in overall.items():  # effects.csv: the mean over every scored token
        parts = [at[(component, p)] for p in ("units", "tens", "hundreds")]
        assert effect == pytest.approx(sum(e * n for e, n in parts) / 12, rel=1e-5, abs=1e-7)
    groups = {(r["place"], r["group"]): int(r["prompts"]) for r in by_place}
    assert groups[("units", "carry")] == 3 and groups[("units", "no carry")] == 3  # 27+15, 95+17, 38+45 carry
    overlap = read_csv(out / "place_overlap.csv")
    assert [(r["place_a"], r["place_b"]) for r in overlap] == [("units", "tens"), ("units", "hundreds"),
                                                               ("tens", "hundreds")]  # fmt: skip
    for place in ("units", "tens", "hundreds"):
        assert (out / f"effects_heatmap_{place}.png").read_bytes()[:4] == b"\x89PNG"


def test_knockout_of_a_digits_run_scores_whole_answers_and_places(digits_run, tmp_path: Path, capsys) -> None:
    model, run = digits_run
    out = tmp_path / "knockout"
    args = ["knockout", "--from", str(run), "--model", str(model), "--max-k", "2", "--n-random", "1",
            "--min-group-size", "2", "--out", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "(whole answers, every token right)" in printed and "per answer digit with the top 2 out" in printed
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["answer_digits"] is True
    counts = metadata["counts"]
    assert counts["prompts"] == {"in_sample": 6} and counts["scored_tokens"] == {"in_sample": 12}
    assert "every candidate prompt states one of the 6 ranked facts" in metadata["split"]  # the file has no others
    rows = read_csv(out / "knockout_by_place.csv")
    cells = {(r["place"], r["group"], r["prompts"]) for r in rows}
    assert {(p, n) for p, g, n in cells if g == "all"} == {("answer", "6"), ("units", "6"), ("tens", "5"),
                                                            ("hundreds", "1")}  # fmt: skip
    assert ("answer", "carry", "3") in cells and ("units", "no carry", "3") in cells
    whole = {(r["k"], r["ranking"], r["seed"]): float(r["accuracy"]) for r in read_csv(out / "knockout.csv")}
    forced: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        if r["group"] == "all":
            forced.setdefault((r["k"], r["ranking"], r["seed"]), []).append(float(r["accuracy"]))
    for key, accuracy in whole.items():  # knockout.csv: whole answers, right only if each of their tokens is
        assert accuracy <= min(forced[key]) + 1e-9, key
        assert accuracy in forced[key]  # the "answer" row holds it
    summary = read_csv(out / "knockout_place_summary.csv")
    assert [r["place"] for r in summary if r["group"] == "all"][::2] == ["answer", "units", "tens", "hundreds"]
    assert (out / "knockout_tens.png").is_file()


def test_knockout_of_a_generated_digits_run_holds_out_facts(tiny_model_dir, tmp_path: Path) -> None:
    """A generated --answer-digits run (operands 10-99): the held-out prompts are generated with its settings (answers
    of several digits), share no fact with the ranked ones, and both sets are scored per answer place."""
    model = tiny_model_dir("llama")
    run = tmp_path / "identify"
    args = ["identify", "--model", str(model), "--answer-digits", "--operand-min", "10", "--operand-max", "99",
            "--formations", "equation", "--n-per-template", "2", "--keep-incorrect", "--out", str(run), "--quiet"]
    assert main(args) == 0
    out = tmp_path / "knockout"
    args = ["knockout", "--from", str(run), "--model", str(model), "--max-k", "1", "--n-random", "1",
            "--min-group-size", "2", "--out", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    ranked = [json.loads(line) for line in (run / "prompts.jsonl").read_text().splitlines()]
    held = [json.loads(line) for line in (out / "prompts_held_out.jsonl").read_text().splitlines()]

    def fact(row: dict) -> tuple[int, int, int]:
        a, b = int(row["a"]), int(row["b"])
        return a + b, min(a, b), max(a, b)

    assert len(held) == len(ranked) == 8 and {fact(r) for r in held}.isdisjoint(fact(r) for r in ranked)
    assert any(len(r["answer"]) > 1 for r in held)  # generated as the run was: answers of several digits
    metadata = json.loads((out / "metadata.json").read_text())
    tokens = metadata["counts"]["scored_tokens"]
    assert list(tokens) == ["held_out", "in_sample"]
    assert tokens["held_out"] == sum(len(r["answer"]) for r in held)  # a row per answer digit
    places = read_csv(out / "knockout_place_summary.csv")
    assert list(dict.fromkeys(r["prompt_set"] for r in places)) == ["held_out", "in_sample"]
    by_place = read_csv(out / "knockout_by_place.csv")
    units = {r["prompt_set"]: int(r["prompts"]) for r in by_place if (r["place"], r["group"]) == ("units", "all")}
    assert units == {"held_out": 8, "in_sample": 8}


def test_attention_of_a_digits_run_per_answer_place(digits_run, tmp_path: Path) -> None:
    model, run = digits_run
    out = tmp_path / "r" / "attention"
    args = ["analyze", "attention", "--from", str(run), "--model", str(model), "--heads", "0.1,1.2", "--out",
            str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    rows = read_csv(out / "attention_by_place.csv")
    assert [(r["head"], r["place"], r["prompts"]) for r in rows] == [
        (head, place, n) for place, n in (("units", "6"), ("tens", "5"), ("hundreds", "1")) for head in ("0.1", "1.2")
    ]
    for r in rows:
        masses = [float(r[k]) for k in ("A", "B", "operator", "prefix", "other")]
        assert sum(masses) == pytest.approx(1.0, abs=1e-5)
        # every operand here has one or two digits, so its last two tokens are all of it
        assert float(r["A[-2]"]) + float(r["A[-1]"]) == pytest.approx(float(r["A"]), abs=1e-5)
        assert float(r["B[-2]"]) + float(r["B[-1]"]) == pytest.approx(float(r["B"]), abs=1e-5)
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["answer_digits"] is True and metadata["counts"]["scored_tokens"] == 12
    assert main(["report", str(out.parent)]) == 0
    html = (out.parent / "report.html").read_text()
    assert "END attention on each operand token per answer place" in html and "A[-1]" in html


@pytest.mark.parametrize("command", ["mlp", "fourier"])
def test_analyses_of_one_answer_token_refuse_a_digits_run(digits_run, command: str, capsys) -> None:
    _, run = digits_run
    capsys.readouterr()
    assert main(["analyze", command, "--from", str(run), "--model", "/nonexistent/model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--answer-digits" in err[0] and "one answer token per prompt" in err[0], err


def test_a_run_config_with_answer_digits_and_the_mlp_lens_is_refused_first(tmp_path: Path, capsys) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"out": str(tmp_path / "r"), "model": {"model": "/nonexistent/model"},
                                      "stages": ["identify", "knockout", "mlp"],
                                      "identify": {"answer_digits": True}}))  # fmt: skip
    assert main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "identify.answer_digits" in err and "'mlp'" in err
    assert not (tmp_path / "r").exists()


def test_an_identify_folder_of_digits_refuses_the_mlp_lens_first(digits_run, tmp_path: Path, capsys) -> None:
    _, run = digits_run
    folder = tmp_path / "r"
    shutil.copytree(run, folder / "identify")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"out": str(folder), "model": {"model": "/nonexistent/model"},
                                      "stages": ["mlp"]}))  # fmt: skip
    capsys.readouterr()
    assert main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--answer-digits" in err[0] and "the stage 'mlp'" in err[0], err


def test_a_pipeline_with_answer_digits_runs_identify_and_knockout(tiny_model_dir, tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "out": str(tmp_path / "r"), "model": {"model": str(tiny_model_dir("llama"))},
        "stages": ["identify", "knockout"],
        "identify": {"answer_digits": True, "filter_correct": False, "formations": ["equation"],
                     "n_per_template": 6, "operand_min": 3},
        "knockout": {"max_k": 2, "n_random": 1, "max_prompts": 8, "min_group_size": 2},
    }))  # fmt: skip
    assert main(["run", "--config", str(config), "--quiet"]) == 0
    places = json.loads((tmp_path / "r" / "identify" / "metadata.json").read_text())["answer_places"]
    assert set(places) == {"units", "tens"}  # 3..9 + 3..9: answers 6..18, of one or two digits
    assert (tmp_path / "r" / "knockout" / "knockout_by_place.csv").is_file()
    assert main(["report", str(tmp_path / "r")]) == 0
    html = (tmp_path / "r" / "report.html").read_text()
    assert "the strongest head and MLP per answer place are the units digit" in html
    assert "Top 5 components per answer place and carry group" in html
    assert "<td>carry</td>" in html and "<td>no carry</td>" in html
    assert "Accuracy per answer place (teacher forced" in html and "effects_heatmap_tens" in html
    assert "Whole answers by carry group: carry" in html


@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_answer_digits_identify_knockout_and_attention_on_every_architecture(tiny_model_dir, tmp_path: Path, arch):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "out": str(tmp_path / "r"), "model": {"model": str(tiny_model_dir(arch))},
        "stages": ["identify", "knockout", "attention"],
        "identify": {"answer_digits": True, "filter_correct": False, "formations": ["equation"],
                     "n_per_template": 3, "operand_min": 3, "max_prompts": 8, "few_shot": 1},
        "knockout": {"max_k": 2, "n_random": 1, "max_prompts": 8, "min_group_size": 2},
        "attention": {"top_k": 2},
    }))  # fmt: skip
    assert main(["run", "--config", str(config), "--quiet"]) == 0
    run = tmp_path / "r"
    effects = read_csv(run / "identify" / "effects_by_place.csv")
    assert {r["place"] for r in effects} == {"units", "tens"}
    assert all(math.isfinite(float(r["effect"])) for r in effects)
    knocked = read_csv(run / "knockout" / "knockout_by_place.csv")
    assert {r["place"] for r in knocked} == {"answer", "units", "tens"}
    looked = read_csv(run / "attention" / "attention_by_place.csv")
    for r in looked:
        assert sum(float(r[k]) for k in ("A", "B", "operator", "prefix", "other")) == pytest.approx(1.0, abs=1e-4)

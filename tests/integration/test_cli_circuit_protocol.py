"""`arithmech circuit` on MIB's protocol, on a tiny saved model: the in-sample label wherever a number is, the random
baseline as a mean over seeds with its spread, and circuit files of other tools (object or boolean nodes)."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest

import arithmech.stages.circuit as circuit_stage
from arithmech.circuits.faithfulness import cmd, cpr
from arithmech.cli import main
from arithmech.report.html import write_report

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = ["--keep-incorrect", "--n-prompts", "4", "--percents", "1,10,100", "--batch-size", "4", "--quiet"]


def _rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.open()))


@pytest.fixture(scope="module")
def held_out(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """EAP beside the random ranking (3 seeds), evaluated on held-out pairs."""
    model = tiny_model_dir("llama")
    run = tmp_path_factory.mktemp("protocol") / "run" / "circuit"
    args = ["circuit", "--model", str(model), "--method", "eap", "--evaluate", "--compare-methods", "random", *SMALL]
    assert main([*args, "--out", str(run)]) == 0
    return model, run


def test_in_sample_is_said_in_every_table_figure_drawing_and_report(
    held_out, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _ = held_out
    titles: list[str] = []
    draw = circuit_stage.faithfulness_curves
    monkeypatch.setattr(circuit_stage, "faithfulness_curves",
                        lambda c, p, title: (titles.append(title), draw(c, p, title)))  # fmt: skip
    run = tmp_path / "run" / "circuit"
    args = ["circuit", "--model", str(model), "--method", "eap", "--evaluate", "--in-sample", *SMALL]
    assert main([*args, "--out", str(run)]) == 0
    assert {r["pairs"] for r in _rows(run / "faithfulness.csv")} == {"in-sample"}
    assert [r["pairs"] for r in _rows(run / "cpr_cmd.csv")] == ["in-sample"]
    assert "IN-SAMPLE" in titles[0] and "IN-SAMPLE" in (run / "circuit.svg").read_text()
    meta = json.loads((run / "metadata.json").read_text())
    assert meta["evaluation"]["pairs"] == "in-sample" and meta["counts"] == {"find_pairs": 4, "test_pairs": None}
    assert not (run / "test_prompts.jsonl").exists()
    report = write_report(tmp_path / "run").read_text()
    assert "evaluated IN-SAMPLE" in report and "4 in-sample pairs" in report


def test_held_out_is_said_in_every_table_figure_drawing_and_report(held_out) -> None:
    _, run = held_out
    assert {r["pairs"] for r in _rows(run / "faithfulness.csv")} == {"held-out"}
    assert {r["pairs"] for r in _rows(run / "cpr_cmd.csv")} == {"held-out"}
    assert "4 held-out pairs" in (run / "circuit.svg").read_text()
    report = write_report(run.parent).read_text()
    assert "evaluated on 4 held-out test pairs" in report and "IN-SAMPLE" not in report


def test_the_random_baseline_is_the_mean_of_its_seeds(held_out) -> None:
    """cpr_cmd.csv's random row: the mean CPR and CMD of the seeds' curves in faithfulness.csv, with their sd, min
    and max; its mean curve is the mean of the seeds' f at each size; the seeds draw different circuits."""
    _, run = held_out
    rows = [r for r in _rows(run / "faithfulness.csv") if r["method"] == "random"]
    assert {r["draw"] for r in rows} == {"mean", "seed 0", "seed 1", "seed 2"}

    def curve(draw: str, ranking: str) -> list[float]:
        """f at the swept sizes (CPR's and CMD's points), without the empty circuit's row (0 %, f = 0)."""
        return [float(r["f"]) for r in rows if r["draw"] == draw and r["ranking"] == ranking and float(r["percent"])]

    assert {float(r["f"]) for r in rows if float(r["percent"]) == 0} == {0.0}

    seeds = [f"seed {s}" for s in range(3)]
    percents = [1.0, 10.0, 100.0]
    cprs = [cpr(percents, curve(s, "signed")) for s in seeds]
    cmds = [cmd(percents, curve(s, "absolute")) for s in seeds]
    assert len({tuple(curve(s, "signed")) for s in seeds}) == 3  # three draws, not one seed thrice
    for ranking in ("signed", "absolute"):
        mean = [statistics.fmean(fs) for fs in zip(*(curve(s, ranking) for s in seeds), strict=True)]
        assert curve("mean", ranking) == pytest.approx(mean, abs=1e-6)
    [random] = [r for r in _rows(run / "cpr_cmd.csv") if r["method"] == "random"]
    assert random["seeds"] == "0 1 2"
    for name, values in (("cpr", cprs), ("cmd", cmds)):
        assert float(random[name]) == pytest.approx(statistics.fmean(values), abs=1e-6)
        assert float(random[f"{name}_sd"]) == pytest.approx(statistics.stdev(values), abs=1e-6)
        assert (float(random[f"{name}_min"]), float(random[f"{name}_max"])) == pytest.approx((min(values), max(values)))
    [eap] = [r for r in _rows(run / "cpr_cmd.csv") if r["method"] == "eap"]
    assert eap["seeds"] == eap["cpr_sd"] == "" and (eap["cpr_ranking"], eap["cmd_ranking"]) == ("signed", "absolute")


def _edges_file(source: Path, out: Path, *, bare_nodes: bool, keep_all: bool | None, scores: bool) -> Path:
    """source's edges.json rewritten as another tool might: nodes as bare booleans, every edge in (or none), the
    scores left out."""
    data = json.loads(source.read_text())
    if bare_nodes:
        data["nodes"] = {name: node["in_graph"] for name, node in data["nodes"].items()}
    for info in data["edges"].values():
        if keep_all is not None:
            info["in_graph"] = keep_all
        if not scores:
            del info["score"]
    out.write_text(json.dumps(data))
    return out


@pytest.mark.parametrize(("bare_nodes", "keep_all", "f"), [(False, True, 1.0), (True, False, 0.0)])
def test_a_circuit_file_without_scores_is_evaluated_on_the_test_pairs(
    held_out, tmp_path: Path, bare_nodes: bool, keep_all: bool, f: float
) -> None:
    """Every edge in: the whole model (f = 1); none: every edge ablated (f = 0); no scores, so no sweep."""
    model, run = held_out
    path = _edges_file(run / "edges.json", tmp_path / "c.json", bare_nodes=bare_nodes, keep_all=keep_all, scores=False)
    out = tmp_path / "run" / "circuit"
    assert main(["circuit", "--model", str(model), "--circuit-file", str(path), *SMALL, "--out", str(out)]) == 0
    [row] = _rows(out / "file_circuit.csv")
    assert float(row["f"]) == pytest.approx(f, abs=1e-4) and row["pairs"] == "held-out" and row["prompts"] == "4"
    assert int(row["edges"]) == (262 if keep_all else 0)
    assert not (out / "faithfulness.csv").exists() and not (out / "edges.json").exists()
    assert (out / "test_prompts.jsonl").read_text() == (run / "test_prompts.jsonl").read_text()  # the same test part
    report = write_report(tmp_path / "run").read_text()
    assert f"marks a circuit of {int(row['edges'])} edges" in report and "on 4 held-out pairs it keeps f = " in report


def test_a_scored_circuit_file_is_swept_by_its_scores(held_out, tmp_path: Path) -> None:
    """This package's own edges.json as another tool's file: its marked circuit (the top 5 %) is evaluated, and its
    sweep equals the run's that wrote it (the same scores on the same test pairs)."""
    model, run = held_out
    out = tmp_path / "out"
    args = ["circuit", "--model", str(model), "--circuit-file", str(run / "edges.json"), *SMALL]
    assert main([*args, "--out", str(out)]) == 0
    [row] = _rows(out / "file_circuit.csv")
    assert int(row["edges"]) == int(0.05 * 262) and 0 < float(row["percent"]) < 6
    ours = [r for r in _rows(run / "faithfulness.csv") if r["method"] == "eap"]
    theirs = _rows(out / "faithfulness.csv")
    assert [r["method"] for r in theirs] == ["file"] * len(ours)
    assert [float(r["f"]) for r in theirs] == pytest.approx([float(r["f"]) for r in ours], abs=1e-5)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["file_circuit"]["f"] == pytest.approx(float(row["f"])) and meta["counts"]["find_pairs"] == 0


def test_a_circuit_file_of_another_graph_is_refused(held_out, tiny_model_dir, tmp_path: Path, capsys) -> None:
    _, run = held_out
    code = main(["circuit", "--model", str(tiny_model_dir("gpt2")), "--circuit-file", str(run / "edges.json"),
                 *SMALL, "--out", str(tmp_path / "x")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "was made for a model with" in err and "Traceback" not in err


@pytest.mark.parametrize("extra", [["--from", "somewhere"], ["--compare-methods", "random", "--evaluate"],
                                   ["--oracle", "3"], ["--in-sample"]])  # fmt: skip
def test_combinations_with_a_circuit_file_are_refused_before_the_model_loads(
    tmp_path: Path, capsys, extra: list[str]
) -> None:
    code = main(["circuit", "--model", str(tmp_path / "no-model"), "--circuit-file", str(tmp_path / "c.json"), *extra,
                 "--out", str(tmp_path / "x")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and f"so {extra[0]} (which scores edges here) does not apply" in err

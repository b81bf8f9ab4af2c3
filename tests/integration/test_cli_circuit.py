"""`arithmech circuit` end to end on a tiny saved model: scores on find pairs, the sweep on held-out test pairs,
reading a circuit back, bad input."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from arithmech.circuits.circuit_file import read_edges
from arithmech.circuits.graph import CircuitGraph
from arithmech.cli import main
from arithmech.data.io import read_prompt_file

FROM_SMALL = ["--percents", "1,10,100", "--batch-size", "2", "--quiet"]
"""A small run of a --from folder, which reuses its pairs (so takes no --n-prompts, --keep-incorrect)."""
SMALL = ["--keep-incorrect", "--n-prompts", "4", *FROM_SMALL]


@pytest.fixture(scope="module")
def circuit_run(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    model = tiny_model_dir("llama")
    run = tmp_path_factory.mktemp("circuit") / "run"
    args = ["circuit", "--model", str(model), "--method", "eap", "--evaluate", "--oracle", "3", *SMALL]
    assert main([*args, "--out", str(run)]) == 0
    return model, run


def test_circuit_writes_mib_files(circuit_run: tuple[Path, Path], capsys) -> None:
    _, run = circuit_run
    for name in ("edges.json", "prompts.jsonl", "test_prompts.jsonl", "faithfulness.csv", "cpr_cmd.csv",
                 "faithfulness.png", "metadata.json"):  # fmt: skip
        assert (run / name).is_file(), name
    data = json.loads((run / "edges.json").read_text())
    graph = CircuitGraph(3, 4)  # the tiny llama: 3 layers, 4 query heads (2 kv heads)
    assert set(data["edges"]) == set(graph.edge_names)
    assert set(data["nodes"]) == set(graph.node_names)
    assert all(set(node) == {"in_graph"} for node in data["nodes"].values())  # MIB: node name -> {"in_graph": bool}
    assert data["cfg"] == {"n_layers": 3, "n_heads": 4, "parallel_attn_mlp": False, "d_model": 64}
    rows = list(csv.DictReader((run / "faithfulness.csv").open()))
    assert [(r["ranking"], r["percent"]) for r in rows][:4] == [
        ("signed", "0.0"),  # the empty circuit (issue 34.9)
        ("signed", "1.0"),
        ("signed", "10.0"),
        ("signed", "100.0"),
    ]
    assert {r["pairs"] for r in rows} == {"held-out"}
    full = [float(r["f"]) for r in rows if r["percent"] == "100.0"]
    assert full == pytest.approx([1.0, 1.0], abs=1e-5)
    summary = next(csv.DictReader((run / "cpr_cmd.csv").open()))
    assert summary["method"] == "eap" and summary["prompts"] == "4" and summary["pairs"] == "held-out"
    assert (summary["cpr_ranking"], summary["cmd_ranking"]) == ("signed", "absolute")
    meta = json.loads((run / "metadata.json").read_text())
    assert meta["counts"] == {"find_pairs": 4, "test_pairs": 4} and meta["evaluation"]["pairs"] == "held-out"
    assert meta["oracle"]["pairs"] == "find"


def test_the_curve_starts_at_the_empty_circuit(circuit_run: tuple[Path, Path]) -> None:
    """Issue 34.9: faithfulness.csv holds the 0 % row of each ranking (no edge, f = 0, m = m(empty))."""
    _, run = circuit_run
    rows = list(csv.DictReader((run / "faithfulness.csv").open()))
    summary = next(csv.DictReader((run / "cpr_cmd.csv").open()))
    empty = [r for r in rows if float(r["percent"]) == 0]
    assert [r["ranking"] for r in empty] == ["signed", "absolute"]
    for row in empty:
        assert (row["edges"], float(row["f"])) == ("0", 0.0)
        assert float(row["m"]) == pytest.approx(float(summary["m_empty"]))


def test_in_graph_ranking_is_recorded_and_chosen(circuit_run: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    """Issue 34.8: edges.json's in_graph circuit is the top 5 % by signed score unless --circuit-ranking absolute;
    the help and metadata.json say which."""
    model, run = circuit_run
    meta = json.loads((run / "metadata.json").read_text())
    assert meta["in_graph"] == {"percent": 5.0, "ranking": "signed", "edges": 13,
                                "rule": "the top 5 % of edges by signed score"}  # fmt: skip
    stored = read_edges(run / "edges.json")
    graph = stored.graph()
    values = graph.to_edges(stored.scores)
    by_abs = set(torch.sort(values.abs(), descending=True, stable=True).indices[:13].tolist())
    by_signed = set(torch.sort(values, descending=True, stable=True).indices[:13].tolist())
    assert by_abs != by_signed  # the tiny model has strong negative edges: the choice matters
    assert {i for i, kept in enumerate(graph.to_edges(stored.in_graph).tolist()) if kept} == by_signed
    out = tmp_path / "absolute"
    args = ["circuit", "--model", str(model), "--from", str(run), "--circuit-ranking", "absolute", *FROM_SMALL]
    assert main([*args, "--out", str(out)]) == 0
    again = read_edges(out / "edges.json")
    assert {i for i, kept in enumerate(graph.to_edges(again.in_graph).tolist()) if kept} == by_abs
    assert json.loads((out / "metadata.json").read_text())["in_graph"]["ranking"] == "absolute"
    capsys.readouterr()
    assert main(["circuit", "--help"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "--circuit-ranking" in said and "signed (the top edges by score, CPR's ranking" in said


def test_find_and_test_pairs_share_no_prompt(circuit_run: tuple[Path, Path]) -> None:
    _, run = circuit_run
    find, test = (read_prompt_file(run / name) for name in ("prompts.jsonl", "test_prompts.jsonl"))
    prompts = [{text for p in pairs for text in (p.reference, p.counterfactual)} for pairs in (find, test)]
    assert len(find) == len(test) == 4 and not prompts[0] & prompts[1]


def test_oracle_scores_top_and_random_edges(circuit_run: tuple[Path, Path]) -> None:
    _, run = circuit_run
    rows = list(csv.DictReader((run / "oracle.csv").open()))
    assert [r["chosen"] for r in rows] == ["top"] * 3 + ["random"] * 3
    agreement = json.loads((run / "metadata.json").read_text())["oracle"]
    assert agreement["edges"] == 6 and -1 <= agreement["spearman"] <= 1


def test_edges_json_reads_back(circuit_run: tuple[Path, Path]) -> None:
    _, run = circuit_run
    stored = read_edges(run / "edges.json")
    data = json.loads((run / "edges.json").read_text())
    graph = stored.graph()
    name = graph.edge_names[5]
    receiver, sender = graph.parse_edge(name)
    assert float(stored.scores[receiver, sender]) == pytest.approx(data["edges"][name]["score"])
    kept = sum(info["in_graph"] for info in data["edges"].values())
    assert int(stored.in_graph.sum()) == kept == int(0.05 * graph.n_edges)


def test_evaluate_from_a_circuit_folder_repeats_the_sweep(circuit_run: tuple[Path, Path], tmp_path: Path) -> None:
    model, run = circuit_run
    again = tmp_path / "again"
    args = ["circuit", "--model", str(model), "--from", str(run), "--evaluate", "--compare", str(run), *FROM_SMALL]
    assert main([*args, "--out", str(again)]) == 0
    assert (again / "faithfulness.png").is_file()
    first = list(csv.DictReader((run / "faithfulness.csv").open()))
    second = list(csv.DictReader((again / "faithfulness.csv").open()))
    assert [r["method"] for r in second] == ["eap"] * len(first)
    f1, f2 = (torch.tensor([float(r["f"]) for r in rows]) for rows in (first, second))
    torch.testing.assert_close(f1, f2, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--method", "acdc"], "method 'acdc' is not one of"),
        (["--percents", "0,10"], "outside (0, 100]"),
        (["--circuit-percent", "150"], "outside (0, 100]"),
        (["--operations", "division"], "have no MIB prompts"),
        (["--compare", "/no/such/folder"], "holds no faithfulness.csv"),
        (["--oracle", "-1"], "oracle must be 0"),
        (["--random-seeds", "0"], "random_seeds must be at least 1"),
        (["--test-prompts", "0"], "test_prompts must be at least 1"),
        (["--in-sample", "--test-prompts", "4"], "--in-sample evaluates on the pairs"),
        (["--mib-dataset", "x", "--mib-eval-split", "train"], "are both 'train'"),
        (["--from", "x", "--method", "random"], "--from evaluates the edge scores and find and test pairs of its "
                                                "folder, so --method would not be used; leave it out"),  # issue 34.5
        (["--from", "x", "--n-prompts", "8", "--keep-incorrect"], "so --n-prompts, --keep-incorrect would not be used"),
        (["--circuit-file", "x", "--method", "eap"], "--circuit-file evaluates the circuit of the file, so --method"),
        (["--method", "nosuch"], "method 'nosuch' is not one of"),
        (["--n-prompts", "100000"], "--n-prompts 100000 asks 100000 addition pairs of the find part, but with "
                                    "operands 0..99 it holds 4,917 different addition prompts, so at most 2,458 "
                                    "pairs"),  # issue 34.4
        (["--max-operand", "9"], "--n-prompts 32 asks 32 addition pairs of the find part, but with operands 0..9"),
        (["--test-prompts", "3000"], "--test-prompts 3000 asks 3000 addition pairs of the test part"),
        (["--in-sample", "--n-prompts", "6000", "--operations", "addition,subtraction"],
         "--n-prompts 6000 asks 3000 subtraction pairs (in-sample: every fact), but with operands 0..99 it holds "
         "5,050 different subtraction prompts, so at most 2,525 pairs"),
        (["--percents", ""], "percents is empty; give the circuit sizes"),  # issue 34.13
        (["--percents", " , "], "percents is empty; give the circuit sizes"),
    ],
)
def test_bad_input_is_refused_before_the_model_loads(tmp_path: Path, capsys, extra: list[str], expected: str) -> None:
    missing_model = str(tmp_path / "no-such-model")  # loading it would fail with another message
    code = main(["circuit", "--model", missing_model, *extra, "--out", str(tmp_path / "x"), "--quiet"])
    stderr = capsys.readouterr().err
    assert code == 2 and expected in stderr and "Traceback" not in stderr
    assert not (tmp_path / "x").exists()  # nothing made, not even a folder holding only the lock


def test_circuit_file_of_another_model_is_refused(circuit_run, tiny_model_dir, tmp_path: Path, capsys) -> None:
    _, run = circuit_run
    other = tiny_model_dir("gpt2")
    code = main(["circuit", "--model", str(other), "--from", str(run), "--out", str(tmp_path / "x"), "--quiet"])
    assert code == 2 and "was made for a model with" in capsys.readouterr().err


def test_from_a_folder_without_edges_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    code = main(["circuit", "--from", str(tmp_path / "empty"), "--out", str(tmp_path / "x"), "--quiet"])
    assert code == 2 and "holds no edges.json" in capsys.readouterr().err


def test_identify_ranking_as_a_circuit(circuit_run, tmp_path: Path) -> None:
    model, _ = circuit_run
    identify = tmp_path / "identify"
    args = ["identify", "--model", str(model), "--keep-incorrect", "--formations", "equation", "--n-per-template", "2"]
    assert main([*args, "--out", str(identify), "--quiet"]) == 0
    out = tmp_path / "pp"
    args = ["circuit", "--model", str(model), "--method", "path-patching", "--identify", str(identify)]
    assert main([*args, "--evaluate", *SMALL, "--out", str(out)]) == 0
    summary = next(csv.DictReader((out / "cpr_cmd.csv").open()))
    assert summary["method"] == "path-patching"
    stored = read_edges(out / "edges.json")
    assert stored.fully_scored and stored.graph().to_edges(stored.scores).abs().max() > 0


def test_path_patching_needs_an_identify_run(tmp_path: Path, capsys) -> None:
    code = main(["circuit", "--method", "path-patching", "--out", str(tmp_path / "x"), "--quiet"])
    assert code == 2 and "--identify" in capsys.readouterr().err


def test_draw_a_chosen_size_from_a_circuit_folder(circuit_run, tmp_path: Path) -> None:
    """--draw-percent 10 on the tiny llama's 262 edges: the 26 edges of the largest signed scores, one path each."""
    from xml.etree import ElementTree

    model, run = circuit_run
    out = tmp_path / "drawn"
    assert main(["circuit", "--model", str(model), "--from", str(run), "--draw-percent", "10", *FROM_SMALL,
                 "--out", str(out)]) == 0  # fmt: skip
    paths = [p for p in ElementTree.parse(out / "circuit.svg").getroot().iter("{http://www.w3.org/2000/svg}path")
             if p.get("class") == "edge"]  # fmt: skip
    stored = read_edges(run / "edges.json")
    graph = stored.graph()
    top = torch.sort(graph.to_edges(stored.scores), descending=True, stable=True).indices[:26].tolist()
    titles = {p.find("{http://www.w3.org/2000/svg}title").text.split(": score")[0] for p in paths}  # type: ignore[union-attr]
    assert titles == {graph.edge_names[i] for i in top}


def test_a_folder_made_before_held_out_evaluation(circuit_run, tmp_path: Path, capsys) -> None:
    """A folder without test_prompts.jsonl (as every folder written before this split) is refused for evaluation in
    one sentence; --in-sample evaluates it on its own pairs, and says so."""
    model, run = circuit_run
    old = tmp_path / "old"
    shutil.copytree(run, old)
    (old / "test_prompts.jsonl").unlink()
    args = ["circuit", "--model", str(tmp_path / "no-such-model"), "--from", str(old), "--evaluate", *FROM_SMALL]
    assert main([*args, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "holds no held-out pairs" in err and "--in-sample" in err and "Traceback" not in err
    again = tmp_path / "in-sample"
    args = ["circuit", "--model", str(model), "--from", str(old), "--evaluate", "--in-sample", *FROM_SMALL]
    assert main([*args, "--out", str(again)]) == 0
    assert {r["pairs"] for r in csv.DictReader((again / "faithfulness.csv").open())} == {"in-sample"}
    assert not (again / "test_prompts.jsonl").exists()

"""`arithmech run` with the circuit stage: EAP-IG beside identify's node ranking and a random one, on tiny models
of several architectures; an unchanged rerun keeps it, a changed setting reruns it alone; the report shows it."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from xml.etree import ElementTree

import pytest
import yaml

from arithmech.cli import main
from arithmech.errors import ConfigError
from arithmech.pipeline import load_run_config, run_pipeline
from arithmech.report.html import write_report

pytestmark = pytest.mark.usefixtures("one_thread")

IDENTIFY = {"filter_correct": False, "formations": ["equation"], "n_per_template": 2}
CIRCUIT = {"keep_incorrect": True, "n_prompts": 2, "percents": [1, 10, 100], "batch_size": 2, "steps": 2,
           "evaluate": True, "compare_methods": ["path-patching", "random"]}  # fmt: skip


def _run(tmp_path: Path, model: Path, stages: list[str], **circuit: object) -> tuple[Path, Path]:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"out": str(tmp_path / "run"), "model": {"model": str(model)}, "stages": stages,
                                      "identify": IDENTIFY, "circuit": {**CIRCUIT, **circuit}}))  # fmt: skip
    return config, tmp_path / "run"


@pytest.mark.parametrize("arch", ["llama", "gpt-neox", "gpt2"])  # grouped kv heads; parallel blocks; Conv1D, biases
def test_run_with_a_circuit_stage_then_rerun(arch: str, tiny_model_dir, tmp_path: Path, capsys) -> None:
    config, run = _run(tmp_path, tiny_model_dir(arch), ["identify", "circuit"])
    assert main(["run", "--config", str(config), "--quiet"]) == 0
    folder = run / "circuit"
    summary = list(csv.DictReader((folder / "cpr_cmd.csv").open()))
    assert [r["method"] for r in summary] == ["eap-ig", "path-patching", "random"]
    faithful = list(csv.DictReader((folder / "faithfulness.csv").open()))
    assert {r["method"] for r in faithful} == {"eap-ig", "path-patching", "random"}
    assert all(float(r["f"]) == pytest.approx(1.0, abs=1e-4) for r in faithful if r["percent"] == "100.0")
    meta = json.loads((folder / "metadata.json").read_text())
    [read] = meta["identify_runs"]
    assert read["path"] == str((run / "identify").resolve())  # the run's own identify folder
    assert meta["counts"] == {"find_pairs": 2, "test_pairs": 2} and meta["evaluation"]["pairs"] == "held-out"
    assert meta["config"]["identify_run"] == str(run / "identify")
    random = next(r for r in summary if r["method"] == "random")
    assert random["seeds"] == "0 1 2" and float(random["cpr_min"]) <= float(random["cpr"]) <= float(random["cpr_max"])
    root = ElementTree.parse(folder / "circuit.svg").getroot()
    drawn = [p for p in root.iter("{http://www.w3.org/2000/svg}path") if p.get("class") == "edge"]
    assert len(drawn) == meta["drawing"]["edges"] > 0
    record = json.loads((run / "pipeline.json").read_text())["stages"]
    assert set(record) == {"identify", "circuit"}
    stamp = (folder / "metadata.json").stat().st_mtime_ns
    capsys.readouterr()

    assert main(["run", "--config", str(config), "--quiet"]) == 0  # nothing changed: nothing recomputed
    assert capsys.readouterr().out.count("kept (unchanged)") == 2
    assert (folder / "metadata.json").stat().st_mtime_ns == stamp

    assert main(["run", "--config", str(config), "--set", "circuit.draw_percent=1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "identify   kept (unchanged)" in out and "circuit    done" in out
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["drawing"]["edges"] == max(1, int(meta["graph"]["n_edges"] / 100))


def test_the_report_shows_the_circuit(tiny_model_dir, tmp_path: Path) -> None:
    config, run = _run(tmp_path, tiny_model_dir("llama"), ["identify", "circuit"])
    assert main(["run", "--config", str(config), "--quiet"]) == 0
    text = write_report(run).read_text()
    section = text[text.index('<section id="circuit">') :]
    section = section[: section.index("</section>")]
    assert '<span class="status done">' in section
    assert "fig-circuit-faithfulness-img" in section  # the curves, one per ranking
    assert "ranked by EAP-IG on 2 find pairs" in section and "CPR" in section and "CMD" in section
    assert "evaluated on 2 held-out test pairs" in section
    drawing = section[section.index("<svg") : section.index("</svg>") + 6]
    edges = json.loads((run / "circuit" / "metadata.json").read_text())["drawing"]["edges"]
    assert drawing.count('<path class="edge"') == edges and drawing.count("&lt;q&gt;") + drawing.count("-&gt;") > 0
    assert "http://" not in text and "https://" not in text and "<script" not in text

    # circuit alone on this folder reads its identify run; identify settings that differ from it are refused
    cfg = load_run_config(config, {"stages": "circuit", "identify.n_per_template": 3})
    with pytest.raises(ConfigError, match="identify.n_per_template is 3 in this config, but"):
        run_pipeline(cfg, quiet=True)

    # identify run again, circuit not: the circuit read another identify run, and the report says so
    assert main(["run", "--config", str(config), "--stages", "identify", "--set", "identify.n_per_template=3"]) == 0
    text = write_report(run).read_text()
    assert '<section id="circuit"><h2>Edge-level circuit, scored by faithfulness (MIB)<span class="status ' \
           'unfinished">stale</span>' in text  # fmt: skip
    assert main(["run", "--config", str(config), "--quiet"]) == 0  # reruns circuit on the new identify run

    svg = run / "circuit" / "circuit.svg"  # a drawing that is not arithmech's is not put into the page
    svg.write_text(svg.read_text().replace("</svg>", '<script>alert(1)</script></svg>'))
    text = write_report(run).read_text()
    assert "<script" not in text and "circuit.svg holds a script" in text


def test_the_circuit_stage_reads_identify_only_for_the_node_ranking(tiny_model_dir, tmp_path: Path) -> None:
    model = tiny_model_dir("llama")
    cfg = load_run_config(_run(tmp_path, model, ["circuit"])[0])
    with pytest.raises(ConfigError, match="reads the 'identify' stage's results; add it to stages"):
        run_pipeline(cfg, quiet=True)
    cfg = load_run_config(_run(tmp_path, model, ["circuit"], compare_methods=[])[0])  # EAP-IG alone: no identify
    run_pipeline(cfg, quiet=True)
    assert (tmp_path / "run" / "circuit" / "circuit.svg").is_file()
    assert not (tmp_path / "run" / "identify").exists()
    meta = json.loads((tmp_path / "run" / "circuit" / "metadata.json").read_text())
    assert meta["identify_runs"] == [] and meta["config"]["identify_run"] is None


@pytest.mark.parametrize(
    ("circuit", "message"),
    [
        ({"compare_methods": ["acdc"]}, "method 'acdc' is not one of"),
        ({"compare_methods": ["random"], "evaluate": False}, "give evaluate"),
        ({"compare_methods": ["eap-ig"]}, "repeats a method"),
        ({"draw_percent": 0}, "outside (0, 100]"),
    ],
)
def test_bad_circuit_settings_are_refused_when_the_config_loads(tmp_path: Path, circuit: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("]", r"\]")):
        load_run_config(_run(tmp_path, tmp_path / "no-model", ["identify", "circuit"], **circuit)[0])


def test_reading_from_known_numbers(tmp_path: Path) -> None:
    """The circuit section's reading quotes the files: rows dropped from the find and the test pairs, which pairs
    the circuits were evaluated on, CPR and CMD (random: mean ± sd over seeds), the smallest faithful circuit, what
    f above 1 means; a folder of before held-out evaluation reads as in-sample; a run without the stage says so."""
    folder = tmp_path / "run" / "circuit"
    folder.mkdir(parents=True)
    addition = {"source": "addition", "pairs": 20, "clean_missed": 5, "cf_missed": 6, "kept": 12,
                "prompts_drawn": 300, "prompts_answered": 40}  # fmt: skip
    test = {**addition, "pairs": 16, "kept": 10, "prompts_drawn": 280}
    meta = {"stage": "circuit", "config": {"method": "eap-ig", "ablation": "counterfactual"},
            "graph": {"n_edges": 123211, "n_layers": 30, "n_heads": 9}, "counts": {"find_pairs": 12, "test_pairs": 10},
            "evaluation": {"pairs": "held-out", "test": "built-in MIB prompts, test part"},
            "answer_filter": {"find": [addition], "test": [test]}}  # fmt: skip
    (folder / "metadata.json").write_text(json.dumps(meta))
    header = "method,pairs,prompts,cpr,cpr_ranking,cmd,cmd_ranking,m_full,m_empty,seeds,cpr_sd,cpr_min,cpr_max,cmd_sd"
    (folder / "cpr_cmd.csv").write_text(f"{header}\neap-ig,held-out,10,1.31,signed,0.08,absolute,2.04,1.08,,,,,\n"
                                        "path-patching,held-out,10,0.35,signed,0.45,absolute,2.04,1.08,,,,,\n"
                                        "random,held-out,10,0.12,signed,0.9,absolute,2.04,1.08,0 1 2,0.03,0.1,0.15,"
                                        "0.02\n")  # fmt: skip
    rows = ["method,pairs,ranking,draw,percent,edges,f,m"]
    for method, draw, fs in (("eap-ig", "", (0.5, 0.85, 1.4, 1.0)), ("path-patching", "", (0.1, 0.2, 0.5, 1.0)),
                             ("random", "mean", (0.0, 0.1, 0.2, 1.0)), ("random", "seed 1", (0.9, 0.9, 0.9, 1.0))):
        sizes = zip((0.1, 1.0, 10.0, 100.0), (123, 1232, 12321, 123211), fs, strict=True)
        rows += [f"{method},held-out,signed,{draw},{k},{n},{f},0" for k, n, f in sizes]
    (folder / "faithfulness.csv").write_text("\n".join(rows) + "\n")
    text = write_report(tmp_path / "run").read_text().replace("&#x27;", "'")
    assert ("ranked by EAP-IG on 12 find pairs in MIB's arithmetic format, kept where the model's top token is the "
            "answer on both prompts (find pairs, addition: the model answers 40 of 300 single prompts drawn (260 "
            "dropped); of the pairs made of them 12 of 20 pass (8 dropped: 5 missed on the clean prompt, 6 on the "
            "counterfactual); test pairs, addition: ") in text  # fmt: skip
    assert "evaluated on 10 held-out test pairs (built-in MIB prompts, test part), which share no prompt" in text
    assert "rescaled so that the whole model (2.04) is 1 and every edge patched from the counterfactual (1.08" in text
    assert ("EAP-IG CPR 1.31, CMD 0.08, smallest circuit with f &gt;= 0.8: 1 % (1,232 edges), path patching "
            "(identify's node ranking) CPR 0.35, CMD 0.45, smallest circuit with f &gt;= 0.8: 100 % (123,211 "
            "edges) and a random ranking (mean over seeds 0 1 2) CPR 0.12 ± 0.03 (3 seeds), CMD 0.90 ± 0.02 (3 "
            "seeds), smallest circuit with f &gt;= 0.8: 100 %") in text  # fmt: skip (seed 1's 0.9 at 0.1 % is not)
    assert "Faithfulness summary (10 held-out pairs; MIB's CPR over the signed ranking and CMD over the |score|" in text
    assert "f above 1 (EAP-IG) means a circuit pushes the answer harder than the whole model" in text
    assert "The highest CPR here is EAP-IG's." in text and "IN-SAMPLE" not in text

    old_meta = {**meta, "counts": {"prompts": 12}, "answer_filter": [addition]}  # written before held-out evaluation
    del old_meta["evaluation"]
    (folder / "metadata.json").write_text(json.dumps(old_meta))
    (folder / "cpr_cmd.csv").write_text("method,cpr,cmd,m_full,m_empty,prompts\neap-ig,1.31,0.08,2.04,1.08,12\n")
    (folder / "faithfulness.csv").write_text("method,ranking,percent,edges,f,m\neap-ig,signed,1.0,1232,0.85,0\n")
    text = write_report(tmp_path / "run").read_text().replace("&#x27;", "'")
    assert "The circuits are evaluated IN-SAMPLE, on the same pairs their edges were scored on" in text
    assert "Faithfulness summary (12 in-sample pairs" in text and "on 12 prompt pairs in MIB's arithmetic" in text
    assert "(find pairs, addition: the model answers 40" in text

    (folder / "metadata.json").unlink()
    (tmp_path / "run" / "identify").mkdir()  # a run folder without a finished circuit stage
    (tmp_path / "run" / "identify" / "metadata.json").write_text(json.dumps({"stage": "identify"}))
    shutil.rmtree(folder)
    text = write_report(tmp_path / "run").read_text()
    section = text[text.index('<section id="circuit">') :]
    assert "This stage was not run" in section[: section.index("</section>")] and "<svg" not in text

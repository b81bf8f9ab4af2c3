"""The top-level Python API (`import arithmech as am`): stages run from keyword settings, `am.open_run` gives the
run's tables as DataFrames equal to its CSV files, and neither importing arithmech nor reading tables loads torch."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import pytest

import arithmech as am
from arithmech.errors import ConfigError

from tiny_models import single_thread

SRC = str(Path(am.__file__).resolve().parents[1])
IDENTIFY = {"operations": ["addition"], "n_per_template": 2, "max_prompts": 8, "filter_correct": False,
            "fraction_threshold": 0.1}  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, object]:
    """identify + knockout through the API on the tiny Llama, in the layout of `arithmech run`."""
    out = tmp_path_factory.mktemp("api") / "run"
    with single_thread():
        model = am.load_model(str(tiny_model_dir("llama")), quiet=True)
        found = am.identify(model, out=out / "identify", quiet=True, **IDENTIFY)
        ko = am.knockout(model, from_run=found, out=out / "knockout", max_k=3, n_random=1, max_prompts=8, quiet=True)
    return out, found, ko


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _same(cell: str, value: object) -> bool:
    """A CSV cell and a DataFrame value hold the same number or text (an empty cell is a missing value)."""
    if cell == "":
        return value is None or value is am_na() or (isinstance(value, float) and math.isnan(value))
    try:
        return float(cell) == float(value)  # type: ignore[arg-type]
    except ValueError:
        return cell == str(value)


def am_na() -> object:
    import pandas as pd

    return pd.NA


def test_stages_run_and_open_run_tables_equal_the_csv_files(run_dir) -> None:
    out, found, ko = run_dir
    assert found.out_dir == out / "identify" and ko.out_dir == out / "knockout"
    run = am.open_run(out)
    assert run.status["identify"] == "done" and run.status["knockout"] == "done" and run.status["mlp"] == "not run"
    for table, path in ((run.identify.effects, out / "identify" / "effects.csv"),
                        (run.identify.template_accuracy, out / "identify" / "template_accuracy.csv"),
                        (run.knockout.curve, out / "knockout" / "knockout_summary.csv"),
                        (run.knockout.rows, out / "knockout" / "knockout.csv")):  # fmt: skip
        rows = _csv(path)
        assert list(table.columns) == list(rows[0]) and len(table) == len(rows), path.name
        for record, row in zip(table.to_dict("records"), rows, strict=True):
            assert all(_same(row[c], record[c]) for c in row), (path.name, row, record)
    # the numbers are the stage's own: identify's ranking and knockout's curve
    effects = run.identify.effects.set_index("component")["effect"]
    for ranked in found.key.ranked:
        assert effects[ranked.component.name] == pytest.approx(ranked.effect, rel=1e-6)
    assert str(run.identify.effects["head"].dtype) == "Int64"  # an MLP's empty head is missing, heads stay whole
    curve = run.knockout.curve
    assert list(zip(curve["prompt_set"], curve["k"], strict=True)) == [
        (s, k) for s in ("held_out", "in_sample") for k in (1, 2, 3)
    ]
    effect_rows = [r for r in ko.rows if r.ranking == "effect"]
    assert list(curve["effect_accuracy"]) == pytest.approx([r.accuracy for r in effect_rows], abs=1e-6)
    assert run.identify.key_components == json.loads((out / "identify" / "key_components.json").read_text())
    assert run.identify.metadata["stage"] == "identify"


def test_a_stage_not_run_and_a_bad_setting_are_one_sentence(run_dir, tiny_model_dir) -> None:
    out, found, _ = run_dir
    with pytest.raises(ConfigError, match="'mlp' not run"):
        am.open_run(out).mlp  # noqa: B018
    with pytest.raises(ConfigError, match="no setting 'max_prompt'.*max_prompts"):
        am.identify(object(), max_prompt=3, out=out / "bad")  # refused before the model is touched
    with pytest.raises(ConfigError, match="ablation"):
        am.knockout(object(), from_run=found, ablation="bogus", out=out / "bad")
    assert not (out / "bad").exists()


def test_report_and_pipeline_from_python(run_dir, tiny_model_dir, tmp_path: Path) -> None:
    out, _, _ = run_dir
    page = am.write_report(out, tmp_path / "report.html")
    assert page.is_file() and "knockout" in page.read_text()
    with single_thread():
        results = am.run(out=str(tmp_path / "piped"), model={"model": str(tiny_model_dir("llama"))},
                         stages=["identify"], identify=IDENTIFY, quiet=True)  # fmt: skip
    assert set(results) == {"identify"}
    assert len(am.open_run(tmp_path / "piped").identify.effects) == len(am.open_run(out).identify.effects)


def test_subpackages_do_not_hide_the_stage_functions() -> None:
    import importlib

    for name in ("knockout", "neurons", "evaluate", "finetune"):
        importlib.import_module(f"arithmech.{name}")  # the subpackage of the same name, imported
        assert isinstance(getattr(am, name), types.FunctionType), name
    assert set(am.__all__) - {"__version__"} <= set(dir(am))


def test_import_and_reading_tables_load_no_torch(run_dir) -> None:
    out, _, _ = run_dir
    script = (
        "import sys, json\n"
        "import arithmech as am\n"
        "after_import = sorted(m for m in ('torch', 'transformers', 'pandas') if m in sys.modules)\n"
        f"run = am.open_run({str(out)!r})\n"
        "n = len(run.identify.effects) + len(run.knockout.curve)\n"
        "print(json.dumps([after_import, sorted(m for m in ('torch', 'transformers') if m in sys.modules), n]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    after_import, after_tables, n = json.loads(done.stdout.splitlines()[-1])
    assert after_import == [] and after_tables == [] and n > 0


def test_circuit_from_python_and_its_tables(run_dir, tiny_model_dir) -> None:
    """am.circuit scores the edges beside identify's node ranking; open_run reads its sweep as DataFrames."""
    out, found, _ = run_dir
    with single_thread():
        model = am.load_model(str(tiny_model_dir("llama")), quiet=True)
        result = am.circuit(model, identify_run=found, out=out / "circuit", method="eap", n_prompts=4,
                            keep_incorrect=True, evaluate=True, compare_methods=["path-patching"],
                            quiet=True)  # fmt: skip
    assert result.out_dir == out / "circuit"
    run = am.open_run(out)
    assert run.status["circuit"] == "done"
    table = run.circuit.cpr_cmd
    rows = _csv(out / "circuit" / "cpr_cmd.csv")
    assert len(table) == len(rows) and set(table["method"]) == {"eap", "path-patching"}
    for record, row in zip(table.to_dict("records"), rows, strict=True):
        assert all(_same(row[c], record[c]) for c in row)
    full = run.circuit.faithfulness.query("percent == 100")
    assert full["f"].to_numpy() == pytest.approx(1.0, abs=1e-4)  # the whole graph is the model


def test_wrong_argument_types_are_one_sentence_at_the_door(tiny_model_dir, tmp_path: Path) -> None:
    """Issue 34.12: a name where a loaded model belongs, a number where a path belongs: one ConfigError each,
    before any folder is made; what is unambiguous (a str path, a string of percents) is converted."""
    out = tmp_path / "circuit"
    with pytest.raises(ConfigError, match=r"circuit\(\) takes a loaded model as its first argument, not str "
                                          r"'SmolLM2'; load it first \(model = am.load_model\('SmolLM2'\)\)"):
        am.circuit("SmolLM2", out=out)
    assert not out.exists()
    with pytest.raises(ConfigError, match="load_model's model takes text"):
        am.load_model(123)
    with pytest.raises(ConfigError, match="load_model's threads takes a whole number"):
        am.load_model(threads="4")
    model = am.load_model(str(tiny_model_dir("llama")), quiet=True)
    with pytest.raises(ConfigError, match="identify's out takes a path .*, not int 123"):
        am.identify(model, out=123)
    with pytest.raises(ConfigError, match="from_run takes an identify run"):
        am.knockout(model, from_run=5, out=tmp_path / "k")
    with pytest.raises(ConfigError, match="analyze_heuristics's quiet takes True or False"):
        am.analyze_heuristics(model, quiet="yes")
    with pytest.raises(ConfigError, match="open_run's run_dir takes a path"):
        am.open_run(5)
    with pytest.raises(ConfigError, match="write_report's run_dir takes a path"):
        am.write_report(None)
    with pytest.raises(ConfigError, match="percents is empty"):
        am.circuit(model, out=out, percents="")
    assert list(tmp_path.iterdir()) == []  # nothing was made or locked
    from arithmech.api import _config

    assert _config("circuit_config:CircuitConfig", "circuit", {"percents": "1,10,100"}).percents == (1.0, 10.0, 100.0)

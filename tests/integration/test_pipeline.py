"""`arithmech run`: stages into one run folder, unchanged stages kept, interrupted runs resumed, bad configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from arithmech import pipeline
from arithmech.cli import main
from arithmech.errors import ConfigError
from arithmech.pipeline import load_run_config, run_pipeline

SETTINGS = {
    "identify": {"filter_correct": False, "formations": ["equation"], "n_per_template": 2},
    "knockout": {"max_k": 2, "n_random": 1, "max_prompts": 4},
    "attention": {"max_prompts": 4},
    "agreement": {"methods": ["path", "attribution"], "max_prompts": 4},
}


def _config(tmp_path: Path, model: Path, **extra) -> Path:
    data = {"out": str(tmp_path / "run"), "model": {"model": str(model)},
            "stages": ["identify", "knockout", "attention", "agreement"], **SETTINGS, **extra}  # fmt: skip
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_run_keep_and_rerun_changed(tiny_model_dir, tmp_path: Path, capsys) -> None:
    model = tiny_model_dir("llama")
    config = _config(tmp_path, model)
    assert main(["run", "--config", str(config), "--quiet"]) == 0
    run = tmp_path / "run"
    for stage in ("identify", "knockout", "attention", "agreement"):
        assert (run / stage / "metadata.json").is_file(), stage
    record = json.loads((run / "pipeline.json").read_text())
    assert set(record["stages"]) == {"identify", "knockout", "attention", "agreement"}
    stamps = {s: (run / s / "metadata.json").stat().st_mtime_ns for s in record["stages"]}
    capsys.readouterr()

    assert main(["run", "--config", str(config), "--quiet"]) == 0  # nothing changed: nothing recomputed
    assert capsys.readouterr().out.count("kept (unchanged)") == 4
    assert {s: (run / s / "metadata.json").stat().st_mtime_ns for s in stamps} == stamps

    # a knockout setting changes: only knockout reruns; identify and its readers are kept
    assert main(["run", "--config", str(config), "--set", "knockout.max_k=1", "--quiet"]) == 0
    after = {s: (run / s / "metadata.json").stat().st_mtime_ns for s in stamps}
    assert after["knockout"] != stamps["knockout"]
    assert all(after[s] == stamps[s] for s in ("identify", "attention", "agreement"))
    knockout = json.loads((run / "knockout" / "metadata.json").read_text())
    assert knockout["config"]["max_k"] == 1 and knockout["config"]["from_run"] == str(run / "identify")


def test_interrupted_run_resumes_at_the_stage_that_stopped(tiny_model_dir, tmp_path: Path, monkeypatch) -> None:
    model = tiny_model_dir("llama")
    cfg = load_run_config(_config(tmp_path, model))
    stages = {s.name: s for s in pipeline.STAGES}

    def interrupted(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "STAGES", tuple(
        pipeline.Stage(s.name, s.config, interrupted, s.needs) if s.name == "attention" else s for s in stages.values()
    ))  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(cfg, quiet=True)
    record = json.loads((tmp_path / "run" / "pipeline.json").read_text())
    assert set(record["stages"]) == {"identify", "knockout"}

    monkeypatch.setattr(pipeline, "STAGES", tuple(stages.values()))
    results = run_pipeline(cfg, quiet=True)
    assert isinstance(results["identify"], Path) and isinstance(results["knockout"], Path)  # kept
    assert not isinstance(results["attention"], Path) and not isinstance(results["agreement"], Path)  # ran


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"knockout": {"max_kk": 3}}, "knockout has no setting 'max_kk'; did you mean 'max_k'?"),
        ({"knockot": {}}, "unknown config key 'knockot'; did you mean 'knockout'?"),
        ({"stages": ["identify", "knockoutt"]}, "unknown stage 'knockoutt'; did you mean 'knockout'?"),
        ({"model": {"modle": "x"}}, "model has no setting 'modle'; did you mean 'model'?"),
    ],
)
def test_bad_configs(tmp_path: Path, extra: dict, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"out": str(tmp_path / "r"), **extra}))
    with pytest.raises(ConfigError) as err:
        load_run_config(path)
    assert message in str(err.value)


def test_bad_config_files_on_the_command_line(tmp_path: Path, capsys) -> None:
    assert main(["run", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("identify: [unclosed\n")
    assert main(["run", "--config", str(broken)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert main(["run", "--set", "nonsense", "--stages", "identify"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_a_stage_needs_its_inputs(tiny_model_dir, tmp_path: Path) -> None:
    cfg = load_run_config(None, {"out": str(tmp_path / "r"), "stages": "knockout"})
    with pytest.raises(ConfigError, match="reads the 'identify' stage's results"):
        run_pipeline(cfg, quiet=True, handle=object())


@pytest.mark.parametrize("name", ["default-model.yaml", "llama2-7b-gpus.yaml"])
def test_shipped_configs_are_valid(name: str) -> None:
    cfg = load_run_config(Path(__file__).parents[2] / "configs" / name)
    assert cfg.stages and set(cfg.stages) == set(cfg.settings)


def test_finetune_then_evaluate_in_one_run(tiny_model_dir, tmp_path: Path) -> None:
    """finetune trains a copy (the base model is untouched for later stages); evaluate scores base and tuned."""
    model = tiny_model_dir("llama")
    data = tmp_path / "train.jsonl"
    bench = tmp_path / "bench.jsonl"
    rows = [{"id": f"t{i}", "question": f"What is {i} plus 1?", "answer": str(i + 1), "rationale": f"{i} + 1."}
            for i in range(8)]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    settings = {
        "identify": SETTINGS["identify"],
        "finetune": {"top_k": 2, "data": str(data), "batch_size": 4, "micro_batch_size": 4, "max_steps": 1,
                     "target": "answer", "chat_template": False, "lr": 0.01},
        "evaluate": {"benchmarks": [str(bench)], "n_shot": 0, "max_new_tokens": 3},
    }  # fmt: skip
    cfg = load_run_config(None, {"out": str(tmp_path / "run"), "model": {"model": str(model)},
                                 "stages": "identify,finetune,evaluate", **settings})  # fmt: skip
    results = run_pipeline(cfg, quiet=True)
    run = tmp_path / "run"
    assert (run / "finetune" / "delta.json").is_file()
    assert set(results["evaluate"]) == {"base", "tuned"}
    for which in ("base", "tuned"):
        assert (run / "evaluate" / which / "results.csv").is_file()
    stamp = (run / "evaluate" / "metadata.json").stat().st_mtime_ns
    again = run_pipeline(cfg, quiet=True)
    assert all(isinstance(v, Path) for v in again.values())
    assert (run / "evaluate" / "metadata.json").stat().st_mtime_ns == stamp

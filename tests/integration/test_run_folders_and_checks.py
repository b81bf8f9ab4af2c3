"""Run folders, and every path and value checked before the model loads (issue #12, part b).

A mistaken path or value ends in one sentence naming the cause and the fix, exit status 2, no traceback, no
file written, and no model loaded (`load_model` is replaced by one that fails the test). An analysis of an
earlier identify run is moved aside by identify, shown as stale by the report, and rerun by `arithmech run`;
`--from` finds the identify run inside an `arithmech run` folder; output files follow the umask.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from arithmech.cli import main
from arithmech.lineage import identify_fingerprint
from arithmech.report.html import write_report
from arithmech.runs import atomic_write_text, staging_folder

IDENTIFY = ["--keep-incorrect", "--formations", "equation", "--n-per-template", "2", "--quiet"]
SETTINGS = {"identify": {"filter_correct": False, "formations": ["equation"], "n_per_template": 2},
            "attention": {"max_prompts": 4}}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A flat identify run, an `arithmech run` folder (identify, attention), and folders wrong in one way each."""
    model = tiny_model_dir("llama")
    root = tmp_path_factory.mktemp("runs")
    assert main(["identify", "--model", str(model), *IDENTIFY, "--out", str(root / "flat")]) == 0
    config = root / "run.yaml"
    config.write_text(yaml.safe_dump({"out": str(root / "pipe"), "model": {"model": str(model)},
                                      "stages": ["identify", "attention"], **SETTINGS}))  # fmt: skip
    assert main(["run", "--config", str(config), "--quiet"]) == 0
    (root / "afile").write_text("not a folder\n")
    for name in ("a", "b"):
        shutil.copytree(root / "flat", root / "two" / name)
    (root / "half" / "identify").mkdir(parents=True)  # an `arithmech run` whose identify stage did not finish
    (root / "half" / "pipeline.json").write_text("{}\n")
    (root / "empty").mkdir()
    shutil.copytree(root / "flat", root / "quick" / "identify")  # a run made stage by stage, as the quickstart's
    return {"root": root, "flat": root / "flat", "pipe": root / "pipe", "config": config, "model": model}


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if any command loads a model: every check must come before."""
    import arithmech.models.load

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(arithmech.models.load, "load_model", refuse)


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file (size, mtime) and folder under `root` (a write check may touch a folder's mtime, nothing else)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else (0, 0)
            for p in root.rglob("*")}  # fmt: skip


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], root: Path, expected: list[str]) -> str:
    before = _snapshot(root)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err  # one sentence
    for part in expected:
        assert part in errors[0], errors[0]
    assert _snapshot(root) == before, "a file was written"
    return errors[0]


M = "--model {model}"
CASES = [
    # output folders
    ("out-is-a-file", f"identify {M} --out {{root}}/afile", ["--out", "afile' is a file; give a folder"]),
    ("out-under-proc", f"identify {M} --out /proc/arithmech-test/run", ["cannot be written", "choose a folder"]),
    ("out-below-a-file", f"knockout {M} --from {{flat}} --out {{root}}/afile/ko", ["cannot be created", "is a file"]),
    ("out-is-the-identify-run", f"knockout {M} --from {{flat}} --out {{flat}}",
     ["holds the results of the identify stage", "replace", "flat/knockout'"]),
    ("out-is-an-arithmech-run-folder", f"identify {M} --out {{pipe}}",
     ["is the folder of `arithmech run`", "give --out a subfolder", "pipe/identify'"]),
    ("attention-out-is-a-file", f"analyze attention {M} --from {{flat}} --out {{root}}/afile", ["is a file"]),
    ("mlp-out-is-a-file", f"analyze mlp {M} --from {{flat}} --out {{root}}/afile", ["is a file"]),
    ("agreement-out-is-a-file", f"analyze agreement {M} --from {{flat}} --out {{root}}/afile", ["is a file"]),
    ("transfer-out-is-a-file", f"transfer {M} --from {{flat}} --out {{root}}/afile", ["is a file"]),
    ("mediate-out-is-a-file", f"mediate {M} --out {{root}}/afile", ["is a file"]),
    ("neurons-out-is-a-file", f"neurons {M} --out {{root}}/afile", ["is a file"]),
    ("finetune-out-is-a-file", f"finetune {M} --from {{flat}} --out {{root}}/afile", ["is a file"]),
    ("evaluate-out-is-a-file", f"evaluate {M} --benchmarks gsm8k --out {{root}}/afile", ["is a file"]),
    ("circuit-out-the-root-of-a-run", f"circuit {M} --out {{root}}/quick",  # issue 34.14
     ["is the root of a run whose stages live in subfolders (identify)", "give --out a subfolder", "quick/circuit'"]),
    ("identify-out-the-root-of-a-run", f"identify {M} --out {{root}}/quick",
     ["is the root of a run whose stages live in subfolders (identify)", "quick/identify'"]),
    # --from
    ("from-missing", f"knockout {M} --from {{root}}/missing", ["does not exist", "--out folder of an identify run"]),
    ("from-a-file", f"knockout {M} --from {{flat}}/effects.csv", ["is a file; give the identify run folder"]),
    ("from-an-analysis-folder", f"analyze mlp {M} --from {{pipe}}/attention",
     ["is not an identify run (stage 'analyze_attention')", "the identify run folder it read", "pipe/identify'"]),
    ("from-two-identify-runs", f"knockout {M} --from {{root}}/two", ["holds 2 identify runs", "give one of them"]),
    ("from-an-unfinished-arithmech-run", f"transfer {M} --from {{root}}/half",
     ["holds identify/", "its identify stage did not finish"]),
    ("from-an-empty-folder", f"finetune {M} --from {{root}}/empty", ["did not finish", "rerun identify"]),
    # input files and folders
    ("prompts-missing", f"identify {M} --prompts {{root}}/missing.jsonl", ["--prompts", "does not exist"]),
    ("prompts-a-folder", f"identify {M} --prompts {{root}}", ["--prompts", "is a folder; give the path of a file"]),
    ("templates-missing", f"identify {M} --templates {{root}}/missing.json", ["--templates", "does not exist"]),
    ("data-dir-missing", f"transfer {M} --from {{flat}} --data-dir {{root}}/missing", ["--data-dir", "does not exist"]),
    ("data-dir-a-file", f"finetune {M} --from {{flat}} --data-dir {{root}}/afile", ["--data-dir", "is a file"]),
    ("sft-data-missing", f"finetune {M} --from {{flat}} --data {{root}}/missing.jsonl", ["--data", "does not exist"]),
    ("benchmark-file-missing", f"evaluate {M} --benchmarks {{root}}/missing.jsonl", ["--benchmarks", "not exist"]),
    ("train-file-missing", f"evaluate {M} --benchmarks gsm8k --exclude-train-overlap --train-file {{root}}/t.jsonl",
     ["--train-file", "does not exist"]),
    ("general-text-missing", f"evaluate {M} --benchmarks general --general-text {{root}}/missing.txt",
     ["--general-text", "does not exist"]),
    ("delta-not-a-finetune-folder", f"evaluate {M} --benchmarks gsm8k --delta {{flat}}",
     ["--delta", "holds no delta.json", "give the output folder of finetune"]),
    ("adapter-not-a-peft-folder", f"neurons {M} --adapter {{root}}/empty",
     ["--adapter", "holds no adapter_config.json", "peft LoRA adapter folder"]),
    # arithmech run
    ("config-a-folder", "run --config {root}", ["config file", "is a folder; give the path of a file"]),
    ("set-a-wrong-type", "run --config {config} --set attention.max_prompts=abc",
     ["attention.max_prompts takes a whole number (int); got 'abc'"]),
    ("set-inside-a-value", "run --config {config} --set attention=3 --set attention.max_prompts=2",
     ["cannot set attention.max_prompts: attention is 3, not a mapping of settings"]),
    ("run-out-a-file", "run --config {config} --out {root}/afile", ["out", "is a file"]),
    ("run-out-under-proc", "run --config {config} --out /proc/arithmech-test", ["cannot be written"]),
    ("run-out-an-identify-run", "run --config {config} --out {flat}",
     ["holds the results of the identify stage", "give `arithmech run` a folder of its own"]),
    ("run-reads-identify-made-otherwise",
     "run --config {config} --stages attention --set identify.operations=multiplication",
     ["identify.operations is ['multiplication'] in this config", "was made with ['addition']",
      "add identify to stages to rerun it"]),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_before_the_model_loads(runs, no_model, capsys, argv: str, expected: list[str]) -> None:
    _refused(argv.format(**runs).split(), capsys, runs["root"], expected)


def _jsonl(*rows: object) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


GOOD_PAIR = {"reference": "3 + 4 = ", "counterfactual": "3 @ 4 = ", "answer": "7"}
ADD_TEMPLATE = {"id": "add", "operation": "addition", "formation": "equation", "text": "{A} + {B} = ",
                "operator": "+", "counterfactual_operator": "@"}  # fmt: skip
# case id -> (file name, its bytes, argv given the file as {file}, substrings of the one error line)
FILE_CASES = {
    "prompts-not-json": ("p.jsonl", _jsonl(GOOD_PAIR) + b"{broken\n", "identify --prompts {file}",
                         ["p.jsonl, line 2 (1 of 2 lines)", "not JSON", "write one JSON object per line"]),
    "prompts-empty": ("p.jsonl", b"\n \n", "identify --prompts {file}", ["p.jsonl has no rows"]),
    "prompts-missing-column": ("p.jsonl", _jsonl({"reference": "3 + 4 = ", "answer": "7"}),
                               "identify --prompts {file}", ["line 1", "no counterfactual", "add them"]),
    "prompts-answer-not-a-string": ("p.jsonl", _jsonl({**GOOD_PAIR, "answer": [7]}), "identify --prompts {file}",
                                    ["line 1", "non-string answer", "write it as a JSON string"]),
    "prompts-counterfactual-is-reference": ("p.jsonl", _jsonl({**GOOD_PAIR, "counterfactual": "3 + 4 = "}),
                                            "identify --prompts {file}",
                                            ["line 1", "the counterfactual is the reference itself"]),
    "prompts-answer-with-a-space": ("p.jsonl", _jsonl({**GOOD_PAIR, "answer": "7 "}), "identify --prompts {file}",
                                    ["line 1", "the answer ends with a space"]),
    "prompts-utf-16": ("p.jsonl", _jsonl(GOOD_PAIR).decode().encode("utf-16"), "identify --prompts {file}",
                       ["UTF-16 text, not UTF-8"]),
    "templates-not-json": ("t.json", b"[{", "identify --templates {file}", ["t.json is not valid JSON"]),
    "templates-missing-fields": ("t.json", json.dumps([{"id": "x"}]).encode(), "identify --templates {file}",
                                 ["template 'x' is missing operation"]),
    "templates-none-of-the-operation": ("t.json", json.dumps([ADD_TEMPLATE]).encode(),
                                        "identify --templates {file} --operations multiplication",
                                        ["no template matches the chosen operations"]),
    "benchmark-answer-not-a-number": ("b.jsonl", _jsonl({"question": "2 and 2?", "answer": "four"}),
                                      "evaluate --benchmarks {file}", ["b.jsonl row 1", "'four' is not a number"]),
    "benchmark-choice-out-of-range": ("b.jsonl", _jsonl({"question": "q", "choices": ["a", "b"], "answer": 5}),
                                      "evaluate --benchmarks {file}", ["b.jsonl", "answer 5"]),
    "train-file-not-json": ("t.jsonl", b"not json\n",
                            "evaluate --benchmarks gsm8k --exclude-train-overlap --train-file {file}",
                            ["t.jsonl line 1 is not valid JSON"]),
    "general-text-empty": ("g.txt", b"\n\n", "evaluate --benchmarks general --general-text {file}",
                           ["g.txt holds no text"]),
    "sft-data-without-answers": ("s.jsonl", _jsonl({"question": "q"}), "finetune --method full --data {file}",
                                 ["s.jsonl line 1 is not a JSON object with question and answer"]),
    "run-with-a-bad-prompt-file": ("p.jsonl", b"{broken\n", "run --config {config} --set identify.prompts_file={file}",
                                   ["p.jsonl, line 1", "not JSON"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_file_content_is_refused_before_the_model_loads(runs, no_model, capsys, tmp_path: Path, case: str) -> None:
    """A malformed prompt, templates, benchmark, training or text file is named before the model loads (the
    model load fails the test), not minutes later; checks that need the tokenizer are test_bad_prompts.py's."""
    name, content, argv, expected = FILE_CASES[case]
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / name).write_bytes(content)
    model = [] if argv.startswith("run ") else ["--model", str(runs["model"])]
    args = argv.format(file=folder / name, config=runs["config"]).split()
    _refused([*args, *model, "--out", str(folder / "out")] if model else args, capsys, folder, expected)


ADAPTER_CASES = {  # adapter_config.json content, weights file written, what the error line must hold
    "not-json": ("{peft", True, ["adapter_config.json' is not readable JSON"]),
    "not-lora": (json.dumps({"peft_type": "PREFIX_TUNING"}), True, ["is no LoRA adapter", "PREFIX_TUNING"]),
    "no-target-modules": (json.dumps({"peft_type": "LORA"}), True, ["names no target_modules"]),
    "no-weights": (json.dumps({"peft_type": "LORA", "target_modules": ["down_proj"]}), False,
                   ["has no adapter weights", "adapter_model.safetensors"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(ADAPTER_CASES))
def test_adapter_content_is_refused_before_the_model_loads(runs, no_model, capsys, tmp_path: Path, case: str) -> None:
    config, weights, expected = ADAPTER_CASES[case]
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(config)
    if weights:
        (folder / "adapter_model.safetensors").write_bytes(b"")
    args = ["neurons", "--model", str(runs["model"]), "--adapter", str(folder), "--out", str(tmp_path / "out")]
    _refused(args, capsys, tmp_path, expected)


YAML_CASES = [
    ("decimal-for-a-whole-number", {"attention": {"max_prompts": 8.5}}, "attention.max_prompts takes a whole number"),
    ("text-for-true-false", {"identify": {"filter_correct": "no"}}, "identify.filter_correct takes true or false"),
    ("unquoted-head-name", {"knockout": {"components": [2.10]}}, "write it in quotes, since YAML reads 2.10"),
    ("section-not-a-mapping", {"attention": 5}, "attention takes a mapping of settings"),
    ("seed-not-a-number", {"seed": "abc"}, "seed takes a whole number (int); got 'abc'"),
    ("model-not-a-mapping", {"model": ["a", "b"]}, "model takes a mapping of settings"),
    ("stages-not-names", {"stages": {"identify": 1}}, "stages takes a list of names"),
]


@pytest.mark.parametrize(("values", "expected"), [c[1:] for c in YAML_CASES], ids=[c[0] for c in YAML_CASES])
def test_config_values_of_the_wrong_type(runs, no_model, capsys, tmp_path: Path, values: dict, expected: str) -> None:
    data = {"out": str(tmp_path / "run"), "model": str(runs["model"]), "stages": ["identify", "knockout", "attention"],
            **SETTINGS}  # fmt: skip
    for key, value in values.items():
        both = isinstance(value, dict) and isinstance(data.get(key), dict)
        data[key] = {**data[key], **value} if both else value
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(data))
    _refused(["run", "--config", str(config)], capsys, tmp_path, [expected])


def test_model_given_as_a_plain_string(runs, tmp_path: Path, capsys) -> None:
    """`model: <id>` is short for `model: {model: <id>}`, and --model still overrides it."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"out": str(tmp_path / "run"), "model": "no/such-model", "stages": ["identify"],
                                      **SETTINGS}))  # fmt: skip
    assert main(["run", "--config", str(config), "--model", str(runs["model"]), "--quiet"]) == 0
    assert json.loads((tmp_path / "run" / "pipeline.json").read_text())["model"] == {"model": str(runs["model"])}
    config.write_text(config.read_text().replace("no/such-model", str(runs["model"])))
    capsys.readouterr()
    assert main(["run", "--config", str(config), "--quiet"]) == 0
    assert "identify   kept (unchanged)" in capsys.readouterr().out  # the same model either way


def test_from_the_top_of_an_arithmech_run_folder(runs, tmp_path: Path, monkeypatch, caplog) -> None:
    """knockout --from <run folder> reads its identify/ and says so; ~ is expanded in --from and --out."""
    shutil.copytree(runs["pipe"], tmp_path / "pipe")
    monkeypatch.setenv("HOME", str(tmp_path))
    with caplog.at_level("INFO", logger="arithmech"):
        code = main(["knockout", "--model", str(runs["model"]), "--from", "~/pipe", "--max-k", "2", "--n-random", "1",
                     "--out", "~/pipe/knockout", "--quiet"])  # fmt: skip
    assert code == 0
    assert "is the folder of `arithmech run`: using its identify run" in caplog.text
    [record] = json.loads((tmp_path / "pipe" / "knockout" / "metadata.json").read_text())["identify_runs"]
    assert record["path"] == str((tmp_path / "pipe" / "identify").resolve())
    assert record["fingerprint"] == identify_fingerprint(tmp_path / "pipe" / "identify")
    assert not (Path.cwd() / "~").exists()


def _analyse(model: Path, run: Path) -> None:
    for kind in ("attention", "mlp"):
        assert main(["analyze", kind, "--model", str(model), "--from", str(run), "--max-prompts", "4", "--quiet"]) == 0


def test_identify_again_moves_the_earlier_analyses_aside(runs, tmp_path: Path, caplog) -> None:
    model, run = runs["model"], tmp_path / "flat"
    shutil.copytree(runs["flat"], run)
    _analyse(model, run)  # into run/attention and run/mlp
    for kind in ("attention", "mlp"):
        meta = json.loads((run / kind / "metadata.json").read_text())
        assert [r["fingerprint"] for r in meta["identify_runs"]] == [identify_fingerprint(run)]

    assert main(["identify", "--model", str(model), *IDENTIFY, "--out", str(run)]) == 0  # the same result again
    assert (run / "attention").is_dir() and (run / "mlp").is_dir() and not list(run.glob("stale-*"))

    with caplog.at_level("WARNING", logger="arithmech"):
        assert main(["identify", "--model", str(model), *IDENTIFY, "--seed", "1", "--out", str(run)]) == 0
    [aside] = run.glob("stale-*")
    assert f"moved the analyses of the earlier run (attention, mlp) to {aside}" in caplog.text
    assert not (run / "attention").exists() and (aside / "attention" / "metadata.json").is_file()
    assert json.loads((run / "metadata.json").read_text())["fingerprint"] == identify_fingerprint(run)

    # an analysis from before fingerprints were recorded is judged by its date
    legacy = run / "attention"
    shutil.copytree(aside / "attention", legacy)
    meta = json.loads((legacy / "metadata.json").read_text())
    meta.pop("identify_runs")
    meta["created"] = "2000-01-01T00:00:00+0000"
    (legacy / "metadata.json").write_text(json.dumps(meta))
    page = write_report(run).read_text()
    assert 'id="attention"' in page and "STALE: these attention results are not shown" in page
    caplog.clear()
    with caplog.at_level("WARNING", logger="arithmech"):
        assert main(["identify", "--model", str(model), *IDENTIFY, "--seed", "2", "--out", str(run)]) == 0
    assert "(attention)" in caplog.text and not legacy.exists()


def _section(page: str, stage: str) -> str:
    start = page.index(f'<section id="{stage}">')
    return page[start : page.index("</section>", start)]


def test_report_shows_an_analysis_of_an_earlier_identify_run_as_stale(runs, tmp_path: Path, capsys) -> None:
    """identify run again by hand into an `arithmech run` folder: its attention/ is stale until `run` again."""
    model, pipe = runs["model"], tmp_path / "pipe"
    shutil.copytree(runs["pipe"], pipe)
    config = tmp_path / "run.yaml"
    config.write_text(runs["config"].read_text().replace(str(runs["pipe"]), str(pipe)))
    fresh = _section(write_report(pipe).read_text(), "attention")
    assert "<table>" in fresh and "STALE" not in fresh

    assert main(["identify", "--model", str(model), *IDENTIFY, "--seed", "1", "--out", str(pipe / "identify")]) == 0
    section = _section(write_report(pipe).read_text(), "attention")
    assert '<span class="status unfinished">stale</span>' in section
    assert '<p class="banner">STALE: these attention results are not shown' in section
    assert "another identify run" in section and "<table>" not in section and "<img" not in section  # no numbers

    capsys.readouterr()
    assert main(["run", "--config", str(config), "--quiet"]) == 0  # identify was replaced: it runs again
    assert "identify   done" in capsys.readouterr().out
    assert "STALE" not in _section(write_report(pipe).read_text(), "attention")


def test_output_files_follow_the_umask(runs, tmp_path: Path) -> None:
    """0o666 / 0o777 less the umask, as a plain open() and mkdir give, not tempfile's 0o600 / 0o700."""
    old = os.umask(0o022)
    try:
        out = tmp_path / "run"
        assert main(["identify", "--model", str(runs["model"]), *IDENTIFY, "--out", str(out)]) == 0
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*")}
        assert modes and set(modes.values()) == {0o644}, modes

        os.umask(0o027)
        atomic_write_text(tmp_path / "new.txt", "x")
        assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o640
        assert stat.S_IMODE(staging_folder(tmp_path / "merged").stat().st_mode) == 0o750
        os.chmod(out / "effects.csv", 0o600)  # a file written again keeps its mode
        atomic_write_text(out / "effects.csv", "x")
        assert stat.S_IMODE((out / "effects.csv").stat().st_mode) == 0o600
    finally:
        os.umask(old)

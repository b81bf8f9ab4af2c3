"""What the CLI tells (issue #12, "What the CLI and README tell"): instant help and input errors, readable
help texts, --version, --quiet, --threads, and stage names that match the commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import arithmech

SRC = str(Path(arithmech.__file__).resolve().parents[1])
HEAVY = ("torch", "transformers", "numpy", "matplotlib", "accelerate", "lm_eval", "rich")


def _heavy_after(argvs: list[list[str]]) -> dict[str, object]:
    """In a fresh interpreter: import arithmech.cli, run each argv through main(); the exit status of each run,
    the heavy modules imported by then, and what it wrote to stderr."""
    script = (
        "import io, json, sys\n"
        "import arithmech.cli\n"
        f"heavy = {HEAVY!r}\n"
        "loaded = {'import': sorted(m for m in heavy if m in sys.modules)}\n"
        f"for argv in {argvs!r}:\n"
        "    sys.stderr = io.StringIO()\n"
        "    code = arithmech.cli.main(argv)\n"
        "    said, sys.stderr = sys.stderr.getvalue(), sys.__stderr__\n"
        "    loaded[' '.join(argv)] = [code, sorted(m for m in heavy if m in sys.modules), said]\n"
        "sys.stdout = sys.__stdout__\n"
        "print('RESULT' + json.dumps(loaded))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "COLUMNS": "100"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.rpartition("RESULT")[2])


def test_import_and_help_and_input_errors_load_no_torch(tmp_path: Path) -> None:
    """`arithmech --help`, every command's --help and a bad option value of every command answer before torch
    is imported; a bad value is one sentence on stderr and exit status 2, and nothing is written."""
    run = str(tmp_path / "no-such-run")  # never read: the bad option is refused first
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "dtype.yaml").write_text("model: {dtype: bogus}\nstages: [identify]\n")
    (configs / "ok.yaml").write_text(f"out: {tmp_path / 'r'}\nstages: [identify, knockout]\n")
    helps = [["--help"], ["identify", "--help"], ["knockout", "--help"], ["transfer", "--help"],
             ["analyze", "attention", "--help"], ["analyze", "mlp", "--help"], ["analyze", "agreement", "--help"],
             ["analyze", "heuristics", "--help"],
             ["mediate", "--help"], ["neurons", "--help"], ["finetune", "--help"], ["evaluate", "--help"],
             ["run", "--help"], ["report", "--help"], ["circuit", "--help"]]  # fmt: skip
    bad = {  # argv -> a word of the sentence that names the cause
        ("identify", "--variant", "bogus", "--out", str(tmp_path / "i")): "variant",
        ("identify", "--max-prompts", "0", "--out", str(tmp_path / "i")): "max_prompts",
        ("identify", "--threshold", "5", "--out", str(tmp_path / "i")): "threshold 5 is not negative",
        ("identify", "--threshold", "0.05", "--out", str(tmp_path / "i")): "--threshold -0.05",
        ("identify", "--fraction-threshold", "-0.5", "--out", str(tmp_path / "i")): "--fraction-threshold 0.5",
        ("identify", "--max-memory", "lots", "--out", str(tmp_path / "i")): "--max-memory takes a size",
        ("identify", "--max-memory", "1KB", "--out", str(tmp_path / "i")): "below the weights alone",
        ("knockout", "--components", "14.2", "--ablation", "bogus", "--out", str(tmp_path / "k")): "ablation",
        ("knockout", "--out", str(tmp_path / "k")): "nothing to knock out",
        ("transfer", "--from", run, "--targets", "nosuch", "--out", str(tmp_path / "t")): "nosuch",
        ("transfer", "--from", run, "--min-group-size", "1", "--out", str(tmp_path / "t")): "min_group_size",
        ("analyze", "attention", "--from", run, "--tau", "2", "--out", str(tmp_path / "a")): "tau",
        ("analyze", "attention", "--from", run, "--heads", "mlp.3", "--out", str(tmp_path / "a")): "mlp.3",
        ("analyze", "mlp", "--from", run, "--example-prompt", "99", "--max-prompts", "8",
         "--out", str(tmp_path / "l")): "example_prompt",
        ("analyze", "mlp", "--from", run, "--layers", "2,2", "--out", str(tmp_path / "l")): "layers",
        ("analyze", "agreement", "--from", run, "--methods", "path", "--out", str(tmp_path / "g")): "two",
        ("analyze", "agreement", "--from", run, "--ks", "0", "--out", str(tmp_path / "g")): "ks",
        ("mediate", "--n-pairs", "0", "--out", str(tmp_path / "m")): "n_pairs",
        ("finetune", "--method", "bogus", "--out", str(tmp_path / "f")): "bogus",
        ("evaluate", "--benchmarks", "nosuch", "--out", str(tmp_path / "e")): "nosuch",
        ("neurons", "--prune-by", "x", "--out", str(tmp_path / "n")): "prune_by",
        ("analyze", "heuristics", "--grid-size", "1", "--out", str(tmp_path / "h")): "grid",
        ("circuit", "--method", "bogus", "--out", str(tmp_path / "c")): "method",
        ("circuit", "--percents", "0,150", "--out", str(tmp_path / "c")): "(0, 100]",
        ("run", "--config", str(configs / "dtype.yaml")): "dtype",
        ("run", "--config", str(configs / "ok.yaml"), "--set", "knockout.max_k=abc"): "knockout.max_k",
        ("run", "--config", str(configs / "ok.yaml"), "--max-memory", "-1GB"): "--max-memory must be a positive",
    }  # fmt: skip
    loaded = _heavy_after([*helps, *(list(argv) for argv in bad)])
    assert loaded.pop("import") == []
    for argv, (code, modules, _) in list(loaded.items())[: len(helps)]:
        assert (code, modules) == (0, []), argv
    for (argv, cause), (code, modules, said) in zip(bad.items(), list(loaded.values())[len(helps) :], strict=True):
        assert modules == [], f"{argv} imported {modules}"
        assert code == 2, (argv, said)
        assert said.startswith("error: ") and said.count("\n") == 1 and "Traceback" not in said, (argv, said)
        assert cause in said, (argv, said)
    assert list(tmp_path.iterdir()) == [configs]


def _commands() -> list[tuple[list[str], object]]:
    """(argv prefix, click command) of every leaf command of the app."""
    import typer.main

    from arithmech.cli import app

    out: list[tuple[list[str], object]] = []

    def walk(prefix: list[str], command: object) -> None:
        children = getattr(command, "commands", None)
        if children is None:
            out.append((prefix, command))
            return
        for name, child in children.items():
            walk([*prefix, name], child)

    walk([], typer.main.get_command(app))
    return out


def test_every_help_shows_flags_as_flags_and_brackets_as_written(capsys) -> None:
    """No --flag shows a value placeholder (<bool>), and help text such as "pip install 'arithmech[lm-eval]'"
    keeps its square brackets, in every command's --help."""
    from arithmech.cli import main

    commands = _commands()
    assert len(commands) == 17  # analyze fourier and heuristics (issue #15), circuit, plan (#33), analyze numbers (#35)
    bracketed = 0
    for argv, command in commands:
        assert main([*argv, "--help"]) == 0
        text = capsys.readouterr().out
        squeezed = "".join(text.split())
        assert "<bool>" not in text, argv
        for param in command.params:  # type: ignore[attr-defined]
            if getattr(param, "is_flag", False):  # shown as "--flag" or "--flag / --no-flag", then its help
                assert " / ".join([*param.opts, *param.secondary_opts]) in text, (argv, param.opts)
            help_text = getattr(param, "help", None) or ""
            if "[" in help_text:
                bracketed += 1
                assert "".join(help_text.split()) in squeezed, (argv, help_text)
    assert bracketed >= 1  # evaluate's --harness-tasks
    assert main(["evaluate", "--help"]) == 0
    assert "arithmech[lm-eval]" in "".join(capsys.readouterr().out.split())


def test_version(capsys) -> None:
    from arithmech.cli import main

    assert main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"arithmech {arithmech.__version__}"), out
    assert "\n" not in out


def test_quiet_silences_library_progress_bars_and_threads_are_set(tiny_model_dir, tmp_path: Path, capsys) -> None:
    """--quiet: nothing on stderr, not even transformers' "Loading weights" bar; --threads N: torch uses N."""
    import torch

    from arithmech.cli import main

    args = ["evaluate", "--model", str(tiny_model_dir("llama")), "--benchmarks", "general", "--limit", "1",
            "--general-max-tokens", "8"]  # fmt: skip
    before = torch.get_num_threads()
    try:
        assert main([*args, "--out", str(tmp_path / "loud")]) == 0
        assert "Loading weights" in capsys.readouterr().err  # what --quiet must silence
        assert main([*args, "--out", str(tmp_path / "quiet"), "--quiet", "--threads", "1"]) == 0
        captured = capsys.readouterr()
        assert captured.err == ""
        assert "general" in captured.out
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert main([*args, "--out", str(tmp_path / "zero"), "--threads", "0"]) == 2
    assert "--threads" in capsys.readouterr().err
    assert not (tmp_path / "zero").exists()


ALIASES = [  # (name in a config, the stage, one of its settings and a value)
    ("mediate", "mediation", "n_pairs", 3),
    ("analyze attention", "attention", "tau", 0.4),
    ("analyze-mlp", "mlp", "max_prompts", 8),
    ("analyze_agreement", "agreement", "max_prompts", 4),
    ("analyze heuristics", "heuristics", "max_pairs", 16),
]


def test_stage_aliases_in_configs_stages_and_set(tmp_path: Path) -> None:
    """A stage may be named after its command (mediate, analyze mlp, ...) as a YAML key, in stages and in --set;
    the run uses the stage's own name."""
    from arithmech.pipeline import load_run_config

    yaml_text = "".join(f"{alias}: {{{field}: {value}}}\n" for alias, _, field, value in ALIASES)
    stages = ["identify", *(alias for alias, _, _, _ in ALIASES)]
    config = tmp_path / "aliases.yaml"
    config.write_text(yaml_text + f"stages: {json.dumps(stages)}\n")
    cfg = load_run_config(config, {"mediate.few_shot": 2})
    assert cfg.stages == ("identify", "mediation", "attention", "mlp", "agreement", "heuristics")
    for _, stage, field, value in ALIASES:
        assert getattr(cfg.settings[stage], field) == value, stage
    assert cfg.settings["mediation"].few_shot == 2
    assert load_run_config(None, {"stages": "identify,analyze mlp"}).stages == ("identify", "mlp")


def test_a_stage_named_twice_by_alias_is_refused(tmp_path: Path, capsys) -> None:
    from arithmech.cli import main

    config = tmp_path / "twice.yaml"
    config.write_text("mediation: {n_pairs: 2}\nmediate: {n_pairs: 4}\n")
    out = tmp_path / "run"
    assert main(["run", "--config", str(config), "--stages", "mediate", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "'mediation' and 'mediate' name the same stage; keep one of them" in err and "Traceback" not in err
    assert not out.exists()


KO_HEADER = "k,ranking,seed,accuracy,mean_prob,components\n0,none,,1.0,0.76,\n1,effect,,0.5,0.4,14.2\n"
KO_SUMMARY = ("k,effect_accuracy,random_accuracy_mean,random_accuracy_std,effect_prob,random_prob_mean,"
              "random_prob_std\n1,0.5,1.0,0.0,0.4,0.75,0.01\n")  # fmt: skip
EVAL_HEADER = "benchmark,kind,n,correct,accuracy,accuracy_norm,perplexity,base_perplexity,kl,excluded,seconds\n"
MEDIATION_ROWS = ("task,component,layer,class,mean_ie,median_ie,n_pairs\n"
                  "addition,mlp,29,last,2207124,1103562,{n}\naddition,attn,23,last,0.6,0.5,{n}\n")  # fmt: skip
SMALL_SAMPLE_CASES = [  # (stage, its files with {n} for the sample size, the phrase the warning must hold)
    ("mediation", {"mediation_by_class.csv": MEDIATION_ROWS,
                   "mediation_total.csv": "task,pairs,mean_te,median_te,number_accuracy\naddition,{n},3e5,1.5,0.5\n",
                   "metadata.json": "{{}}"}, "{n} pairs for addition"),
    ("knockout", {"knockout.csv": KO_HEADER, "knockout_summary.csv": KO_SUMMARY,
                  "metadata.json": '{{"config": {{"n_random": 1}}, "counts": {{"prompts": {n}}}}}'}, "{n} prompts"),
    ("evaluate", {"base/results.csv": EVAL_HEADER + "gsm8k,generate,{n},1,0.25,,,,,0,1\n", "base/metadata.json": "{{}}",
                  "metadata.json": "{{}}"}, "{n} rows for gsm8k"),
]  # fmt: skip


def _run_folder(root: Path, stage: str, files: dict[str, str], n: int) -> Path:
    for name, text in files.items():
        path = root / stage / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.format(n=n))
    return root


def test_report_warns_about_numbers_from_few_prompts_or_pairs(tmp_path: Path, capsys) -> None:
    """A section whose numbers rest on fewer than 10 prompts or pairs shows a small-sample warning (and badge);
    one with enough shows none."""
    from arithmech.cli import main

    for stage, files, phrase in SMALL_SAMPLE_CASES:
        for n, warned in ((2, True), (40, False)):
            run = _run_folder(tmp_path / f"{stage}-{n}", stage, files, n)
            assert main(["report", str(run), "--quiet"]) == 0
            html = (run / "report.html").read_text()
            section = html[html.index(f'<section id="{stage}">'):]
            section = section[: section.index("</section>")]
            assert ("Small sample." in section) is warned, (stage, n)
            assert ("small sample</span>" in section) is warned, (stage, n)
            if warned:
                assert f"rest on {phrase.format(n=n)}, fewer than 10" in section, (stage, section)
    assert "Traceback" not in capsys.readouterr().err


def test_cli_summaries_warn_about_small_samples(tiny_model_dir, tmp_path: Path, capsys) -> None:
    """identify on 4 prompts and mediate on 1 pair per task say that their numbers rest on a small sample."""
    from arithmech.cli import main

    model = ["--model", str(tiny_model_dir("llama")), "--quiet", "--threads", "1"]
    import torch

    before = torch.get_num_threads()
    try:
        assert main(["identify", *model, "--n-per-template", "1", "--formations", "equation", "--few-shot", "0",
                     "--keep-incorrect", "--max-prompts", "4", "--out", str(tmp_path / "id")]) == 0  # fmt: skip
        assert "small sample: effects of 4 prompts change with another sample" in capsys.readouterr().out
        assert main(["mediate", *model, "--n-pairs", "1", "--few-shot", "0", "--neuron-k", "2",
                     "--out", str(tmp_path / "med")]) == 0  # fmt: skip
        out = capsys.readouterr().out
        assert "(1 pair)" in out and "small sample: medians of 1 pair change with another sample" in out
    finally:
        torch.set_num_threads(before)


def test_report_header_says_a_gguf_model_was_converted(tmp_path: Path) -> None:
    from arithmech.report.html import write_report

    run = _run_folder(tmp_path, *SMALL_SAMPLE_CASES[1][:2], n=40)
    meta = run / "knockout" / "metadata.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "model": {"gguf_file": "/m/x.Q4_1.gguf"}}))
    assert "/m/x.Q4_1.gguf (GGUF, converted to float32; quantized weights keep their rounding)" in \
        write_report(run).read_text()  # fmt: skip

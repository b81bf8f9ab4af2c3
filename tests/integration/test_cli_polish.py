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
    """In a fresh interpreter: import arithmech.cli, run each argv through main(); the heavy modules imported
    and the exit status of each run."""
    script = (
        "import json, sys\n"
        "import arithmech.cli\n"
        f"heavy = {HEAVY!r}\n"
        "loaded = {'import': sorted(m for m in heavy if m in sys.modules)}\n"
        f"for argv in {argvs!r}:\n"
        "    code = arithmech.cli.main(argv)\n"
        "    loaded[' '.join(argv)] = [code, sorted(m for m in heavy if m in sys.modules)]\n"
        "sys.stdout = sys.__stdout__\n"
        "print('RESULT' + json.dumps(loaded))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "COLUMNS": "100"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.rpartition("RESULT")[2])


def test_import_and_help_and_input_errors_load_no_torch(tmp_path: Path) -> None:
    """`arithmech --help`, every command's --help and a bad option value answer before torch is imported."""
    argvs = [["--help"], ["identify", "--help"], ["knockout", "--help"], ["transfer", "--help"],
             ["analyze", "attention", "--help"], ["analyze", "mlp", "--help"], ["analyze", "agreement", "--help"],
             ["mediate", "--help"], ["neurons", "--help"], ["finetune", "--help"], ["evaluate", "--help"],
             ["run", "--help"], ["report", "--help"],
             ["mediate", "--n-pairs", "0", "--out", str(tmp_path / "m")],
             ["finetune", "--method", "bogus", "--out", str(tmp_path / "f")],
             ["evaluate", "--benchmarks", "nosuch", "--out", str(tmp_path / "e")],
             ["neurons", "--prune-by", "x", "--out", str(tmp_path / "n")]]  # fmt: skip
    loaded = _heavy_after(argvs)
    assert loaded.pop("import") == []
    for argv, (code, modules) in loaded.items():
        assert modules == [], f"{argv} imported {modules}"
        assert code == (0 if argv.endswith("--help") else 2), argv
    assert not list(tmp_path.iterdir())

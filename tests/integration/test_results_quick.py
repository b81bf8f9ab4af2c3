"""Every study of results/ still runs, and the pages still render from what it writes (its quick variant).

experiments/studies.py gives each source a quick variant: the same commands at a few prompts on a tiny model. Here
each runs in a temporary folder, experiments/results.py keeps its files as it would for results/, and the pages
of docs/results.md and README.md are rendered from them: a stage whose output format changed (a renamed column, a
missing file) fails here, not at the next full refresh of hours.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))

import render_results  # noqa: E402
from results import collect, run_source  # noqa: E402
from studies import SOURCES, Source  # noqa: E402


@pytest.mark.slow
def test_every_study_runs_quick_and_the_pages_render(
    tiny_model_dir: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    results = tmp_path / "results"
    results.mkdir()
    shutil.copyfile(ROOT / "results" / "published.json", results / "published.json")
    model = str(tiny_model_dir("llama"))

    def run(source: Source) -> float:
        return run_source(source, tmp_path / "runs" / source.name, quick_model=model, quiet=True)

    with ThreadPoolExecutor(max_workers=2) as pool:  # single-threaded subprocesses: one per core
        seconds = dict(zip(SOURCES, pool.map(run, SOURCES.values()), strict=True))
    for name, source in SOURCES.items():  # one at a time: sources share study.json files
        touched = collect(source, tmp_path / "runs" / name, results, seconds[name], quick=True)
        assert touched and all((results / study / "study.json").is_file() for study in touched)
    for page in render_results.PAGES:
        text = render_results.render(page, results)
        assert "## " in text or page.markers is not None
        assert "None" not in text, f"{page.path.name} renders an empty value as None"

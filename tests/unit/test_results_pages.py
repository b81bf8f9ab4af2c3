"""docs/results.md and README.md's findings are what results/ renders, and results/ is what the studies kept.

The pages are rendered by experiments/render_results.py from the committed study folders (experiments/results.py
keeps them); a hand edit of a number, or a number typed into a template's prose, fails here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))

import render_results  # noqa: E402
from results import KEPT_SUFFIXES, MAX_BYTES  # noqa: E402
from studies import SOURCES, studies  # noqa: E402


@pytest.mark.parametrize("page", render_results.PAGES, ids=lambda p: p.path.name)
def test_page_is_what_results_render(page: render_results.Page) -> None:
    assert render_results.current(page) == render_results.render(page), (
        f"{page.path.name} differs from results/: run python experiments/render_results.py --write "
        "(and never edit its numbers by hand)"
    )


def test_a_hand_edit_is_caught(tmp_path: Path) -> None:
    page = render_results.PAGES[0]
    rendered = render_results.render(page)
    digit = next(i for i, ch in enumerate(rendered) if ch.isdigit() and i > rendered.find("##"))
    edited = rendered[:digit] + str((int(rendered[digit]) + 1) % 10) + rendered[digit + 1 :]
    copy = render_results.Page(tmp_path / "results.md", page.template)
    copy.path.write_text(edited)
    assert render_results.current(copy) != render_results.render(copy)


@pytest.mark.parametrize("template", sorted(render_results.TEMPLATES.rglob("*.md.j2")), ids=lambda p: p.name)
def test_templates_type_no_results(template: Path) -> None:
    typed = list(render_results.typed_numbers(template.read_text()))
    assert not typed, f"{template.name} types numbers that look measured, {typed}: render them from results/"


def test_typed_numbers_are_found() -> None:
    found = list(render_results.typed_numbers("CPR 1.71 and 59% `--lr 1e-3 0.5` {{ x | pct }} Llama-3.1-8B 4 heads"))
    assert found == ["1.71", "59%"]


PENDING: set[str] = set()
"""Studies whose rerun under the current protocol has not been committed yet: the page says so (pending.md.j2)."""


def test_every_study_has_its_folder_or_is_pending() -> None:
    kept = {p.name for p in (ROOT / "results").iterdir() if p.is_dir() and p.name != "pages"}
    assert kept <= set(studies())
    assert set(studies()) - kept <= PENDING, "a study's folder is missing: rerun it (experiments/results.py run)"
    page = (ROOT / "docs" / "results.md").read_text()
    for study in set(studies()) - kept:
        assert f"experiments/results.py run {study}" in page and f"Not yet in `results/{study}/`" in page


def test_every_kept_study_has_its_files_with_provenance() -> None:
    for source in SOURCES.values():
        for kept in source.kept:
            if not (ROOT / "results" / kept.study).is_dir():
                continue
            folder = ROOT / "results" / kept.study / kept.name
            assert sorted(p.name for p in folder.iterdir()) == sorted(
                [*kept.files, *(["metadata.json"] if kept.metadata else [])]
            ), folder
            for path in folder.iterdir():
                assert path.suffix in KEPT_SUFFIXES and path.stat().st_size <= MAX_BYTES, path
            if kept.metadata:
                metadata = json.loads((folder / "metadata.json").read_text())
                assert {"config", "versions", "git_sha"} <= set(metadata), folder
            entry = json.loads((ROOT / "results" / kept.study / "study.json").read_text())["sources"][source.name]
            assert entry["command"] == f"python experiments/results.py run {source.name}"
            assert entry["git_sha"] and entry["model"]["sha256"], kept.study

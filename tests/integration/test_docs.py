"""Documentation that cannot drift: the site builds strictly and offline, every `arithmech ...` command shown in
README.md or any page under docs/ parses with the real command-line app, and the API page documents exactly
`arithmech`'s top-level names. (The tutorial is executed in tests/default_model/test_docs_tutorial.py.)"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import arithmech as am
from arithmech.cli.reference import command_tree

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_FENCES = ("", "bash", "sh", "shell", "console")
KNOWN_README_FAILURES: dict[str, str] = {}
"""README commands that do not parse today, each with the reason, until the README is corrected; a fixed one must
leave this list (the test fails on a listed command that parses)."""


def _segments(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split at |, &&, ;, >), comments dropped."""
    line = re.sub(r"<[A-Za-z][\w -]*>", "...", line)  # a placeholder (`arithmech <command> --help`), not a redirect
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    segments: list[list[str]] = [[]]
    try:
        for token in lexer:
            if token and set(token) <= set("|&;<>()"):
                segments.append([])
            else:
                segments[-1].append(token)
    except ValueError:  # an unbalanced quote in prose: no command to check
        return []
    return [s for s in segments if s]


def _arithmech_args(segment: list[str]) -> list[str] | None:
    """The arguments after `arithmech` (or `-m arithmech.cli` under accelerate/torchrun/python), else None."""
    while segment and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", segment[0]):  # CUDA_VISIBLE_DEVICES= ...
        segment = segment[1:]
    if segment and segment[0].rsplit("/", 1)[-1] == "arithmech":
        return segment[1:]
    if "arithmech.cli" in segment and segment[segment.index("arithmech.cli") - 1] == "-m":
        return segment[segment.index("arithmech.cli") + 1 :]
    return None


def shown_commands(page: Path) -> list[tuple[str, str, bool]]:
    """(where, command line, complete) for every arithmech command on a page: the lines of shell code blocks
    (complete: the command must parse whole) and inline code spans (which may leave out a required option)."""
    text = page.read_text()
    found: list[tuple[str, str, bool]] = []
    for block in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, re.S | re.M):
        if block.group(1) not in SHELL_FENCES:
            continue
        start = text[: block.start()].count("\n") + 2
        for offset, line in enumerate(block.group(2).replace("\\\n", " ").splitlines()):
            line = line.strip().removeprefix("$ ")
            for segment in _segments(line):
                if _arithmech_args(segment) is not None:
                    found.append((f"{page.name}:{start + offset}", shlex.join(segment), True))
    blocks = [m.span() for m in re.finditer(r"^```.*?^```", text, re.S | re.M)]
    for span in re.finditer(r"`([^`\n]+)`", text):
        if any(start <= span.start() < end for start, end in blocks):
            continue
        for segment in _segments(span.group(1)):
            if _arithmech_args(segment) is not None:
                line = text[: span.start()].count("\n") + 1
                found.append((f"{page.name}:{line}", shlex.join(segment), False))
    return found


def parse_error(command: str, complete: bool) -> str | None:
    """Why the real app refuses `command` (no such command or option, a bad value, an extra argument), or None.

    Nothing runs: the command's parameters are parsed by click as `arithmech` would, --help and --version set
    aside, and placeholders (`...`, `<command>` read as `...`) dropped.
    """
    args = _arithmech_args(shlex.split(command)) or []
    args = [a for a in args if a not in ("...", "--help", "--version")]
    command_obj = command_tree()
    ctx = command_obj.context_class(command_obj, info_name="arithmech")
    while hasattr(command_obj, "get_command") and args and not args[0].startswith("-"):
        sub = command_obj.get_command(ctx, args[0])
        if sub is None:
            return f"no command {args[0]!r} under {ctx.command_path!r}"
        command_obj, ctx = sub, sub.context_class(sub, info_name=args[0], parent=ctx)
        args = args[1:]
    if hasattr(command_obj, "get_command"):
        return f"{ctx.command_path!r} takes a command, not {args}" if args else None
    try:
        command_obj.make_context(ctx.info_name, list(args), parent=ctx.parent)  # click consumes the list
    except Exception as err:  # typer's own click: UsageError, NoSuchOption, BadParameter, MissingParameter
        named_only = type(err).__name__ == "BadOptionUsage" and args[-1:] == [getattr(err, "option_name", None)]
        if not complete and (type(err).__name__ == "MissingParameter" or named_only):  # prose: `run --out`
            return None
        if hasattr(err, "format_message"):
            return err.format_message()
        raise
    return None


def test_the_command_finder_and_checker_catch_what_they_should(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Run `arithmech identify --max-prompts 8` or `arithmech analyze mlp`; `arithmech <command> --help`.\n\n"
        "```bash\nCUDA_VISIBLE_DEVICES= arithmech knockout --from runs/a --max-k 4  # comment\n"
        "accelerate launch --num_processes 2 -m arithmech.cli identify \\\n  --bogus-option 3\n"
        "arithmech analyze attention\narithmech idenitfy\npip install .\n```\n"
    )
    found = {cmd: (where, complete) for where, cmd, complete in shown_commands(page)}
    assert list(found) == ["CUDA_VISIBLE_DEVICES= arithmech knockout --from runs/a --max-k 4",
                           "accelerate launch --num_processes 2 -m arithmech.cli identify --bogus-option 3",
                           "arithmech analyze attention", "arithmech idenitfy", "arithmech identify --max-prompts 8",
                           "arithmech analyze mlp", "arithmech ... --help"]
    assert found["arithmech identify --max-prompts 8"] == ("page.md:1", False)
    errors = {cmd: parse_error(cmd, complete) for cmd, (_, complete) in found.items()}
    assert errors["CUDA_VISIBLE_DEVICES= arithmech knockout --from runs/a --max-k 4"] is None
    assert "--bogus-option" in errors["accelerate launch --num_processes 2 -m arithmech.cli identify --bogus-option 3"]
    assert "--from" in errors["arithmech analyze attention"]  # a code block's command must be complete
    assert "idenitfy" in errors["arithmech idenitfy"]
    assert errors["arithmech analyze mlp"] is None and errors["arithmech ... --help"] is None  # prose: a name alone
    assert parse_error("arithmech run --out", complete=False) is None  # or an option
    assert "--out" in parse_error("arithmech run --out", complete=True)
    assert "max-prompts" in parse_error("arithmech identify --max-prompts many", complete=True)


def test_every_command_shown_in_the_readme_and_docs_parses() -> None:
    commands = [(where, cmd, complete) for page in PAGES for where, cmd, complete in shown_commands(page)]
    assert len(commands) > 40  # the README and the docs show many; a finder that finds none must fail
    failures = {}
    for where, command, complete in commands:
        error = parse_error(command, complete)
        known = where.startswith("README.md") and command in KNOWN_README_FAILURES
        if error and not known:
            failures[f"{where}: {command}"] = error
        if known and not error:
            failures[f"{where}: {command}"] = "parses now: remove it from KNOWN_README_FAILURES"
    assert not failures, "\n".join(f"{k}\n    {v}" for k, v in failures.items())


READ_OPTIONS = ("--from", "--identify", "--compare", "--delta", "--circuit-file")
"""Options whose value is a run folder (or a file in one) that an earlier command must have written."""
ANALYSIS_FOLDERS = {"attention": "attention", "mlp": "mlp", "fourier": "fourier", "agreement": "agreement"}


def _values(args: list[str], option: str) -> list[str]:
    """Every value of `option` in `args` (`--out X` and `--out=X`)."""
    return [args[i + 1] if a == option else a.split("=", 1)[1] for i, a in enumerate(args)
            if (a == option and i + 1 < len(args)) or a.startswith(option + "=")]  # fmt: skip


def written_folders(args: list[str]) -> list[str]:
    """The run folders a command writes: --out; `run`'s config's out; an analysis --from R without --out: R/<name>;
    a stage --from R without --out writes below R, which R already covers."""
    outs = _values(args, "--out")
    if outs:
        return outs
    config = _values(args, "--config")
    if args[:1] == ["run"] and config and (ROOT / config[0]).is_file():
        import yaml

        return [str(yaml.safe_load((ROOT / config[0]).read_text()).get("out", "runs/pipeline"))]
    if args[:1] == ["analyze"] and len(args) > 1 and args[1] in ANALYSIS_FOLDERS:
        return [f"{run}/{ANALYSIS_FOLDERS[args[1]]}" for run in _values(args, "--from")]
    return []


def read_folders(args: list[str]) -> list[str]:
    """The run folders (or files in them) a command reads: its READ_OPTIONS and `report`'s folder."""
    found = [value for option in READ_OPTIONS for value in _values(args, option)]
    return found + [a for a in args[1:2] if args[:1] == ["report"] and not a.startswith("-")]


def unmade_folders(page: Path) -> list[str]:
    """The commands of a page's code blocks that read a folder no earlier command on the page writes: a command in
    a code block, or one named in the prose as the prerequisite (an inline `arithmech ... --out runs/x`)."""
    commands = sorted(shown_commands(page), key=lambda c: int(c[0].rsplit(":", 1)[1]))
    written: list[Path] = []
    missing = []
    for where, command, complete in commands:
        args = _arithmech_args(shlex.split(command)) or []
        for folder in read_folders(args) if complete else ():
            path = Path(folder)
            made = any(path == w or w in path.parents or path in w.parents for w in written)
            if not made and folder != "..." and not (ROOT / path).exists():
                missing.append(f"{where}: {command}\n    reads {folder}, which no earlier command on the page writes")
        written += [Path(folder) for folder in written_folders(args)]
    return missing


def test_every_folder_a_command_reads_is_written_earlier_on_its_page(tmp_path: Path) -> None:
    """Issue 34.2: a page's commands run in the order shown on a fresh clone: a folder a command reads (--from,
    --identify, --compare, --delta, --circuit-file, report's) is written by an earlier command on the same page,
    or named in its prose with the command that makes it."""
    page = tmp_path / "page.md"
    page.write_text("Needs `arithmech identify --out runs/a`.\n\n```bash\narithmech knockout --from runs/a/x\n"
                    "arithmech analyze mlp --from runs/b\narithmech knockout --from runs/b/mlp\n"
                    "arithmech report runs/c\narithmech run --config configs/default-model.yaml\n"
                    "arithmech report runs/demo\n```\n")  # fmt: skip
    assert [m.split(": ")[1].split("\n")[0] for m in unmade_folders(page)] == [
        "arithmech analyze mlp --from runs/b", "arithmech report runs/c"]  # fmt: skip
    missing = [m for p in PAGES for m in unmade_folders(p)]
    assert not missing, "\n".join(missing)


def test_api_page_documents_exactly_the_top_level_names() -> None:
    documented = set(re.findall(r"^::: arithmech\.[\w.]*?\.?(\w+)$", (ROOT / "docs" / "api.md").read_text(), re.M))
    results_types = {name for name in documented if name.endswith("Results")}  # what run.<stage> returns
    assert documented - results_types == set(am.__all__) - {"__version__"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site, built as `make docs` builds it (strict), into a folder of its own."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]' (make test does)")
    pytest.importorskip("material", reason="mkdocs-material is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed: pip install -e '.[docs]'")
    built = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(built)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return built


GUIDES = ("identify", "validate", "explain", "mediation-and-neurons", "circuits", "improve-and-evaluate",
          "run-and-report", "scale")  # fmt: skip
"""One guide per capability."""


def test_docs_build_strictly_and_need_no_network(site: Path) -> None:
    pages = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    assert {"index.html", "getting-started.html", "tutorial.html", "api.html", "cli.html", "development.html",
            "methods.html", "results.html", "performance.html", "reliability.html",
            *(f"guides/{g}.html" for g in GUIDES)} <= pages  # fmt: skip
    assert not [p for p in pages if p.endswith("/index.html")]  # no page is a folder: the site works from disk
    assert (site / "figures" / "demo-effects-heatmap.png").is_file()
    cli = (site / "cli.html").read_text()
    for name in ("arithmech identify", "arithmech analyze attention", "arithmech run", "--max-prompts"):
        assert name in cli, name
    api = (site / "api.html").read_text()
    assert "fraction_threshold" in (site / "tutorial.html").read_text() and "open_run" in api
    for page in site.rglob("*.html"):
        html = page.read_text()
        remote = re.findall(r"<(?:script|link|img)\b[^>]*(?:src|href)=\"(?:https?:)?//[^\"]*\"", html)
        assert not remote, (page, remote[:3])  # a page that loads anything from elsewhere needs the network


def test_the_api_reference_keeps_placeholders_in_angle_brackets(site: Path) -> None:
    """Issue 34.17: `runs/circuit-<time>` and `<run_dir>/report.html` render whole (markdown reads a bare <time>
    as an HTML tag and drops it), in the built page and in every docstring the page renders."""
    api = (site / "api.html").read_text()
    for text in ("runs/circuit-&lt;time&gt;", "&lt;run_dir&gt;/report.html", "&lt;from_run&gt;/attention"):
        assert text in api, text
    bare = {}
    for path in re.findall(r"^::: ([\w.]+)", (ROOT / "docs" / "api.md").read_text(), re.M):
        module, name = path.rsplit(".", 1)
        doc = getattr(importlib.import_module(module), name).__doc__ or ""
        found = re.findall(r"<[A-Za-z_][\w-]*>", re.sub(r"`[^`]*`", "", doc))  # outside `code`
        if found:
            bare[path] = found
    assert not bare, f"write placeholders in backticks, e.g. `runs/x-<time>`: {bare}"


def test_the_site_is_browsed_from_disk_by_its_nav(site: Path, browser: Any) -> None:
    """Issue 34.16: opened as a file:// URL, every link of the navigation opens its page (a folder link would show
    the browser's folder listing instead)."""
    browser.set_window_size(1400, 1000)  # wide enough for the navigation sidebar
    home = (site / "index.html").as_uri()
    browser.get(home)
    nav = "nav.md-nav--primary a.md-nav__link[href]"
    links = browser.execute_script(f"return [...document.querySelectorAll('{nav}')].map(a => a.getAttribute('href'))")
    links = list(dict.fromkeys(h for h in links if not h.startswith(("#", "http"))))
    pages = re.findall(r"^\s+- [^:]+: ([\w/-]+)\.md$", (ROOT / "mkdocs.yml").read_text(), re.M)
    named = [re.sub(r"(/?index)?(\.html)?/?$", "", h).lstrip("./") or "index" for h in links]  # "guides/x/", "."
    assert named == pages  # every page of mkdocs.yml's nav, in its order
    visited = []
    for href in links:
        browser.get(home)
        link = browser.find_element("css selector", f'{nav}[href="{href}"]')
        browser.execute_script("arguments[0].click()", link)
        deadline = time.monotonic() + 20
        while browser.current_url == home and time.monotonic() < deadline:
            time.sleep(0.05)
        while browser.execute_script("return document.readyState") != "complete" and time.monotonic() < deadline:
            time.sleep(0.05)
        url = browser.current_url
        heading = browser.execute_script("const h = document.querySelector('article h1'); return h && h.textContent")
        title = browser.title
        assert url.startswith("file://") and url.split("#")[0].endswith(".html"), (href, url)
        assert heading and not title.startswith("Index of"), (href, url, title)
        visited.append(url)
    assert len(set(visited)) == len(links)


def test_readme_is_short_and_every_link_in_it_resolves() -> None:
    """The README holds the ten lines a newcomer needs (set-up first, a figure, a quickstart) and links into docs/
    for the rest; a link to a moved or renamed page, or a figure that is not committed, fails here (GitHub renders
    the README from the repository, where mkdocs' strict build does not look)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert re.search(r"^```bash\nmake demo .*\nmake test ", text, re.M)  # the two set-up commands come first
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) + re.findall(r'<img src="([^"]+)"', text)
    assert any(t.endswith(".png") for t in targets) and len([t for t in targets if t.startswith("docs/")]) > 10
    missing = [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()]
    assert not missing, missing

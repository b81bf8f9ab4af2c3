"""`arithmech report`: one self-contained HTML page of a real (tiny) run, checked as text and in headless Chromium.

The run is made by `arithmech run` on the tiny Llama with every stage. The browser test needs Chromium and
chromedriver (Debian: `apt-get install chromium chromium-driver`, installed here when missing and we are root)
and selenium; without them it is skipped with the reason. Its screenshot goes to tests/artifacts/report.png.
"""

from __future__ import annotations

import base64
import csv
import json
import shutil
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml

from arithmech.cli import main
from arithmech.report.html import write_report
from arithmech.report.plots import save_figure
from arithmech.report.style import styled

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
STAGES = ("identify", "knockout", "transfer", "attention", "mlp", "fourier", "mediation", "agreement", "neurons",
          "heuristics", "numbers", "circuit", "finetune", "evaluate")  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of every stage on the tiny Llama, with settings that take seconds."""
    root = tmp_path_factory.mktemp("report")
    rows = [{"id": f"t{i}", "question": f"What is {i} plus 1?", "answer": str(i + 1), "rationale": f"{i} + 1."}
            for i in range(8)]  # fmt: skip
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    config = {
        "out": str(root / "run"), "model": {"model": str(tiny_model_dir("llama"))}, "stages": list(STAGES),
        "identify": {"filter_correct": False, "formations": ["equation"], "n_per_template": 2},
        "knockout": {"max_k": 2, "n_random": 1, "max_prompts": 4},
        "transfer": {"targets": ["addition", "subtraction"], "n_random": 1, "max_prompts": 4, "filter_correct": False,
                     "n_per_template": 1, "few_shot": 1},
        "attention": {"max_prompts": 4}, "mlp": {"max_prompts": 4}, "fourier": {"max_prompts": 4, "cutoffs": [1, 3]},
        "mediation": {"n_pairs": 2, "few_shot": 1, "neuron_k": 5},
        "agreement": {"methods": ["path", "attribution"], "max_prompts": 4},
        "neurons": {"operations": ["addition", "subtraction"], "max_prompts": 3, "filter_correct": False,
                    "few_shot": 1, "top_heads": 2, "top_neurons": 4, "keep_sizes": [0, 8], "n_random": 2,
                    "lora_steps": 2, "lora_rank": 2},
        "heuristics": {"operations": ["addition", "subtraction"], "filter_correct": False, "few_shot": 1,
                       "max_pairs": 12, "layers": [1, 2], "ks": [1, 2], "n_random": 1, "top_neurons": 2},
        "numbers": {"filter_correct": False, "max_pairs": 40, "max_prompts": 6, "layers": [1], "shuffles": 2,
                    "few_shot": 1, "head_top_k": 2},
        "circuit": {"keep_incorrect": True, "n_prompts": 2, "percents": [1, 10, 100], "batch_size": 2, "steps": 2,
                    "evaluate": True, "compare_methods": ["path-patching", "random"]},
        "finetune": {"top_k": 2, "data": str(root / "train.jsonl"), "batch_size": 4, "micro_batch_size": 4,
                     "max_steps": 1, "target": "answer", "chat_template": False, "lr": 0.01},
        "evaluate": {"benchmarks": [str(root / "bench.jsonl")], "n_shot": 0, "max_new_tokens": 3},
    }  # fmt: skip
    (root / "run.yaml").write_text(yaml.safe_dump(config))
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only fight over the shared cores
    try:
        assert main(["run", "--config", str(root / "run.yaml"), "--quiet"]) == 0
    finally:
        torch.set_num_threads(threads)
    return root / "run"


class _Page(HTMLParser):
    """What a test needs of the page: images (id -> src), section statuses, every attribute value."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.images: dict[str, str] = {}
        self.status: dict[str, str] = {}
        self.values: list[str] = []
        self._section = ""
        self._in_status = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.values += [v for v in found.values() if v]
        if tag == "img":
            self.images[str(found.get("id"))] = str(found.get("src"))
        if tag == "section":
            self._section = str(found.get("id"))
        self._in_status = tag == "span" and "status" in str(found.get("class")) and self._section not in self.status

    def handle_data(self, data: str) -> None:
        if self._in_status and self._section:  # the first status badge of a section: its heading's
            self.status[self._section] = data
            self._in_status = False


def _figures_on_disk(folder: Path) -> dict[str, Path]:
    """stage -> its PNGs, as the report should show them: id fig-<stage>-<stem>-img."""
    found = {}
    for stage in STAGES:
        for png in sorted((folder / stage).glob("*.png")) if (folder / stage).is_dir() else []:
            found[f"fig-{stage}-{png.stem}-img"] = png
    return found


def test_every_stage_has_its_section_and_figures(run_dir: Path) -> None:
    path = write_report(run_dir)
    assert path == run_dir / "report.html"
    text = path.read_text()
    page = _Page(text)
    assert page.status == dict.fromkeys(STAGES, "done")
    expected = _figures_on_disk(run_dir)
    assert len(expected) == 20  # identify, knockout, transfer, agreement, circuit 1 each; attention, mlp, fourier,
    # mediation, neurons, numbers 2; heuristics 3
    assert set(page.images) == set(expected)
    for ident, png in expected.items():  # the embedded image is the stage's own file, byte for byte
        assert base64.b64decode(page.images[ident].removeprefix("data:image/png;base64,")) == png.read_bytes()
        svg = png.with_suffix(".svg")  # save_figure writes an SVG twin of every PNG
        assert svg.is_file() and "<svg" in svg.read_text()[:2000], svg
    assert "http://" not in text and "https://" not in text  # self-contained: no link, script or font from elsewhere
    assert all(not v.startswith(("http:", "https:", "//")) for v in page.values)
    assert "<script" not in text and "<link" not in text
    assert '<div class="drawing"><svg' in text and '<path class="edge"' in text  # the circuit, inline
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".report")]  # no temporary file left


def test_readings_quote_the_files(run_dir: Path) -> None:
    text = write_report(run_dir, run_dir.parent / "elsewhere" / "r.html").read_text()
    effects = list(csv.DictReader((run_dir / "identify" / "effects.csv").open()))
    head = min((r for r in effects if r["kind"] == "head"), key=lambda r: float(r["effect"]))
    assert f"The strongest head is {head['component']} ({float(head['effect']) * 100:+.1f}%)" in text
    meta = json.loads((run_dir / "finetune" / "metadata.json").read_text())
    assert f"trained {meta['trainable_parameters']:,} of {meta['total_parameters']:,} parameters" in text
    roles = list(csv.DictReader((run_dir / "attention" / "attention_roles.csv").open()))
    assert f'<td class="n">{float(roles[0]["A"]):.2f}</td>' in text  # numbers are right-aligned cells
    assert 'href="../run/identify/effects_heatmap.svg"' in text  # file links are relative to the report


def _write(folder: Path, name: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def test_knockout_and_evaluate_readings_from_known_numbers(tmp_path: Path) -> None:
    """The readings are written from the numbers: known files give a known sentence."""
    run = tmp_path / "run"
    ko = run / "knockout"
    _write(ko, "knockout.csv", "k,ranking,seed,accuracy,mean_prob,components\n0,none,,1.0,0.76,\n"
           "1,effect,,0.59,0.44,14.2\n4,effect,,0.47,0.35,14.2 18.5 13.6 20.8\n4,random,0,0.9,0.7,1.0 2.0 3.0 4.0\n")
    _write(ko, "knockout_summary.csv", "k,effect_accuracy,random_accuracy_mean,random_accuracy_std,effect_prob,"
           "random_prob_mean,random_prob_std\n1,0.59,1.0,0.0,0.44,0.75,0.01\n4,0.47,0.91,0.05,0.35,0.7,0.02\n")
    _write(ko, "metadata.json", json.dumps({"config": {"ablation": "mean", "n_random": 3}, "counts": {"prompts": 32}}))
    ev = run / "evaluate"
    header = "benchmark,kind,n,correct,accuracy,accuracy_norm,perplexity,base_perplexity,kl,excluded,seconds\n"
    _write(ev / "base", "results.csv", header + "gsm8k,generate,100,10,0.10,,,,,0,1\n")
    _write(ev / "tuned", "results.csv", header + "gsm8k,generate,100,14,0.14,,,,,0,1\n")
    for folder in (ev, ev / "base", ev / "tuned"):
        _write(folder, "metadata.json", "{}")
    text = write_report(run).read_text()
    assert ("On 32 prompts, knocking out the top 1 head drops accuracy from 100% to 59%, the top 4 (14.2, 18.5, 13.6 "
            "and 20.8) to 47%, while 4 random heads leave 91% ± 5%. Effect-ranked heads matter more than random "
            "ones. Settings: 3 random draws, mean ablation.") in text  # fmt: skip
    assert "gsm8k (n=100): 10.0% base, 14.0% tuned (+4.0 points)" in text
    page = _Page(text)
    assert page.status["identify"] == "not run" and page.status["knockout"] == "done"
    assert not page.images  # no figure file, no figure


def test_knockout_reading_puts_the_held_out_curve_first(tmp_path: Path) -> None:
    """A knockout of two prompt sets reads the held-out curve first, then the in-sample one, and compares them;
    the table names each row's set."""
    run = tmp_path / "run"
    ko = run / "knockout"
    _write(ko, "knockout.csv", "prompt_set,k,ranking,seed,accuracy,mean_prob,components\n"
           "held_out,0,none,,1.0,0.7,\nheld_out,2,effect,,0.8,0.5,14.2 18.5\nheld_out,2,random,0,0.9,0.6,1.0 2.0\n"
           "in_sample,0,none,,1.0,0.8,\nin_sample,2,effect,,0.4,0.3,14.2 18.5\nin_sample,2,random,0,0.95,0.7,1.0 2.0\n")
    _write(ko, "knockout_summary.csv", "prompt_set,k,effect_accuracy,random_accuracy_mean,random_accuracy_std,"
           "effect_prob,random_prob_mean,random_prob_std\nheld_out,2,0.8,0.9,,0.5,0.6,\n"
           "in_sample,2,0.4,0.95,,0.3,0.7,\n")
    meta = {"config": {"ablation": "mean", "n_random": 1}, "counts": {"prompts": {"held_out": 20, "in_sample": 30}},
            "split": "held out (...), then in sample (...)"}  # fmt: skip
    _write(ko, "metadata.json", json.dumps(meta))
    text = write_report(run).read_text()
    held = ("On 20 held-out prompts (the run&#x27;s templates; no prompt and no fact the ranking saw), knocking out "
            "the top 2 heads drops accuracy from 100% to 80%, while 2 random heads leave 90% ± n/a.")
    in_sample = ("On the 30 prompts the ranking was made on (in sample), knocking out the top 2 heads drops accuracy "
                 "from 100% to 40%, while 2 random heads leave 95% ± n/a. Effect-ranked heads matter more than random "
                 "ones.")  # fmt: skip
    assert held in text and in_sample in text and text.index(held) < text.index(in_sample)
    assert "cost 10% of accuracy more than random ones held out, against 55% in sample" in text
    page = _Page(text)
    assert page.status["knockout"] == "done"
    assert text.index("<td>held out</td>") < text.index("<td>in sample</td>")


def test_missing_unfinished_and_unreadable_stages(run_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("report.html", "lora_adapter", "*.safetensors"))
    shutil.rmtree(copy / "mediation")
    shutil.rmtree(copy / "neurons")
    (copy / "knockout" / "metadata.json").unlink()  # knockout did not finish
    (copy / "attention" / "attention_roles.csv").write_text("nothing,useful\n1,2\n")  # finished but malformed
    text = write_report(copy).read_text()
    page = _Page(text)
    assert page.status["mediation"] == page.status["neurons"] == "not run"
    assert page.status["knockout"] == "did not finish"
    assert page.status["attention"] == "could not be read"
    assert "KeyError" in text and "This stage was not run" in text
    assert not any(ident.startswith(("fig-knockout", "fig-mediation", "fig-neurons", "fig-attention"))
                   for ident in page.images)  # fmt: skip
    assert "fig-identify-effects_heatmap-img" in page.images and "fig-mlp-mlp_cosines-img" in page.images


def test_flat_layout_of_separate_commands(run_dir: Path, tmp_path: Path) -> None:
    """`arithmech identify --out R` puts identify's files in R; `--from R` stages write R/<stage>."""
    flat = tmp_path / "demo"
    shutil.copytree(run_dir / "identify", flat)
    for stage in ("knockout", "attention", "mlp", "agreement"):
        shutil.copytree(run_dir / stage, flat / stage)
    text = write_report(flat).read_text()
    page = _Page(text)
    assert {s for s, v in page.status.items() if v == "done"} == {"identify", "knockout", "attention", "mlp",
                                                                 "agreement"}  # fmt: skip
    assert page.status["transfer"] == "not run"
    assert "(flat layout)" in text and "fig-identify-effects_heatmap-img" in page.images


def test_cli_and_bad_input(run_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.html"
    assert main(["report", str(run_dir), "--out", str(out), "--quiet"]) == 0
    assert str(out) in capsys.readouterr().out and out.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "holds no stage folders" in capsys.readouterr().err


def test_save_figure_writes_a_reproducible_svg_twin_and_style_does_not_leak(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before = dict(matplotlib.rcParams)

    @styled
    def line(path: Path) -> str:
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        colour = ax.lines[0].get_color()
        save_figure(fig, path)
        return colour

    assert line(tmp_path / "a.png") == "#0072B2"  # the first Okabe-Ito colour
    first = (tmp_path / "a.svg").read_bytes()
    line(tmp_path / "a.png")
    assert (tmp_path / "a.svg").read_bytes() == first  # no date, fixed ids
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "a.svg"]
    assert dict(matplotlib.rcParams) == before


# --- in a browser -------------------------------------------------------------------------------------------


def _load(driver: Any, path: Path) -> tuple[dict[str, int], list[str]]:
    """Open a page; return every image's naturalWidth by id and the console's error messages."""
    driver.get_log("browser")  # drop messages of earlier pages
    driver.get(path.resolve().as_uri())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ready = "return document.readyState === 'complete' && [...document.images].every(i => i.complete)"
        if driver.execute_script(ready):
            break
        time.sleep(0.1)
    widths = dict(driver.execute_script("return [...document.images].map(i => [i.id, i.naturalWidth])"))
    errors = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    return widths, errors


def test_report_renders_in_chromium(browser: Any, run_dir: Path, tmp_path: Path) -> None:
    control = tmp_path / "broken.html"  # the checks must catch a broken page, or they prove nothing
    control.write_text('<!DOCTYPE html><html><body><img id="bad" src="data:image/png;base64,AAAA">'
                       '<script>console.error("control error")</script></body></html>')  # fmt: skip
    widths, errors = _load(browser, control)
    assert widths == {"bad": 0} and any("control error" in e for e in errors)

    widths, errors = _load(browser, write_report(run_dir))
    assert errors == []
    assert set(widths) == set(_figures_on_disk(run_dir))
    assert all(width > 0 for width in widths.values()), widths
    ARTIFACTS.mkdir(exist_ok=True)
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    (ARTIFACTS / "report.png").write_bytes(base64.b64decode(shot["data"]))
    assert (ARTIFACTS / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mediation_reading_names_the_peaks_and_the_last_token_mlp(tmp_path: Path) -> None:
    run = tmp_path / "run"
    med = run / "mediation"
    rows = ["addition,mlp,0,operand2,60,1.7,4", "addition,mlp,29,last,3.1,1.4,4", "addition,mlp,28,last,0.2,0.1,4",
            "addition,attn,23,last,0.6,0.5,4", "addition,attn,22,operand1,0.1,-0.2,4"]
    _write(med, "mediation_by_class.csv", "task,component,layer,class,mean_ie,median_ie,n_pairs\n" + "\n".join(rows))
    _write(med, "mediation_total.csv", "task,pairs,mean_te,median_te,number_accuracy\naddition,4,2.5,1.5,0.75\n")
    _write(med, "metadata.json", "{}")
    text = write_report(run).read_text()
    assert ("For addition the largest median indirect effects are the MLP of layer 0 at the operand2 position "
            "(median IE 1.7, mean 60) and the attention of layer 23 at the last position (median IE 0.5, mean 0.6). "
            "At the last token the MLP of layer 29 has the largest (median IE 1.4).") in text  # fmt: skip

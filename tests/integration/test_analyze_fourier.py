"""analyze-fourier end to end: an identify run on a tiny model -> the spectra, filter table, figures and
metadata; the CLI and the report section; a tokenizer with number tokens 0..99; bad input is one clear error."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from arithmech.cli import main
from arithmech.errors import ConfigError
from arithmech.models.hooks import count_hooks
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.models.predictions import predict_at_end
from arithmech.report.html import write_report
from arithmech.stages.fourier import FourierResult, analyze_fourier, default_cutoffs
from arithmech.stages.fourier_config import FourierConfig

from run_folders import check_intact, nonfinite
from tiny_models import save_multidigit_model_dir

pytestmark = pytest.mark.usefixtures("one_thread")
FILES = ("fourier_spectrum.csv", "fourier_spectrum.png", "fourier_spectrum.svg", "fourier_shares.csv",
         "fourier_filters.csv", "fourier_filters.png", "fourier_filters.svg", "metadata.json")  # fmt: skip
IDENTIFY = ["--keep-incorrect", "--formations", "equation", "--n-per-template", "2", "--quiet"]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelHandle, Path, Path]:
    """The tiny llama, its folder and an identify run made with it (prompts kept even where it is wrong)."""
    model_dir = tiny_model_dir("llama")
    run = tmp_path_factory.mktemp("identify") / "run"
    assert main(["identify", "--model", str(model_dir), *IDENTIFY, "--out", str(run)]) == 0
    return load_model(ModelConfig(model=str(model_dir))), model_dir, run


@pytest.fixture(scope="module")
def fourier(tiny: tuple[ModelHandle, Path, Path]) -> FourierResult:
    handle, _, run = tiny
    cfg = FourierConfig(batch_size=3, cutoffs=(0, 1, 2, 5))
    return analyze_fourier(handle, cfg, run, run / "fourier", quiet=True)


def test_writes_spectra_filters_figures_and_metadata(tiny: tuple[ModelHandle, Path, Path], fourier: FourierResult):
    handle, _, run = tiny
    out = fourier.out_dir
    assert all((out / name).is_file() for name in FILES)
    check_intact(out)
    assert nonfinite(out) == []
    assert count_hooks(handle.model) == 0
    n_layers = handle.dims.n_layers
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["numbers"]["count"] == 10 and meta["numbers"]["digit_splitting"]  # the byte tokenizer's digits
    assert [label for _, _, label in meta["numbers"]["tokens"]] == list("0123456789")

    rows = list(csv.DictReader((out / "fourier_spectrum.csv").open()))
    assert len(rows) == 2 * n_layers * 6  # attention and MLP x layers x frequencies 0..5
    for row in rows:
        assert float(row["magnitude"]) == pytest.approx(
            fourier.magnitude[row["component"]][int(row["layer"]), int(row["frequency"])], rel=1e-5
        )
    assert all(float(r["magnitude"]) > 0 for r in rows)
    for row in rows:  # power = m(f) |X|^2, one value per real dimension: 1 at f = 0 and f = 5, 2 between
        m = 1 if row["frequency"] in ("0", "5") else 2
        assert float(row["power"]) >= m * float(row["magnitude"]) ** 2 * (1 - 1e-5)  # mean of squares >= square

    shares = {r["component"]: r for r in csv.DictReader((out / "fourier_shares.csv").open())}
    assert sorted(shares) == ["attention", "mlp"]
    for kind, share in shares.items():
        power = {f: sum(float(r["power"]) for r in rows if r["component"] == kind and int(r["frequency"]) == f)
                 for f in range(6)}  # fmt: skip
        expected = (power[3] + power[4] + power[5]) / sum(power[f] for f in range(1, 6))
        assert share["high_frequencies"] == "3-5" and float(share["high_share"]) == pytest.approx(expected, rel=1e-4)
        assert float(share["flat_share"]) == pytest.approx(5 / 9, rel=1e-5)  # 5 of the 9 non-constant dimensions
        assert 0 < float(share["random_mean"]) < 1 and float(share["random_std"]) > 0
        assert int(share["random_draws"]) == 32
        assert meta["high_frequency_share"][kind]["high_share"] == pytest.approx(float(share["high_share"]), rel=1e-5)
    assert meta["high_frequency_share"]["flat"] == pytest.approx(5 / 9)

    filters = list(csv.DictReader((out / "fourier_filters.csv").open()))
    assert [(r["component"], r["filter"], int(r["cutoff"])) for r in filters] == [
        (g, f, c) for g in ("attention", "mlp") for f in ("low-pass", "high-pass") for c in (0, 1, 2, 5)
    ]
    # The unfiltered accuracy is the model's own; a filter that removes nothing leaves it exactly.
    tok = fourier_prompts(handle, run)
    plain = predict_at_end(handle.view, *tok)
    assert meta["baseline"]["accuracy"] == pytest.approx(float(plain.correct.float().mean()))
    assert meta["baseline"]["answer_prob"] == pytest.approx(float(plain.answer_prob.mean()), rel=1e-6)
    for r in filters:
        removes_nothing = (r["filter"], r["cutoff"]) in (("low-pass", "5"), ("high-pass", "0"))
        assert (r["removed_frequencies"] == "none") == removes_nothing and (r["directions"] == "0") == removes_nothing
        if removes_nothing:
            assert float(r["answer_prob"]) == pytest.approx(meta["baseline"]["answer_prob"], rel=1e-5)  # .6g
    low0 = next(r for r in filters if (r["component"], r["filter"], r["cutoff"]) == ("mlp", "low-pass", "0"))
    assert low0["removed_frequencies"] == "1-5" and low0["directions"] == "9"  # cos and sin of 1..4, and f = 5
    assert abs(float(low0["answer_prob_change"])) > 1e-4  # cutting nine directions out of every MLP shows
    assert (out / "metadata.json").stat().st_mtime_ns >= (out / "fourier_filters.png").stat().st_mtime_ns


def fourier_prompts(handle: ModelHandle, run: Path) -> tuple:
    from arithmech.data import tokenize_pairs
    from arithmech.data.io import read_prompt_file
    from arithmech.data.sampling import sample_pairs

    pairs, _ = sample_pairs(read_prompt_file(run / "prompts.jsonl"), 128, 0)
    t, _ = tokenize_pairs(handle.tokenizer, pairs)
    return t.ref_ids, t.ref_mask, t.end, t.answer_ids


def test_layers_and_batch_size_do_not_change_the_spectra(
    tiny: tuple[ModelHandle, Path, Path], fourier: FourierResult, tmp_path: Path
) -> None:
    handle, _, run = tiny
    some = analyze_fourier(handle, FourierConfig(batch_size=1, layers=(2, 0), cutoffs=(1,), groups=("mlp",)), run,
                           tmp_path / "f", quiet=True)  # fmt: skip
    assert some.layers == [0, 2]
    for kind in ("attention", "mlp"):
        np.testing.assert_allclose(some.magnitude[kind], fourier.magnitude[kind][[0, 2]], rtol=1e-5, atol=1e-7)
    assert [(r["component"], r["filter"]) for r in some.filters] == [("mlp", "low-pass"), ("mlp", "high-pass")]


def test_cli_and_report_section(tiny: tuple[ModelHandle, Path, Path], fourier: FourierResult, capsys) -> None:
    _, model_dir, run = tiny
    out = run / "fourier-cli"
    args = ["analyze", "fourier", "--from", str(run), "--model", str(model_dir), "--out", str(out), "--quiet"]
    assert main([*args, "--cutoffs", "2", "--end-only", "--filters", "low-pass"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("(flat spectrum 55.6%; random directions of the same norms") == 2  # every share, its levels
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["config"]["end_only"] and meta["config"]["cutoffs"] == [2]
    assert len(list(csv.DictReader((out / "fourier_filters.csv").open()))) == 2  # attention and MLP, one cutoff
    page = write_report(run).read_text()  # the flat layout: identify in run/, fourier in run/fourier
    assert "Fourier features of the number tokens" in page
    assert "frequencies 0..5" in page and "Without a filter the model answers" in page
    assert page.count("55.6% of a flat spectrum; ") == 2 and page.count("random directions of the same norms, ") == 2


def test_multidigit_number_tokens(tmp_path: Path) -> None:
    """A tokenizer with a token for each of 0..99: the number index has 100 values, frequencies 0..50."""
    model_dir = save_multidigit_model_dir("llama", tmp_path / "model")
    run = tmp_path / "run"
    assert main(["identify", "--model", str(model_dir), *IDENTIFY, "--out", str(run)]) == 0
    handle = load_model(ModelConfig(model=str(model_dir)))
    result = analyze_fourier(handle, FourierConfig(batch_size=4, groups=("attention",)), run, tmp_path / "f",
                             quiet=True)  # fmt: skip
    numbers = result.metadata["numbers"]
    assert numbers["count"] == 100 and not numbers["digit_splitting"] and numbers["max_frequency"] == 50
    assert [label for _, _, label in numbers["tokens"]][10:13] == ["10", "11", "12"]
    assert result.magnitude["mlp"].shape == (handle.dims.n_layers, 51)
    assert [r["cutoff"] for r in result.filters if r["filter"] == "low-pass"] == default_cutoffs("low-pass", 100)
    assert default_cutoffs("low-pass", 100) == [0, 1, 2, 3, 5, 10, 20, 49]
    assert default_cutoffs("high-pass", 100) == [1, 2, 3, 5, 10, 20, 50]
    top = next(r for r in result.filters if (r["filter"], r["cutoff"]) == ("high-pass", 50))
    assert top["directions"] == 64 == handle.dims.d_model  # 99 directions of 0..49 span the whole residual
    with pytest.raises(ConfigError, match="only 0..99 are single tokens; choose --numbers 100 or fewer"):
        analyze_fourier(handle, FourierConfig(numbers=101), run, tmp_path / "g", quiet=True)
    small = analyze_fourier(handle, FourierConfig(numbers=20, cutoffs=(3,), groups=("mlp",)), run, tmp_path / "h",
                            quiet=True)  # fmt: skip
    assert small.magnitude["attention"].shape[1] == 11 and small.metadata["numbers"]["single_token_numbers"] == 100


def test_bad_input_is_one_clear_error(tiny: tuple[ModelHandle, Path, Path], tmp_path: Path) -> None:
    handle, model_dir, run = tiny
    with pytest.raises(ConfigError, match="only 0..9 are single tokens .it splits longer numbers into digits.; "
                                          "choose --numbers 10 or fewer"):  # fmt: skip
        analyze_fourier(handle, FourierConfig(numbers=12), run, tmp_path / "x", quiet=True)
    with pytest.raises(ConfigError, match="layer 7 does not exist"):
        analyze_fourier(handle, FourierConfig(layers=(0, 7)), run, tmp_path / "x", quiet=True)
    with pytest.raises(ConfigError, match="cutoff 6 is above the highest frequency 5 of the 10 numbers"):
        analyze_fourier(handle, FourierConfig(cutoffs=(1, 6)), run, tmp_path / "x", quiet=True)
    with pytest.raises(ConfigError, match="its own folder"):
        analyze_fourier(handle, FourierConfig(), run, run, quiet=True)
    for bad, message in (({"numbers": 1}, "at least 2"), ({"groups": ("heads",)}, "drawn from attention, mlp"),
                         ({"filters": ("band-pass",)}, "drawn from low-pass, high-pass"),
                         ({"cutoffs": (-1,)}, "non-negative")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            FourierConfig(**bad)
    assert not (tmp_path / "x" / "metadata.json").exists()
    # The CLI: one sentence, no traceback, before the model loads.
    args = ["analyze", "fourier", "--from", str(run), "--model", str(model_dir), "--groups", "heads", "--quiet"]
    assert main(args) != 0

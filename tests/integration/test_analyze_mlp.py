"""analyze-mlp end to end: an identify run folder on a tiny model -> the logit-lens tables, figures and
metadata; bad input is one clear error; and on the real default model, the paper's Figure 6 pattern."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from arithmech.analysis.logit_lens import COSINE_COLUMNS
from arithmech.cli import main
from arithmech.errors import ConfigError, DataError
from arithmech.models.hooks import count_hooks
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.stages.analyze_mlp import MlpLensResult, analyze_mlp
from arithmech.stages.analyze_mlp_config import AnalyzeMlpConfig
from arithmech.stages.identify import identify
from arithmech.stages.identify_config import IdentifyConfig

FILES = (
    "mlp_cosines.csv",
    "mlp_cosines.png",
    "mlp_update_ranks.csv",
    "mlp_update_ranks.png",
    "metadata.json",
)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelHandle, Path]:
    """The tiny llama and an identify run made with it (prompts kept even where the model is wrong)."""
    model_dir = tiny_model_dir("llama")
    run = tmp_path_factory.mktemp("identify") / "run"
    args = ["identify", "--model", str(model_dir), "--keep-incorrect", "--formations", "equation"]
    assert main([*args, "--n-per-template", "2", "--out", str(run), "--quiet"]) == 0
    return load_model(ModelConfig(model=str(model_dir))), run


@pytest.fixture(scope="module")
def lens(tiny: tuple[ModelHandle, Path], tmp_path_factory: pytest.TempPathFactory) -> MlpLensResult:
    handle, run = tiny
    out = tmp_path_factory.mktemp("lens") / "mlp"
    return analyze_mlp(handle, AnalyzeMlpConfig(example_prompt=1, batch_size=3), run, out, quiet=True)


def test_writes_tables_figures_and_metadata(tiny: tuple[ModelHandle, Path], lens: MlpLensResult) -> None:
    handle, run = tiny
    out, result = lens.out_dir, lens
    assert all((out / name).is_file() for name in FILES)
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left
    assert count_hooks(handle.model) == 0
    n_layers, n_prompts = handle.dims.n_layers, len(result.cosines["cos_in_A"][0])

    rows = list(csv.DictReader((out / "mlp_cosines.csv").open()))
    assert [int(r["layer"]) for r in rows] == list(range(n_layers))
    for name in COSINE_COLUMNS:
        values = np.array([float(r[name]) for r in rows])
        assert np.all(np.abs(values) <= 1.0)
        np.testing.assert_allclose(values, result.mean[name], atol=1e-5)

    ranks = list(csv.DictReader((out / "mlp_update_ranks.csv").open()))
    assert len(ranks) == n_layers * 10  # the byte tokenizer's ten digit tokens
    assert {r["token"] for r in ranks} == set("0123456789")
    assert all(
        0 <= int(r["rank"]) < handle.dims.d_vocab and 0 <= int(r["rank_among_numbers"]) < 10 for r in ranks
    )

    meta = json.loads((out / "metadata.json").read_text())
    assert meta["stage"] == "analyze-mlp" and meta["config"]["example_prompt"] == 1
    assert meta["counts"]["prompts"] == n_prompts == meta["counts"]["prompts_in_run"]
    assert meta["example"]["reference"] == result.example["reference"] and meta["identify_runs"][0][
        "path"
    ] == str(run)
    assert (out / "metadata.json").stat().st_mtime_ns >= (out / "mlp_update_ranks.png").stat().st_mtime_ns


def test_layers_and_batch_size_do_not_change_values(
    tiny: tuple[ModelHandle, Path], lens: MlpLensResult, tmp_path: Path
) -> None:
    handle, run = tiny
    whole = lens  # batch_size 3, all layers
    cfg = AnalyzeMlpConfig(batch_size=1, layers=(2, 0), example_prompt=1)
    some = analyze_mlp(handle, cfg, run, tmp_path / "b", quiet=True)
    assert some.layers == [0, 2]  # sorted, so the curves run left to right
    for name in COSINE_COLUMNS:
        np.testing.assert_allclose(some.cosines[name], whole.cosines[name][[0, 2]], atol=1e-5)
    np.testing.assert_array_equal(some.ranks, whole.ranks[[0, 2]])


def test_bad_input_is_one_clear_error(tiny: tuple[ModelHandle, Path], tmp_path: Path) -> None:
    handle, run = tiny
    with pytest.raises(ConfigError, match="example prompt index 99 is out of range"):
        analyze_mlp(handle, AnalyzeMlpConfig(example_prompt=99), run, tmp_path / "x", quiet=True)
    with pytest.raises(ConfigError, match="layer 7 does not exist"):
        analyze_mlp(handle, AnalyzeMlpConfig(layers=(0, 7)), run, tmp_path / "x", quiet=True)
    with pytest.raises(ConfigError, match="its own folder"):
        analyze_mlp(handle, AnalyzeMlpConfig(), run, run, quiet=True)
    with pytest.raises(ConfigError, match="example_prompt 5 is not among the 4 prompts"):
        AnalyzeMlpConfig(max_prompts=4, example_prompt=5)
    with pytest.raises(ConfigError, match="distinct"):
        AnalyzeMlpConfig(layers=(1, 1))
    # A bring-your-own prompt file without operands: say which fields are needed.
    bare = tmp_path / "bare-run"
    shutil.copytree(run, bare)
    rows = [json.loads(line) for line in (bare / "prompts.jsonl").read_text().splitlines()]
    stripped = [{k: v for k, v in row.items() if k not in ("a", "b", "spans")} for row in rows]
    (bare / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in stripped))
    with pytest.raises(DataError, match="needs the fields a and b"):
        analyze_mlp(handle, AnalyzeMlpConfig(), bare, tmp_path / "y", quiet=True)
    assert not (tmp_path / "y" / "metadata.json").exists()


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_post_mlp_norm_with_weights(tiny_model_dir, tmp_path: Path, arch: str) -> None:
    """Issue #13: Gemma 2/3 pass the MLP update through a post-feedforward norm with a weight, so outside
    torch.no_grad() it required grad and `analyze mlp` failed on .numpy(). The user's two commands, as run."""
    model, run = str(tiny_model_dir(arch)), tmp_path / "run"
    args = ["--model", model, "--keep-incorrect", "--formations", "equation", "--n-per-template", "2"]
    assert main(["identify", *args, "--out", str(run), "--quiet"]) == 0
    out = tmp_path / "mlp"
    assert main(["analyze", "mlp", "--from", str(run), "--model", model, "--out", str(out), "--quiet"]) == 0
    rows = list(csv.DictReader((out / "mlp_cosines.csv").open()))
    values = np.array([[float(r[name]) for name in COSINE_COLUMNS] for r in rows])  # [layer, column]
    assert len(rows) == (3 if arch == "gemma3" else 2)  # one row per layer
    assert np.all(np.isfinite(values)) and np.all(np.abs(values) <= 1.0)


@pytest.mark.default_model
def test_default_model_late_mlps_write_the_answer(tmp_path: Path) -> None:
    """SmolLM2-135M: in the last third of the layers the MLP inputs hold A and B more than other digits, and
    the MLP updates point at the answer C more than at other digits (paper Figure 6a/6b)."""
    pytest.importorskip("gguf")
    handle = load_model()
    run = tmp_path / "run"
    # The identify stage itself (what `arithmech identify --formations equation --n-per-template 2
    # --max-prompts 8` runs), so that the 135M model is loaded once.
    identify(
        handle, IdentifyConfig(formations=("equation",), n_per_template=2, max_prompts=8), run, quiet=True
    )
    result = analyze_mlp(handle, AnalyzeMlpConfig(), run, tmp_path / "mlp", quiet=True)
    late = slice(2 * handle.dims.n_layers // 3, None)
    mean = {name: float(values[late].mean()) for name, values in result.mean.items()}
    assert mean["cos_update_C"] > mean["cos_update_C_wrong"]
    assert mean["cos_in_A"] > mean["cos_in_A_wrong"]
    assert mean["cos_in_B"] > mean["cos_in_B_wrong"]
    assert result.number_labels == list("0123456789")  # SmolLM2 writes one token per digit

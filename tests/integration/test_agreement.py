"""Method agreement: each method's importance is what that method computes, and the table compares them."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from arithmech.analysis.agreement import agreement_table, spearman
from arithmech.cli import main
from arithmech.data import tokenize_pairs
from arithmech.errors import ConfigError
from arithmech.knockout.ablation import ablation_sources
from arithmech.knockout.batched import knockout_scores
from arithmech.models.load import ModelConfig, load_model
from arithmech.models.sites import all_components
from arithmech.patching.path import PatchingBatch, path_patch
from arithmech.stages.agreement import method_agreement
from arithmech.stages.agreement_config import AgreementConfig
from arithmech.stages.identify_run import read_identify_run


def test_agreement_table_by_hand() -> None:
    a = [4.0, 3.0, 2.0, 1.0]
    rows = agreement_table({"a": a, "b": [1.0, 2.0, 3.0, 4.0], "c": [4.0, 3.0, 1.0, np.nan]}, ks=(1, 2, 5))
    ab, ac, bc = rows
    assert (ab["method_a"], ab["method_b"]) == ("a", "b")
    assert ab["spearman"] == pytest.approx(-1.0) and ab["top1_overlap"] == 0.0 and ab["top2_overlap"] == 0.0
    assert np.isnan(ab["top5_overlap"])  # k larger than the sites
    assert ac["n_sites"] == 3 and ac["spearman"] == pytest.approx(1.0) and ac["top2_overlap"] == 1.0
    assert bc["spearman"] == pytest.approx(spearman([1, 2, 3], [4, 3, 1]))
    with pytest.raises(ConfigError, match="different numbers of sites"):
        agreement_table({"a": [1.0, 2.0], "b": [1.0]})


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    model = tiny_model_dir("llama")
    out = tmp_path_factory.mktemp("identify") / "run"
    args = ["identify", "--model", str(model), "--keep-incorrect", "--formations", "equation", "--n-per-template",
            "2", "--out", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    return model, out


def test_scores_are_what_each_method_computes(run: tuple[Path, Path], tmp_path: Path) -> None:
    model, identify_dir = run
    handle = load_model(ModelConfig(model=str(model)))
    cfg = AgreementConfig(from_run=str(identify_dir), max_prompts=6, ks=(3,), zero_positions="all")
    result = method_agreement(handle, cfg, tmp_path / "agreement", quiet=True)
    dims = handle.dims

    run_pairs = read_identify_run(identify_dir, handle).pairs
    pairs = [run_pairs[i] for i in result.metadata["prompts"]["indices"]]
    t, _ = tokenize_pairs(handle.tokenizer, pairs)
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    effects = path_patch(handle.view, batch).effects.reshape(dims.n_layers, dims.n_heads + 1)
    heads = result.importance["head"]
    np.testing.assert_allclose(heads["path"], -effects[:, :-1].reshape(-1).numpy(), atol=1e-6)
    layers = result.importance["layer"]
    np.testing.assert_allclose(layers["path"][: dims.n_layers], -effects[:, :-1].sum(1).numpy(), atol=1e-6)
    np.testing.assert_allclose(layers["path"][dims.n_layers :], -effects[:, -1].numpy(), atol=1e-6)
    assert np.isnan(heads["mediation"]).all()  # mediation has no head-level score

    # zero ablation of head 1.0 == the drop of the answer probability with its W_O block zeroed
    def answer_prob() -> torch.Tensor:
        logits = handle.view.end_logits(batch.ref_ids, batch.ref_mask, batch.end)
        return logits.softmax(-1).gather(1, batch.answer_ids[:, None])[:, 0]

    with torch.no_grad():
        base = answer_prob()
        o_proj = handle.view.o_proj(1)
        saved = o_proj.weight.detach().clone()
        o_proj.weight[:, : dims.d_head] = 0.0
        zeroed = answer_prob()
        o_proj.weight.copy_(saved)
    head_index = 1 * dims.n_heads + 0
    assert heads["zero-ablation"][head_index] == pytest.approx(float((base - zeroed).mean()), abs=1e-6)

    rows = list(csv.DictReader((tmp_path / "agreement" / "agreement.csv").open()))
    head_pairs = {(r["method_a"], r["method_b"]) for r in rows if r["level"] == "head"}
    assert head_pairs == {("path", "attribution"), ("path", "zero-ablation"), ("attribution", "zero-ablation")}
    layer_rows = [r for r in rows if r["level"] == "layer"]
    if result.metadata["counts"]["mediation_pairs"] > 0:
        assert len(layer_rows) == 6
    for r in rows:  # against numpy: Pearson correlation of argsort ranks (no ties in float scores), top 3 by hand
        x, y = (np.asarray(result.importance[r["level"]][r[m]], dtype=float) for m in ("method_a", "method_b"))
        keep = ~(np.isnan(x) | np.isnan(y))
        x, y = x[keep], y[keep]
        ranks = np.corrcoef(x.argsort().argsort(), y.argsort().argsort())[0, 1]
        assert float(r["spearman"]) == pytest.approx(ranks, abs=1e-6)  # the CSV has 6 decimals
        top3 = len(set(np.argsort(-x)[:3]) & set(np.argsort(-y)[:3])) / 3
        assert float(r["top3_overlap"]) == pytest.approx(top3, abs=1e-6)
    assert (tmp_path / "agreement" / "agreement.png").stat().st_size > 0
    assert (tmp_path / "agreement" / "metadata.json").is_file()


def test_end_only_zero_ablation_matches_a_full_forward_knockout(run: tuple[Path, Path], tmp_path: Path) -> None:
    """Zeroing at END by one decoding step on the cache == the knockout machinery's END-only zero ablation."""
    model, identify_dir = run
    handle = load_model(ModelConfig(model=str(model)))
    cfg = AgreementConfig(from_run=str(identify_dir), methods=("path", "zero-ablation"), max_prompts=5)
    result = method_agreement(handle, cfg, tmp_path / "a", quiet=True)
    run_pairs = read_identify_run(identify_dir, handle).pairs
    pairs = [run_pairs[i] for i in result.metadata["prompts"]["indices"]]
    t, _ = tokenize_pairs(handle.tokenizer, pairs)
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    sources = ablation_sources(handle.view, batch, "zero", groups=[0] * 5, end_only=True)
    components = all_components(handle.dims)
    prob = knockout_scores(handle.view, batch, sources, [[], *([c] for c in components)]).mean_prob
    expected = (prob[0] - prob[1:]).reshape(handle.dims.n_layers, -1)  # [layer, heads + mlp]
    heads = result.importance["head"]["zero-ablation"]
    np.testing.assert_allclose(heads, expected[:, :-1].reshape(-1).numpy(), atol=1e-5)
    mlps = result.importance["layer"]["zero-ablation"][handle.dims.n_layers :]
    np.testing.assert_allclose(mlps, expected[:, -1].numpy(), atol=1e-5)


def test_mediation_score_matches_a_two_run_computation(run: tuple[Path, Path], tmp_path: Path) -> None:
    """The layer-level mediation score is the median IE of the attention output at END, computed plainly."""
    model, identify_dir = run
    handle = load_model(ModelConfig(model=str(model)))
    cfg = AgreementConfig(from_run=str(identify_dir), methods=("path", "mediation"), max_prompts=6)
    result = method_agreement(handle, cfg, tmp_path / "a", quiet=True)
    if result.metadata["counts"]["mediation_pairs"] == 0:
        pytest.skip("the tiny model answers every counterfactual as its reference")
    run_pairs = read_identify_run(identify_dir, handle).pairs
    pairs = [run_pairs[i] for i in result.metadata["prompts"]["indices"]]
    t, _ = tokenize_pairs(handle.tokenizer, pairs)
    view, layer = handle.view, 1
    ies = []
    for i in range(len(t.pairs)):
        end = int(t.end[i])
        ie = _attention_ie_two_runs(view, layer, t.ref_ids[i : i + 1, : end + 1], t.cf_ids[i : i + 1, : end + 1],
                                    int(t.answer_ids[i]))  # fmt: skip
        if ie is not None:
            ies.append(ie)
    expected = torch.stack(ies).median()  # torch's median of an even count is the lower middle, as nanmedian's
    assert result.importance["layer"]["mediation"][layer] == pytest.approx(float(expected), rel=1e-4, abs=1e-6)


@torch.no_grad()
def _attention_ie_two_runs(view, layer: int, ref: torch.Tensor, cf: torch.Tensor, r: int) -> torch.Tensor | None:
    """IE of layer's attention output at END: the base run, the alternative run, and the base run again with the
    alternative's END value put in by a plain forward hook (None when r' = r)."""
    saved = {}

    def keep(_m, _a, out):
        saved["v"] = out[0, -1].clone()  # returns None: the output is left as it is

    def put(_m, _a, out):
        out = out.clone()
        out[0, -1] = saved["v"]
        return out

    p = view.model(input_ids=ref).logits[0, -1].softmax(-1)
    hook = view.o_proj(layer).register_forward_hook(keep)
    p_alt = view.model(input_ids=cf).logits[0, -1].softmax(-1)
    hook.remove()
    r_alt = int(p_alt.argmax())
    if r_alt == r:
        return None
    hook = view.o_proj(layer).register_forward_hook(put)
    p_star = view.model(input_ids=ref).logits[0, -1].softmax(-1)
    hook.remove()
    return 0.5 * ((p[r] - p_star[r]) / p_star[r] + (p_star[r_alt] - p[r_alt]) / p[r_alt])


def test_bad_config() -> None:
    with pytest.raises(ConfigError, match="unknown method"):
        AgreementConfig(from_run="x", methods=("path", "vibes"))
    with pytest.raises(ConfigError, match="at least two"):
        AgreementConfig(from_run="x", methods=("path",))


def test_cli(run: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    model, identify_dir = run
    args = ["analyze", "agreement", "--model", str(model), "--from", str(identify_dir), "--methods",
            "path,attribution", "--max-prompts", "4", "--out", str(tmp_path / "ag"), "--quiet"]  # fmt: skip
    assert main(args) == 0
    assert "Spearman" in capsys.readouterr().out
    assert main([*args[:-3], "--methods", "path,guess", "--quiet"]) == 2
    assert "unknown method" in capsys.readouterr().err

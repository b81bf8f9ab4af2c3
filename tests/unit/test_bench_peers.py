"""benchmarks/peers.py: without TransformerLens and nnsight it counts arithmech's scans, says how to install them
and exits 0; its repetitions record a median, min and max per prompt set (a stand-in peer); with them, each
peer's per-head patching gives arithmech's values (tiny model; skipped where they are not installed)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from arithmech.data.reference_config import ReferenceSetConfig
from arithmech.models.sites import Component, all_components
from arithmech.patching.path import path_patch

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH_DIR) not in sys.path:  # the benchmark scripts are not a package; they import each other by name
    sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(Path(__file__).resolve().parent / "patching"))

import peers  # noqa: E402
import record  # noqa: E402
from test_path_exact import answered_batch, view_of  # noqa: E402


def test_without_the_peers_it_counts_arithmech_says_how_to_install_them_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_model_dir: Callable[[str], Path]
) -> None:
    """The count on arithmech's side needs no peer: passes of the prompts and of the padded batch, on each set."""
    monkeypatch.setattr(peers.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(peers, "ReferenceSetConfig", partial(ReferenceSetConfig, filter_correct=False))  # random model
    assert peers.main(["--prompts", "8", "--model", str(tiny_model_dir("llama"))]) == 0
    out = capsys.readouterr().out
    assert "neither TransformerLens nor nnsight is installed" in out and 'pip install "arithmech[peers]"' in out
    assert "forward passes of the prompts (each at its own length, last-token logits)" in out
    assert "of the right-padded batch with logits at every position (counted)" in out
    assert "short prompts" in out and "default prompts" in out


def test_repetitions_are_interleaved_and_recorded_as_median_min_and_max(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_model_dir: Callable[[str], Path],
    tmp_path: Path,
) -> None:  # fmt: skip
    """A stand-in for nnsight that patches with arithmech's own total: three repetitions on one prompt set."""
    monkeypatch.setattr(peers.importlib.util, "find_spec", lambda name: object() if name == "nnsight" else None)
    monkeypatch.setattr(peers, "ReferenceSetConfig", partial(ReferenceSetConfig, filter_correct=False))
    calls: list[Component] = []

    def stand_in(model: Any, view: Any, batch: Any, ref_logit: Any) -> Callable[[Component], torch.Tensor]:
        fast = path_patch(view, batch, variant="total")

        def patch(head: Component) -> torch.Tensor:
            calls.append(head)
            return fast.per_prompt[fast.components.index(head)]

        return patch

    monkeypatch.setattr(peers, "nnsight_patcher", stand_in)
    monkeypatch.setenv(record.RECORD_ENV, str(tmp_path / "record.jsonl"))
    argv = ["--prompts", "4", "--heads", "2", "--repeats", "3", "--sets", "short"]
    assert peers.main([*argv, "--model", str(tiny_model_dir("llama"))]) == 0
    out = capsys.readouterr().out
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("repetition")] == [
        "repetition 1", "repetition 2", "repetition 3"
    ]  # fmt: skip
    assert len(calls) == 1 + 3 * 2  # the warm-up head, then two heads each repetition
    metrics = json.loads((tmp_path / "record.jsonl").read_text())["metrics"]
    assert metrics["repeats"] == 3 and metrics["short_nnsight_max_abs_diff"] == 0.0
    ratio = [metrics[f"short_total_vs_nnsight{end}"] for end in ("_min", "", "_max")]
    assert ratio[0] <= ratio[1] <= ratio[2] and ratio[0] > 0
    assert {"short_tokens", "short_prompt_forward_s", "short_total_prompt_passes", "short_total_passes"} <= set(metrics)
    assert not any(key.startswith("default_") for key in metrics)


def test_spread_is_median_min_and_max() -> None:
    assert peers.spread("r", [3.0, 1.0, 2.0]) == {"r": 2.0, "r_min": 1.0, "r_max": 3.0}


def test_with_one_peer_missing_it_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers.importlib.util, "find_spec", lambda name: object() if name == "nnsight" else None)
    assert peers.installed_peers() == ["nnsight"]


@pytest.mark.parametrize("peer", ["nnsight", "transformer_lens"])
def test_a_peer_patches_every_head_as_arithmech_total(peer: str) -> None:
    pytest.importorskip(peer)
    view = view_of("llama")
    batch = answered_batch(view, [7, 5, 9, 7])  # right-padded, three END positions
    fast = path_patch(view, batch, variant="total")
    with torch.no_grad():
        logits = view.model(input_ids=batch.ref_ids, attention_mask=batch.ref_mask).logits
    ref_logit = logits[torch.arange(len(batch)), batch.end, batch.answer_ids]
    if peer == "nnsight":
        patch = peers.nnsight_patcher(view.model, view, batch, ref_logit)
    else:
        from tiny_models import make_tiny_tokenizer

        patch = peers.transformer_lens_patcher(view.model, make_tiny_tokenizer(), batch, ref_logit, "cpu")
    heads = [c for c in all_components(view.dims) if c.head is not None]
    values = torch.stack([patch(head) for head in heads])  # [head, batch]
    expected = fast.per_prompt[[fast.components.index(head) for head in heads]]
    torch.testing.assert_close(values, expected, atol=1e-5, rtol=1e-4)

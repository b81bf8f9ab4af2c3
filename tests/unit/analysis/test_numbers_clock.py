"""The Clock (issue 35, item 5): helix(a, b, a+b) against helix(a+b) and PCA at the last token, and identify's
heads classified by the share of their effect that helix(a, b) and helix(a+b) explain (c_ab, c_sum).

The planted model: the tiny Llama with the multi-digit tokenizer (0..99 single tokens) whose embedding adds, at
the space after "=" (the query's last token), the circles of period 5 and 10 of the sum of the two numbers before
it on its line, on 4 coordinates P (a causal function of the prefix, as any embedding of the tokens so far may
be). Nothing reads P but head 0.1, which attends evenly to every position (its queries are zero) and copies P
onto 4 other coordinates; the unembedding reads those as the circles of each number token. So head 0.1 writes
helix(a+b) (its circles) and nothing else: it must come out an a+b head, with c_sum 1. Its kv-group partner 0.0
writes nothing. The null: the same model left random, where no head's output follows a helix.

A head's patch is checked against a plain forward pass that adds the change to o_proj's output at the last token.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from arithmech.analysis.clock_fits import HEAD_CLASSES, clock_basis, clock_families, head_class
from arithmech.data import PromptPair, write_prompt_file
from arithmech.errors import ConfigError
from arithmech.models.archs import spec_for_model_type
from arithmech.models.hooks import count_hooks
from arithmech.models.load import ModelHandle
from arithmech.models.view import ModelView
from arithmech.patching.states import collect_end_states
from arithmech.patching.subspace import after_head, base_run, patch_rows
from arithmech.stages.numbers import analyze_numbers
from arithmech.stages.numbers_config import NumbersConfig

from tiny_models import make_multidigit_model

pytestmark = pytest.mark.usefixtures("one_thread")

PLANTED_HEAD = (0, 1)  # layer, head: reads P, writes Q
P_DIMS = [56, 57, 58, 59]  # the embedding's circles of the sum at the query's last token
Q_DIMS = [60, 61, 62, 63]  # where the head writes them, read by the unembedding
PERIODS = (5, 10)


def _circles(n: int) -> list[float]:
    return [f(2 * math.pi * n / t) for t in PERIODS for f in (math.cos, math.sin)]


class SumEmbedding(nn.Embedding):
    """The token embedding plus, at each space that follows "=", the circles of the sum of the two numbers before
    it on its line (on P_DIMS): a function of the prefix, like anything a causal model computes there."""

    def __init__(self, base: nn.Embedding, numbers: dict[int, int], space: int, equals: int, newline: int) -> None:
        super().__init__(base.num_embeddings, base.embedding_dim, padding_idx=base.padding_idx)
        self.weight = base.weight
        self.numbers, self.space, self.equals, self.newline = numbers, space, equals, newline

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = super().forward(input).clone()
        for row, ids in enumerate(input.tolist()):
            line: list[int] = []
            for t, token in enumerate(ids):
                if token == self.newline:
                    line = []
                elif token in self.numbers:
                    line.append(self.numbers[token])
                elif token == self.space and t > 0 and ids[t - 1] == self.equals and len(line) >= 2:
                    out[row, t, P_DIMS] = torch.tensor(_circles(line[-2] + line[-1]), dtype=out.dtype)
        return out


def _handle(model: Any, tok: Any) -> ModelHandle:
    return ModelHandle(model, tok, ModelView(model, spec_for_model_type(model.config.model_type)), {"model": "tiny"})


def _planted(seed: int = 0) -> ModelHandle:
    model, tok = make_multidigit_model("llama", seed)
    model = model.double()
    d_head, (layer, head) = model.config.hidden_size // model.config.num_attention_heads, PLANTED_HEAD
    group = head // (model.config.num_attention_heads // model.config.num_key_value_heads)
    numbers = {tok(str(n))["input_ids"][0]: n for n in range(100)}
    (space,), (equals,), (newline,) = (tok(c)["input_ids"] for c in (" ", "=", "\n"))
    with torch.no_grad():
        emb = model.get_input_embeddings()
        emb.weight[:, P_DIMS + Q_DIMS] = 0  # the planted coordinates hold only what is planted
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")):
                param[:, P_DIMS] = 0  # nothing reads P ...
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param[P_DIMS + Q_DIMS, :] = 0  # ... nor writes P or Q
        attn = model.model.layers[layer].self_attn
        attn.q_proj.weight[head * d_head : (head + 1) * d_head] = 0  # even attention over the prefix
        v = attn.v_proj.weight[group * d_head : (group + 1) * d_head]  # [d_head, d_model]
        v[:] = 0
        for j, dim in enumerate(P_DIMS):
            v[j, dim] = 8.0  # ... but the head reads P
        attn.o_proj.weight[:, group * 2 * d_head : (group + 1) * 2 * d_head] = 0  # both heads of the group silent
        for j, dim in enumerate(Q_DIMS):
            attn.o_proj.weight[dim, head * d_head + j] = 1.0  # ... but the planted one writes P onto Q
        model.lm_head.weight[:, Q_DIMS] = 0
        for token, n in numbers.items():
            model.lm_head.weight[token, Q_DIMS] = 40.0 * torch.tensor(_circles(n), dtype=torch.float64)
        model.model.embed_tokens = SumEmbedding(emb, numbers, space, equals, newline)
    return _handle(model, tok)


def _identify_folder(path: Path, heads: list[str], n_heads: int, model: str = "tiny") -> Path:
    """The files an analysis reads of an identify run: its key heads (effects made up: only the heads matter)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "metadata.json").write_text(json.dumps({"stage": "identify", "model": {"model": model},
                                                    "dims": {"n_heads": n_heads}}))  # fmt: skip
    (path / "effects.csv").write_text("component,effect\n" + "".join(f"{h},-0.1\n" for h in heads))
    (path / "key_components.json").write_text(json.dumps({"key_heads": heads}))
    write_prompt_file(path / "prompts.jsonl", [PromptPair("1 + 2 = ", "1 @ 2 = ", "3")])
    return path


def _cfg(run: Path, **changes: Any) -> NumbersConfig:
    settings = {"high": 40, "max_pairs": 400, "max_prompts": 60, "filter_correct": False, "layers": (0, 1),
                "sites": ("clock",), "few_shot": 1, "batch_size": 60, "shuffles": 2, "identify_run": str(run)}
    return NumbersConfig(**{**settings, **changes})  # fmt: skip


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("clock")
    run = _identify_folder(folder / "identify", ["0.1", "1.2", "2.3"], 4)
    return analyze_numbers(_planted(), _cfg(run), folder / "numbers", quiet=True)


def test_clock_families_and_the_head_rule() -> None:
    fams = clock_families((5, 10))
    assert [f.name for f in fams] == ["helix-5-10(a+b)", "helix-5-10(a,b)", "helix-5-10(a,b,a+b)", "pca-5",
                                    "pca-10", "pca-15"]
    a, b = torch.tensor([3, 7]), torch.tensor([4, 9])
    basis = clock_basis(fams[2], a, b)
    assert basis.shape == (2, 15) and basis[:, 10].tolist() == [7.0, 16.0]  # a + b's linear column
    assert head_class(0.1, 0.9, 0.95) == "a+b" and head_class(0.8, 0.1, 0.9) == "a,b"
    assert head_class(0.6, 0.7, 0.9) == "mixed" and head_class(None, None, None) == "unexplained"
    assert set(HEAD_CLASSES) == {"a,b", "a+b", "mixed", "unexplained"}
    with pytest.raises(ConfigError, match="add clock to sites"):
        NumbersConfig(sites=("a",), identify_run="runs/add")


def test_planted_sum_head_is_an_a_plus_b_head(planted: Any) -> None:
    heads = {r["head"]: r for r in planted.clock.heads}
    head = heads["0.1"]
    assert head["class"] == "a+b" and head["classified_on"] == "heldout", head
    assert head["c_sum"] == pytest.approx(1.0, abs=1e-4) and head["c_sum_heldout"] == pytest.approx(1.0, abs=1e-4)
    assert head["c_joint"] == pytest.approx(1.0, abs=1e-4), head
    assert abs(head["c_ab"]) < 0.3 and abs(head["c_ab_heldout"]) < 0.3, head  # helix(a, b) cannot write cos(a + b)
    assert head["head_share"] > 0.5, head  # the planted head carries the sum to the logits
    order = planted.metadata["clock"]["head_order"]
    assert "1 a+b" in order and "no a,b head is found, so the order cannot be compared" in order, order
    assert planted.sites == []  # the clock site alone: no operand site, so no other-position control


def test_planted_clock_at_the_last_token(planted: Any) -> None:
    """At layer 0 the last token holds helix(a+b)'s circles (planted in the embedding): helix(a+b) restores the
    whole layer on held-out prompts too, helix(a, b) does not, and the verdict names helix(a+b)."""
    rows = {r["family"]: r for r in planted.clock.rows if r["layer"] == 0}
    assert rows["layer"]["restored"] == pytest.approx(1.0)
    total = rows["helix-2-5-10(a+b)"]
    assert total["restored"] == pytest.approx(1.0, abs=1e-4), total
    assert total["restored_heldout"] == pytest.approx(1.0, abs=1e-4), total
    assert abs(total["restored_shuffled"]) < 0.35, total
    assert rows["helix-2-5-10(a,b)"]["restored_heldout"] < 0.5, rows["helix-2-5-10(a,b)"]
    assert rows["helix-2-5-10(a,b,a+b)"]["restored_heldout"] == pytest.approx(1.0, abs=1e-4)  # it holds a+b too
    (verdict,) = planted.clock.verdicts  # one of the two helices that hold a + b, never helix(a, b)
    names = {verdict["winner"], verdict["runner_up"]}
    assert names == {"helix-2-5-10(a+b)", "helix-2-5-10(a,b,a+b)"} and verdict["ordered"], verdict
    out = planted.out_dir
    assert (out / "numbers_clock.csv").exists() and (out / "numbers_clock_heads.csv").exists()
    assert planted.metadata["identify_runs"][0]["path"].endswith("identify")


def test_null_model_puts_every_head_at_chance(tmp_path: Path) -> None:
    model, tok = make_multidigit_model("llama", seed=3)
    run = _identify_folder(tmp_path / "identify", ["0.1", "1.2", "2.3"], 4)
    result = analyze_numbers(_handle(model.double(), tok), _cfg(run, layers=(0,)), tmp_path / "numbers", quiet=True)
    # measured: every share from -0.32 to 0.28 (c_ab, c_sum, c_joint on train and held-out pairs), far from the
    # 1 of the planted head and under the 0.5 that would call a helix the head's reading
    shares = [h[c] for h in result.clock.heads for c in ("c_ab", "c_sum", "c_joint", "c_ab_heldout", "c_sum_heldout",
                                                          "c_joint_heldout") if h[c] is not None]  # fmt: skip
    assert len(shares) >= 6 and all(abs(x) < 0.45 for x in shares), result.clock.heads
    assert [h["class"] for h in result.clock.heads] == ["unexplained"] * 3, result.clock.heads
    assert "neither kind is found" in result.metadata["clock"]["head_order"]


@torch.no_grad()
def test_head_patch_matches_a_hooked_forward_pass() -> None:
    """after_head + patch_rows at layer + 1 equals a plain forward pass whose o_proj output at the last token gets
    the head's change added (every layer, the last one too, where the row joins at the final norm)."""
    handle = _planted()
    model, view, tok = handle.model, handle.view, handle.tokenizer
    enc = tok(["12 + 7 = 19\n3 + 25 = ", "12 + 7 = 19\n30 + 5 = "], return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    pos = int(mask.sum(1).min()) - 1
    base, _ = base_run(view, ids, mask)
    states = collect_end_states(view, ids, mask, torch.full((2,), pos))
    good = torch.tensor(tok(["28", "35"])["input_ids"]).flatten()
    bad = good.flip(0)
    gen = torch.Generator().manual_seed(0)
    for layer in range(view.dims.n_layers):
        delta = torch.randn(2, view.dims.d_model, generator=gen, dtype=torch.float64)
        x = after_head(view, layer, states.resid_pre[layer], states.attn_out[layer], delta)
        got = patch_rows(view, base, pos, torch.arange(2), torch.full((2,), layer + 1), x, torch.full((2,), pos),
                         good, bad)  # fmt: skip
        for i in range(2):

            def add(_module: Any, _args: Any, output: torch.Tensor, change: torch.Tensor = delta[i]) -> torch.Tensor:
                output = output.clone()
                output[0, pos] += change
                return output

            hook = view.o_proj(layer).register_forward_hook(add)
            try:
                logits = model(input_ids=ids[i : i + 1], attention_mask=mask[i : i + 1]).logits[0, pos]
            finally:
                hook.remove()
            assert float(got[i]) == pytest.approx(float(logits[good[i]] - logits[bad[i]]), rel=1e-6), (layer, i)
    assert count_hooks(model) == 0


def test_report_section_says_the_clock_and_its_heads(planted: Any) -> None:
    from arithmech.report.numbers_section import numbers_body
    from arithmech.report.run_folder import StageFolder

    body = numbers_body(StageFolder("numbers", planted.out_dir, "done"))
    assert "The Clock" in body.reading and "clock: at layer" in body.reading, body.reading
    assert "Kantamneni & Tegmark find that heads of earlier layers move a and b" in body.reading
    (heads,) = body.tables  # the clock site alone: no numbers_ld.csv rows, no figure of them
    assert [row[:2] for row in heads.rows][0] == ("0.1", "a+b") and not body.figures


def test_guide_explains_every_head_column() -> None:
    """docs/guides/explain.md's table of numbers_clock_heads.csv names every column the stage writes, and no other."""
    import re

    from arithmech.stages.numbers_heads import HEAD_COLUMNS

    guide = (Path(__file__).parents[3] / "docs" / "guides" / "explain.md").read_text()
    start = guide.index("`numbers_clock_heads.csv` has one row per head")
    table = guide[guide.index("| column | what it holds |", start) :].split("\n\n")[0]
    named = [name for line in table.splitlines()[2:] for name in re.findall(r"`([a-z_0-9]+)`", line.split("|")[1])]
    assert sorted(named) == sorted(HEAD_COLUMNS)


def test_cli_runs_the_clock_with_an_identify_run(tmp_path: Path, capsys) -> None:
    from arithmech.cli import main

    from tiny_models import save_multidigit_model_dir

    model = save_multidigit_model_dir("llama", tmp_path / "model", seed=3)
    run = _identify_folder(tmp_path / "identify", ["1.2", "2.3"], 4, model=str(model))
    assert main(["analyze", "numbers", "--model", str(model), "--high", "40", "--max-pairs", "200", "--max-prompts",
                 "8", "--no-filter-correct", "--layers", "1", "--sites", "clock", "--few-shot", "1", "--shuffles", "1",
                 "--identify", str(run), "--out", str(tmp_path / "numbers"), "--quiet"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "Of 2 heads classified" in out and "results in" in out, out
    meta = json.loads((tmp_path / "numbers" / "metadata.json").read_text())
    assert meta["identify_runs"][0]["path"] == str(run) and meta["clock"]["heads"] == ["1.2", "2.3"]


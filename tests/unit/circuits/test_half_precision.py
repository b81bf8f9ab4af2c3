"""EAP-IG in float16 where the model's own forward stays in range but a difference of two runs would not.

Found by benchmarks/skeleton_numerics.py's investigation: float16's largest number is 65,504, so two residual-sized
outputs of ~40,000 and opposite signs, each fine in a forward pass, differ by more than it. EAP-IG subtracts the
counterfactual run's outputs from the clean run's (the score's out_s(clean) - out_s(cf)) and interpolates between
the two embeddings; both now happen in float32, so the scores stay finite wherever the model itself does.
"""

from __future__ import annotations

import pytest
import torch

from arithmech.circuits.attribution import edge_scores
from arithmech.circuits.batch import CircuitBatch
from arithmech.circuits.graph import CircuitGraph
from arithmech.errors import DataError
from arithmech.models.archs import spec_for_model_type
from arithmech.models.view import ModelView
from arithmech.stages.circuit import check_finite_scores

from tiny_models import make_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
LARGE = 40_000.0
"""Within float16 (65,504), but twice it is not."""


def prompts(n: int, tokens: int, changed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random printable prompts and counterfactuals that differ in their last `changed` tokens."""
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(33, 127, (n, tokens), generator=gen)
    cf = clean.clone()
    cf[:, -changed:] = torch.randint(33, 127, (n, changed), generator=gen)
    return clean, cf


def test_eap_ig_is_finite_where_a_float16_difference_of_embeddings_overflows() -> None:
    model = make_tiny_model("llama")  # untied: the embedding's scale leaves the logits alone
    with torch.no_grad():
        weight = model.get_input_embeddings().weight
        weight.copy_(torch.sign(weight) * LARGE)
    model = model.half()
    view = ModelView(model, spec_for_model_type("llama"))
    clean, cf = prompts(4, 12, 3)
    embed = model.get_input_embeddings()
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=clean).logits).all()  # the model itself is in range
        assert torch.isfinite(model(input_ids=cf).logits).all()
        assert not torch.isfinite(embed(clean) - embed(cf)).all()  # a float16 difference of the two is not
    batch = CircuitBatch(clean, cf, torch.ones_like(clean), clean[:, 0], cf[:, 0])
    scores = edge_scores(view, CircuitGraph.from_dims(view.dims), batch, method="eap-ig", steps=3, batch_size=4)
    assert torch.isfinite(scores).all()


def test_edge_scores_that_overflow_are_refused_in_one_sentence() -> None:
    model = make_tiny_model("llama")
    with torch.no_grad():  # the first MLP's output beyond float16's range: the model's own pass overflows
        model.model.layers[0].mlp.down_proj.weight.mul_(1e6)
    model = model.half()
    view = ModelView(model, spec_for_model_type("llama"))
    clean, cf = prompts(2, 8, 2)
    graph = CircuitGraph.from_dims(view.dims)
    batch = CircuitBatch(clean, cf, torch.ones_like(clean), clean[:, 0], cf[:, 0])
    scores = edge_scores(view, graph, batch, method="eap-ig", steps=2, batch_size=2)
    assert not torch.isfinite(scores[graph.valid.bool()]).all()
    with pytest.raises(DataError, match=r"eap-ig gave \d+ of \d+ edge scores that are not finite with the model in "
                                        r"float16 .*--dtype float32"):  # fmt: skip
        check_finite_scores(graph, scores, "eap-ig", "float16")
    check_finite_scores(graph, torch.nan_to_num(scores) * graph.valid, "eap-ig", "float16")  # finite: no refusal
    with pytest.raises(DataError, match=r"in float32: its own forward or backward pass gives inf or NaN; check") as err:
        check_finite_scores(graph, scores, "eap-ig", "float32")  # no dtype to move to
    assert "--dtype" not in str(err.value)

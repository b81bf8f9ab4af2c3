"""The END-value hooks change each row at its own END only, where the mask says, and never the module's tensor."""

from __future__ import annotations

import torch
from torch import nn

from arithmech.models.end_value import at_end, input_at_end, output_at_end
from arithmech.models.hooks import hooks


def test_replaces_the_masked_columns_at_each_rows_end() -> None:
    x = torch.arange(24.0).reshape(2, 3, 4)  # [row, pos, width]
    mask = torch.tensor([[True, False, True, False], [False, False, False, False]])
    value = torch.full((2, 4), -1.0)
    new = at_end(x, mask, value, torch.tensor([1, 2]))
    expected = x.clone()
    expected[0, 1, [0, 2]] = -1.0  # row 1 masks nothing: bit-identical
    assert torch.equal(new, expected)
    assert torch.equal(x, torch.arange(24.0).reshape(2, 3, 4))  # the input is not written in place
    whole = at_end(x, torch.tensor([[True], [False]]), value, torch.tensor([0, 0]))  # [row, 1] broadcasts
    assert torch.equal(whole[0, 0], value[0]) and torch.equal(whole[1], x[1])


def test_hooks_replace_an_input_and_an_output() -> None:
    layer = nn.Linear(4, 4)
    x = torch.randn(2, 3, 4)
    mask, value, end = torch.ones(2, 4, dtype=torch.bool), torch.zeros(2, 4), torch.tensor([2, 0])
    with hooks(pre=[(layer, input_at_end(mask, value, end))]):
        got = layer(x)
    assert torch.allclose(got, layer(at_end(x, mask, value, end)))
    with hooks(post=[(layer, output_at_end(mask, value, end))]):
        got = layer(x)
    assert torch.equal(got, at_end(layer(x), mask, value, end))

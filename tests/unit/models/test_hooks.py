"""Scoped hooks: nothing registered inside `hooks(...)` survives the block, also when it raises."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from arithmech.models.hooks import count_hooks, first_tensor, hooks

from tiny_models import make_tiny_model


def tiny_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def noop_pre(module, args):
    return None


def noop_post(module, args, output):
    return None


def test_hooks_are_active_inside_and_removed_after() -> None:
    net = tiny_net()
    calls: list[str] = []
    pre = [(net[0], lambda m, a: calls.append("pre0")), (net[2], lambda m, a: calls.append("pre2"))]
    post = [(net[2], lambda m, a, o: calls.append("post2"))]
    assert count_hooks(net) == 0
    with hooks(pre=pre, post=post):
        assert count_hooks(net) == 3
        net(torch.ones(1, 4))
    assert calls == ["pre0", "pre2", "post2"]
    assert count_hooks(net) == 0
    net(torch.ones(1, 4))
    assert calls == ["pre0", "pre2", "post2"]  # not called again after the block


def test_hooks_removed_when_the_block_raises() -> None:
    net = tiny_net()
    with pytest.raises(RuntimeError, match="boom"):
        with hooks(pre=[(net[0], noop_pre)], post=[(net[2], noop_post), (net[0], noop_post)]):
            assert count_hooks(net) == 3
            raise RuntimeError("boom")
    assert count_hooks(net) == 0


def test_hooks_removed_when_a_hook_raises_during_forward() -> None:
    model = make_tiny_model("llama", seed=0)

    def bad(module, args, output):
        raise ValueError("hook failed")

    with pytest.raises(ValueError, match="hook failed"):
        with hooks(post=[(model.model.layers[1].mlp, bad)], pre=[(model.model.norm, noop_pre)]):
            model(input_ids=torch.tensor([[1, 2, 3]]))
    assert count_hooks(model) == 0


def test_hooks_removed_when_registration_fails_halfway() -> None:
    """A bad entry after good ones: the good ones registered so far are still removed."""
    net = tiny_net()
    with pytest.raises(AttributeError):
        with hooks(pre=[(net[0], noop_pre), (net[2], noop_pre)], post=[(object(), noop_post)]):  # type: ignore[list-item]
            pass
    assert count_hooks(net) == 0


def test_pre_hook_returning_new_args_changes_the_output() -> None:
    net = tiny_net()
    x = torch.randn(3, 4)
    with torch.no_grad():
        clean = net(x)

        def zero_input(module, args):
            return (torch.zeros_like(args[0]),)

        with hooks(pre=[(net[0], zero_input)]):
            patched = net(x)
        after = net(x)
        expected = net(torch.zeros_like(x))
    torch.testing.assert_close(patched, expected)
    assert (patched - clean).abs().max() > 1e-3
    torch.testing.assert_close(after, clean)


def test_pre_hook_returning_none_leaves_the_output() -> None:
    net = tiny_net()
    x = torch.randn(3, 4)
    with torch.no_grad():
        clean = net(x)
        with hooks(pre=[(net[0], noop_pre)], post=[(net[2], noop_post)]):
            same = net(x)
    torch.testing.assert_close(same, clean, atol=0, rtol=0)


def test_post_hook_returning_new_output_replaces_it() -> None:
    net = tiny_net()
    x = torch.randn(3, 4)
    with torch.no_grad(), hooks(post=[(net[2], lambda m, a, o: o * 0 + 7.0)]):
        out = net(x)
    assert torch.equal(out, torch.full((3, 2), 7.0))


def test_pre_hook_changes_a_real_model_output() -> None:
    model = make_tiny_model("gpt2", seed=0)
    ids = torch.tensor([[5, 6, 7, 8]])

    def scale(module, args):
        return (args[0] * 3.0, *args[1:])

    with torch.no_grad():
        clean = model(input_ids=ids).logits
        with hooks(pre=[(model.transformer.h[1].mlp, scale)]):
            patched = model(input_ids=ids).logits
        again = model(input_ids=ids).logits
    assert (patched - clean).abs().max() > 1e-3
    torch.testing.assert_close(again, clean, atol=0, rtol=0)
    assert count_hooks(model) == 0


def test_nested_blocks() -> None:
    net = tiny_net()
    calls: list[str] = []
    with hooks(pre=[(net[0], lambda m, a: calls.append("outer"))]):
        assert count_hooks(net) == 1
        with hooks(pre=[(net[0], lambda m, a: calls.append("inner"))], post=[(net[2], noop_post)]):
            assert count_hooks(net) == 3
            net(torch.ones(1, 4))
        assert count_hooks(net) == 1  # only the inner block's hooks went
        net(torch.ones(1, 4))
        with pytest.raises(KeyError):
            with hooks(post=[(net[0], noop_post)]):
                assert count_hooks(net) == 2
                raise KeyError("inner failure")
        assert count_hooks(net) == 1  # the outer hook survives an inner failure
    assert count_hooks(net) == 0
    assert calls == ["outer", "inner", "outer"]


def test_count_hooks_sees_hooks_registered_elsewhere() -> None:
    net = tiny_net()
    handle = net[1].register_forward_hook(noop_post)
    try:
        assert count_hooks(net) == 1
    finally:
        handle.remove()
    assert count_hooks(net) == 0


def test_first_tensor() -> None:
    t = torch.ones(2)
    assert first_tensor(t) is t
    assert first_tensor((t, None)) is t

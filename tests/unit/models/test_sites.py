"""Component names: "L.H" heads and "mlp.L" MLPs, their order, parsing and range checks."""

from __future__ import annotations

import pytest

from arithmech.errors import ConfigError
from arithmech.models.sites import Component, all_components, parse_component, parse_components
from arithmech.models.view import Dims

DIMS = Dims(n_layers=30, n_heads=9, n_kv_heads=3, d_model=576, d_head=64, d_vocab=49152)  # SmolLM2-135M
SMALL = Dims(n_layers=2, n_heads=3, n_kv_heads=1, d_model=12, d_head=4, d_vocab=10)


def test_all_components_order_and_count() -> None:
    names = [c.name for c in all_components(SMALL)]
    assert names == ["0.0", "0.1", "0.2", "mlp.0", "1.0", "1.1", "1.2", "mlp.1"]
    comps = all_components(DIMS)
    assert len(comps) == DIMS.n_layers * (DIMS.n_heads + 1) == 300
    assert len(set(comps)) == len(comps)
    layers = [c.layer for c in comps]
    assert layers == sorted(layers)
    for layer in range(DIMS.n_layers):  # per layer: heads 0..H-1, then the MLP
        block = comps[layer * (DIMS.n_heads + 1) : (layer + 1) * (DIMS.n_heads + 1)]
        assert [c.head for c in block] == [*range(DIMS.n_heads), None]


def test_component_properties() -> None:
    head, mlp = Component(14, 2), Component(20)
    assert (head.kind, head.name, str(head)) == ("head", "14.2", "14.2")
    assert (mlp.kind, mlp.name, str(mlp)) == ("mlp", "mlp.20", "mlp.20")
    assert Component(0, 0).kind == "head"  # head 0 is a head, not "no head"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("14.2", Component(14, 2)),
        ("0.0", Component(0, 0)),
        ("29.8", Component(29, 8)),
        (" 14.2 ", Component(14, 2)),
        ("mlp.20", Component(20)),
        ("mlp.0", Component(0)),
        ("20.mlp", Component(20)),
        ("L20.mlp", Component(20)),
        ("L0.mlp", Component(0)),
        ("014.02", Component(14, 2)),
    ],
)
def test_parse_component_accepts(text: str, expected: Component) -> None:
    parsed = parse_component(text, DIMS)
    assert parsed == expected
    assert parsed.head == expected.head  # mlp: None, head 0: 0


@pytest.mark.parametrize("component", all_components(SMALL))
def test_parse_component_round_trips_names(component: Component) -> None:
    assert parse_component(component.name, SMALL) == component


@pytest.mark.parametrize(
    "text",
    ["", "14", "14.", ".2", "14.2.1", "L14.2", "14.h2", "mlp", "mlp.", "MLP.20", "mlp20", "mlp.20.1",
     "L20", "20.mlp.1", "head.14.2", "-1.2", "14.-2", "mlp.-1", "a.b", "14,2", "1 4.2"],
)  # fmt: skip
def test_parse_component_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="not a name arithmech knows") as info:
        parse_component(text, DIMS)
    assert "14.2" in str(info.value) and "mlp." in str(info.value)  # says how to write names


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("30.0", r"layers 0\.\.29"),
        ("99.1", r"layers 0\.\.29"),
        ("mlp.30", r"layers 0\.\.29"),
        ("30.mlp", r"layers 0\.\.29"),
        ("3.9", r"heads 0\.\.8"),
        ("0.100", r"heads 0\.\.8"),
    ],
)
def test_parse_component_out_of_range(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_component(text, DIMS)
    assert repr(text) in str(info.value)


def test_parse_component_out_of_range_small_model() -> None:
    with pytest.raises(ConfigError, match=r"layers 0\.\.1"):
        parse_component("2.0", SMALL)
    with pytest.raises(ConfigError, match=r"heads 0\.\.2"):
        parse_component("1.3", SMALL)


def test_parse_components() -> None:
    assert parse_components("14.2,18.5,mlp.20", DIMS) == [Component(14, 2), Component(18, 5), Component(20)]
    assert parse_components(" 14.2 , mlp.20 ,", DIMS) == [Component(14, 2), Component(20)]
    assert parse_components("0.1", DIMS) == [Component(0, 1)]


@pytest.mark.parametrize("text", ["", " ", ",", " , ,"])
def test_parse_components_empty(text: str) -> None:
    with pytest.raises(ConfigError, match="no components given"):
        parse_components(text, DIMS)


def test_parse_components_reports_the_bad_one() -> None:
    with pytest.raises(ConfigError, match="'40.1'.*layers 0\\.\\.29"):
        parse_components("14.2,40.1,mlp.20", DIMS)
    with pytest.raises(ConfigError, match="'foo'"):
        parse_components("14.2, foo", DIMS)

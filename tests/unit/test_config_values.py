"""config_values.coerce: a YAML / --set value becomes the field's type, or one sentence naming field and type."""

from __future__ import annotations

from typing import Any

import pytest

from arithmech.config_values import coerce
from arithmech.errors import ConfigError

ACCEPTED = [
    (8, int, 8),
    (3, float, 3.0),
    (0.5, float | None, 0.5),
    (None, int | None, None),
    (True, bool, True),
    ("addition", str, "addition"),
    (2, str, "2"),  # a revision or MLP layer written as a number
    ("20,21", tuple[int, ...], (20, 21)),
    ([20, 21], tuple[int, ...] | None, (20, 21)),
    (5, tuple[int, ...], (5,)),
    ("addition, multiplication", tuple[str, ...], ("addition", "multiplication")),
    ([20, "mlp.21"], tuple[str, ...], ("20", "mlp.21")),
    ({"model": "x"}, dict[str, Any], {"model": "x"}),
]

REFUSED = [
    ("abc", int, "s.f takes a whole number (int); got 'abc'"),
    (8.5, int, "s.f takes a whole number (int); got 8.5"),
    (True, int, "s.f takes a whole number (int); got True"),
    (None, int, "s.f takes a whole number (int); got null"),
    (True, float, "s.f takes a number (float); got True"),
    ("no", bool, "s.f takes true or false (bool); got 'no'"),
    (1, bool, "s.f takes true or false (bool); got 1"),
    (True, str, "s.f takes text (str); got True"),
    (2.1, tuple[str, ...] | None, "s.f takes a list of names (tuple of str), or null; got 2.1; write it in quotes"),
    ("20,x", tuple[int, ...], "s.f takes a list of whole numbers (tuple of int); got '20,x'"),
    ("x", dict[str, Any], "s.f takes a mapping of settings (dict); got 'x'"),
]


@pytest.mark.parametrize(("value", "hint", "expected"), ACCEPTED)
def test_accepted(value: Any, hint: Any, expected: Any) -> None:
    got = coerce(value, hint, "s.f")
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(("value", "hint", "message"), REFUSED)
def test_refused_with_the_field_and_its_type(value: Any, hint: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        coerce(value, hint, "s.f")
    assert message in str(err.value)

"""Argument type checks against annotations."""

import enum
import pathlib
from typing import Any, Literal, Optional

import pytest

from xser.model.typecheck import Mismatch, check, check_at


class Color(enum.Enum):
    RED = "r"
    GREEN = 2

OK = [
    (1, int, 1), (1, float, 1.0), (1.5, float, 1.5), ("a", str, "a"), (True, bool, True), (None, None, None),
    ([1, 2], list[int], [1, 2]), ([1, 2], tuple[int, ...], (1, 2)), ([1, "a"], tuple[int, str], (1, "a")),
    ({"a": 1}, dict[str, int], {"a": 1}), ({"a": 1}, dict[str, float], {"a": 1.0}),
    (None, Optional[int], None), (3, int | str, 3), ("x", Literal["x", "y"], "x"), (object(), Any, None),
    ([1], list, [1]), ({"a": [1]}, dict, {"a": [1]}),
    ("data/x.txt", pathlib.Path, pathlib.Path("data/x.txt")), ("RED", Color, Color.RED), ("r", Color, Color.RED),
    (2, Color, Color.GREEN), ([1, 2, 3], tuple[int, ...], (1, 2, 3)), ({"m": {"b": 1}}, dict[str, dict[str, float]], {"m": {"b": 1.0}}),
]

#: value, annotation, where the mismatch is (inside the value), what was expected there
BAD = [
    ("1", int, (), "int"), (True, int, (), "int"), (True, float, (), "float"), (1, str, (), "str"), (1, bool, (), "bool"),
    ([1, "a"], list[int], (1,), "int"), ((1,), tuple[int, int], (), "tuple[int, int] (2 items)"),
    ({"a": "b"}, dict[str, int], ("a",), "int"),
    ("z", Literal["x", "y"], (), "one of 'x', 'y'"), (1.5, int | str, (), "int | str"), (1, Literal[True], (), "one of True"),
    ("ab", list[str], (), "list[str]"), (1, None, (), "None"), (3, pathlib.Path, (), "Path"),
    ("BLUE", Color, (), "Color (one of RED, GREEN)"), ("2", Color, (), "Color (one of RED, GREEN)"),
    ({"opt": {"beta": "high"}}, dict[str, dict[str, float]], ("opt", "beta"), "float"),
    ([1, 2, "x"], tuple[int, ...], (2,), "int"), ([[1], [2, "y"]], list[list[int]] | None, (1, 1), "int"),
]


@pytest.mark.parametrize("value, tp, out", OK)
def test_accepts(value, tp, out):
    """Values that fit pass, with ints widened to floats and lists to tuples."""
    got, expected = check(value, tp)
    assert expected is None
    if out is not None or value is None:
        assert got == out and type(got) is type(out)


@pytest.mark.parametrize("value, tp, where, expected", BAD)
def test_rejects(value, tp, where, expected):
    """Values that do not fit name the element that does not and the type expected there."""
    with pytest.raises(Mismatch) as info:
        check_at(value, tp)
    assert (info.value.where, info.value.expected) == (where, expected)
    assert check(value, tp)[1] == expected


def test_classes():
    """Classes are checked with isinstance."""

    class A:
        pass

    assert check(A(), A)[1] is None and check(1, A)[1] == "A"

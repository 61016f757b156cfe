"""Argument type checks against annotations."""

from typing import Any, Literal, Optional

import pytest

from xser.model.typecheck import check

OK = [
    (1, int, 1), (1, float, 1.0), (1.5, float, 1.5), ("a", str, "a"), (True, bool, True), (None, None, None),
    ([1, 2], list[int], [1, 2]), ([1, 2], tuple[int, ...], (1, 2)), ([1, "a"], tuple[int, str], (1, "a")),
    ({"a": 1}, dict[str, int], {"a": 1}), ({"a": 1}, dict[str, float], {"a": 1.0}),
    (None, Optional[int], None), (3, int | str, 3), ("x", Literal["x", "y"], "x"), (object(), Any, None),
    ([1], list, [1]), ({"a": [1]}, dict, {"a": [1]}),
]

BAD = [
    ("1", int, "int"), (True, int, "int"), (True, float, "float"), (1, str, "str"), (1, bool, "bool"),
    ([1, "a"], list[int], "list[int]"), ((1,), tuple[int, int], "tuple[int, int]"), ({"a": "b"}, dict[str, int], "dict[str, int]"),
    ("z", Literal["x", "y"], "one of 'x', 'y'"), (1.5, int | str, "int | str"), (1, Literal[True], "one of True"),
    ("ab", list[str], "list[str]"), (1, None, "None"),
]


@pytest.mark.parametrize("value, tp, out", OK)
def test_accepts(value, tp, out):
    """Values that fit pass, with ints widened to floats and lists to tuples."""
    got, expected = check(value, tp)
    assert expected is None
    if out is not None or value is None:
        assert got == out and type(got) is type(out)


@pytest.mark.parametrize("value, tp, expected", BAD)
def test_rejects(value, tp, expected):
    """Values that do not fit give the expected type's name."""
    assert check(value, tp)[1] == expected


def test_classes():
    """Classes are checked with isinstance."""

    class A:
        pass

    assert check(A(), A)[1] is None and check(1, A)[1] == "A"

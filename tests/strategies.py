"""Hypothesis strategies shared by the tests."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from components import Leaf, Node
from xser.storage.dtypes import DTYPES
from xser.storage.formats.npy import describe_dtype

# Every kind of dtype numpy stores in .npy without pickle.
scalar_dtypes = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="?"),
    hnp.unsigned_integer_dtypes(endianness="?"),
    hnp.floating_dtypes(endianness="?", sizes=(16, 32, 64)),
    hnp.floating_dtypes(endianness="=", sizes=(128,)) if hasattr(np, "float128") else hnp.floating_dtypes(sizes=(64,)),
    hnp.complex_number_dtypes(endianness="?"),
    hnp.datetime64_dtypes(endianness="?"),
    hnp.timedelta64_dtypes(endianness="?"),
    hnp.byte_string_dtypes(min_len=1, max_len=6),
    hnp.unicode_string_dtypes(min_len=1, max_len=4, endianness="?"),
)
record_dtypes = hnp.array_dtypes(subtype_strategy=scalar_dtypes, min_size=1, max_size=3)
# numpy lacks these; xser stores their bits (ml_dtypes, a test dependency, gives them to numpy)
ml_dtypes_ = st.sampled_from(sorted(t for t, d in DTYPES.items() if d.extension)).map(lambda t: np.dtype(getattr(ml_dtypes, t)))
all_dtypes = st.one_of(scalar_dtypes, record_dtypes, ml_dtypes_)
# Raw bytes carry no meaning: refused before anything is written.
void_dtypes = st.integers(1, 8).map(lambda n: np.dtype(f"V{n}"))

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
param_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,12}", fullmatch=True)


@st.composite
def arrays(draw, dtype=all_dtypes):
    dt = draw(dtype)
    shape = draw(shapes)
    if dt.kind == "V" and dt.names is None or dt.type.__module__ == "ml_dtypes":  # any bits: hypothesis has no strategy
        raw = draw(hnp.arrays(np.uint8, shape + (dt.itemsize,)))
        arr = raw.view(dt).reshape(shape)
    else:
        arr = draw(hnp.arrays(dt, shape))
    if draw(st.booleans()) and arr.ndim >= 2:
        arr = np.asfortranarray(arr)
    return arr


@st.composite
def param_sets(draw):
    """{param name: array}: a random parameter collection."""
    return draw(st.dictionaries(param_names, arrays(), min_size=0, max_size=4))


def leaf_of(arrays_by_name: dict) -> Leaf:
    """A Leaf component holding exactly these arrays."""
    spec = {k: [describe_dtype(a.dtype), list(a.shape)] for k, a in arrays_by_name.items()}
    leaf = Leaf(spec)
    sub = __import__("xser").params(leaf)
    for k, a in arrays_by_name.items():
        sub[k] = a
    return leaf


def as_stored(a: np.ndarray) -> np.ndarray:
    """What ``np.load`` gives for a saved array: bfloat16 and float8 as their bits, other dtypes as they are."""
    from xser.storage.dtypes import storage_of

    return a.view(storage_of(a.dtype))


def bit_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes(order="A") == b.tobytes(order="A")


# Plain YAML data: what a constructor argument may hold.
keys = st.text(min_size=0, max_size=8)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=12),
)
plain = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)),
    max_leaves=8,
)


@st.composite
def component_trees(draw):
    """A tree of Node and Leaf components with plain data, where some objects are shared."""
    pool = [leaf_of(draw(param_sets())) for _ in range(draw(st.integers(0, 3)))]

    def node(depth):
        kids = []
        for _ in range(draw(st.integers(0, 3 if depth < 3 else 0))):
            choice = draw(st.integers(0, 2))
            if choice == 0 and pool:
                kids.append(draw(st.sampled_from(pool)))  # possibly shared
            elif choice == 1:
                kids.append(node(depth + 1))
            else:
                kids.append(draw(plain))
        return Node(value=draw(plain), children=kids)

    return node(0)

"""The struct layout of a read's members: numbers written by numpy, read by struct as
Python's formatting of them would be."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest

from shardstream.formats.tar.read import _layout


def _formatted(pairs: np.ndarray) -> str:
    return "<" + "%dx%ds" * (len(pairs) // 2) % tuple(pairs.tolist())


@pytest.mark.parametrize("top", [0, 1, 9, 10, 99, 100, 512, 65_535, 10**6, 2**32 - 1, 2**32, 2**40])
def test_layout_reads_as_the_formatted_one(top: int) -> None:
    rng = np.random.default_rng(top)
    pairs = rng.integers(0, top + 1, 40, dtype=np.int64)
    pairs[0], pairs[-1] = 0, top
    layout = _layout(pairs)
    assert layout.startswith(b"<")
    codes = layout[1:].decode("ascii")
    counts = [int(code[:-1]) for code in codes.replace("x", "x ").replace("s", "s ").split()]
    assert counts == pairs.tolist()
    assert re.sub("[0-9]", "", codes) == "xs" * (len(pairs) // 2)
    if top < 2**20:  # small enough to unpack here
        assert struct.calcsize(layout) == struct.calcsize(_formatted(pairs))


def test_layout_unpacks_the_same_values() -> None:
    data = bytes(range(256)) * 8
    pairs = np.array([0, 3, 5, 2, 0, 7, 100, 0, 12, 250], dtype=np.int64)
    assert struct.unpack_from(_layout(pairs), data) == struct.unpack_from(_formatted(pairs), data)

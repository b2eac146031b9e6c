"""Unit tests of the plan's parts: keyed permutations, window layout, round-robin,
intervals, and the value types."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.plan import PlanConfig, Run, Window
from shardstream.plan.intervals import compose, from_points, merge, points, select
from shardstream.plan.randomness import permutation, random_words
from shardstream.plan.windows import SliceLayout, lanes_for, round_robin, split_even

FAST = settings(max_examples=200, deadline=None)


def test_keyed_permutations_are_stable_golden_values():
    """numpy promises these raw streams; a change here changes every user's order."""
    assert permutation(10, (7, 2, 2, 0, 1, 0, 3)).tolist() == [4, 5, 9, 3, 2, 7, 8, 6, 1, 0]
    assert random_words(2, (0, 0, 1)).tolist() == [17438012079374151748, 7595620719061514866]


def test_keyed_permutations_are_the_same_in_another_process():
    code = "from shardstream.plan.randomness import permutation; print(permutation(1000, (5, 1, 2)).sum(), permutation(50, (5, 1, 2))[:5].tolist())"
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed},
        )
        for seed in ("1", "2")
    ]
    expected = f"{permutation(1000, (5, 1, 2)).sum()} {permutation(50, (5, 1, 2))[:5].tolist()}"
    assert [r.stdout.strip() for r in runs] == [expected, expected]


@FAST
@given(st.integers(0, 3000), st.lists(st.integers(-(2**70), 2**70), min_size=1, max_size=7))
def test_permutation_is_a_permutation(n, key):
    got = permutation(n, tuple(key))
    assert got.dtype == np.int64
    assert sorted(got.tolist()) == list(range(n))


def test_keys_that_differ_only_in_how_words_split_give_other_permutations():
    # SeedSequence drops trailing zero words, and ints wider than 32 bits span words.
    perms = {tuple(permutation(20, key).tolist()) for key in [(0, 1), (2**32, 0), (1, 0), (0, 2**32), (0, 0)]}
    assert len(perms) == 5


@FAST
@given(st.integers(0, 500), st.integers(1, 80), st.integers(1, 40))
def test_slice_layout_windows_partition_the_slice(length, window, lanes):
    layout = SliceLayout.of(length, window, lanes)
    seen = []
    for j in range(layout.num_windows):
        offsets = points(layout.window(j)).tolist()
        assert 0 < len(offsets) <= window
        assert offsets == sorted(offsets)
        assert layout.before(j) == len(seen)
        seen += offsets
    assert sorted(seen) == list(range(length))
    assert layout.before(layout.num_windows) == length
    for consumed in {0, length // 3, length // 2, length}:
        j, used = layout.locate(consumed)
        assert layout.before(j) + used == consumed
        assert j == layout.num_windows or used < len(points(layout.window(j)))
    later = sorted(o for k in range(1, layout.num_windows) for o in points(layout.window(k)).tolist())
    assert points(layout.after(0)).tolist() == later
    # Striping costs at most twice the windows consecutive ones would need.
    assert layout.num_windows <= 2 * -(-length // window) + 2


def test_lanes_follow_the_shard_size_and_shuffle():
    sizes = np.array([100, 0, 100, 100])
    assert lanes_for(400, sizes, shuffle=True) == 16  # quarter-shard runs
    assert lanes_for(400, sizes, shuffle=False) == 1
    assert lanes_for(10, sizes, shuffle=True) == 1
    assert lanes_for(10, np.zeros(3, dtype=np.int64), shuffle=True) == 1


@FAST
@given(st.integers(0, 100), st.integers(1, 9), st.integers(1, 5), st.data())
def test_round_robin_matches_a_simulation_of_torch(per_rank, workers, batch, data):
    lengths = split_even(per_rank, workers)
    batches = [-(-int(n) // batch) for n in lengths]
    order = [w for turn in range(max(batches)) for w in range(workers) if turn < batches[w]]
    steps = data.draw(st.integers(0, len(order)))
    taken, next_worker = round_robin(batches, steps)
    assert taken == [order[:steps].count(w) for w in range(workers)]
    assert next_worker == (order[steps] if steps < len(order) else 0)


def test_round_robin_with_unbalanced_workers():
    assert round_robin([3, 1, 0, 2], 4) == ([2, 1, 0, 1], 3)
    assert round_robin([3, 1, 0, 2], 6) == ([3, 1, 0, 2], 0)
    assert split_even(7, 3).tolist() == [3, 2, 2]


def test_intervals_helpers():
    a = (np.array([0, 5, 7]), np.array([3, 7, 9]))
    assert [x.tolist() for x in merge(a)] == [[0, 5], [3, 9]]
    assert points(a).tolist() == [0, 1, 2, 5, 6, 7, 8]
    assert [x.tolist() for x in select(a, 2, 5)] == [[2, 5], [3, 7]]
    assert [x.tolist() for x in from_points(np.array([4, 5, 6, 9, 3, 4]))] == [[4, 9, 3], [7, 10, 5]]
    # ranks [0, 4) -> 100.., [4, 6) -> 50..; query [2, 5) and [0, 1)
    got = compose(
        (np.array([2, 0]), np.array([5, 1])), np.array([0, 4]), np.array([100, 50]), np.array([4, 2])
    )
    assert [x.tolist() for x in got] == [[102, 50, 100], [104, 51, 101]]


def test_window_value_semantics():
    runs = (Run(2, 3, 5), Run(0, 0, 1))
    window = Window(runs, np.array([2, 0, 1]))
    assert window == Window(runs, np.array([2, 0, 1]))
    assert window != Window(runs, np.array([0, 1, 2]))
    assert len(window) == 3
    assert len(runs[0]) == 2
    # yield order (order [2, 0, 1] of the read order (2, 3), (2, 4), (0, 0)), in chunks of any size
    for chunk in (1, 2, 8192):
        pairs = [p for s, i in window.samples(chunk) for p in zip(s.tolist(), i.tolist(), strict=True)]
        assert pairs == [(0, 0), (2, 3), (2, 4)]
    assert list(Window((), np.zeros(0, dtype=np.int64)).samples()) == []
    with pytest.raises(TypeError):
        hash(window)
    with pytest.raises(AttributeError):
        window.runs = ()  # type: ignore[misc]
    assert PlanConfig() == PlanConfig(shuffle=True, seed=0, drop_last=False, shuffle_window=None)

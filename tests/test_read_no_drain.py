"""A read pipeline with no drain: the reads of the next piece of an unshuffled window, and of
the next window, go while the current ones are still arriving and being taken, within the
read budget, whatever the shards' size next to it (NOTE [ Unshuffled windows in pieces ])."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import shardstream
from shardstream.dataset.budget import PIECES_IN_BUDGET, ReadBudget, in_pieces, piece_limit
from shardstream.dataset.fetch import ByteFetcher
from shardstream.dataset.reader import WindowReader
from shardstream.manifest import ShardInfo
from shardstream.plan import Run, Window
from shardstream.storage import Storage
from tests.test_concurrent_reads import _pack

MB = 2**20


class HeldReads:
    """Shard reads held, before any of their bytes is asked for, until a read of a later
    piece has started: a pipeline that sends a piece's GETs only once the piece before
    is in (or half in, or taken) waits on itself, and each read held so says it
    (``drained``) when its wait gives up. ``pieces``: each piece's ``(shard, first byte,
    end)`` spans of its samples, in stream order; reads of the last are not held."""

    def __init__(self, paths: list[str], pieces: list[list[tuple[int, int, int]]]) -> None:
        self.number = {path: i for i, path in enumerate(paths)}
        self.pieces = pieces
        self.started: list[int] = []  # the piece of each read started, in order
        self.drained: list[int] = []
        self.cond = threading.Condition()

    def piece_of(self, shard: int, rng) -> int:  # type: ignore[no-untyped-def]
        """The piece whose samples hold the middle of ``rng`` (None: all of ``shard``)."""
        middle = 0 if rng is None else (rng.start + rng.end) // 2
        for number, spans in enumerate(self.pieces):
            if any(s == shard and (rng is None or lo <= middle < hi) for s, lo, hi in spans):
                return number
        raise AssertionError(f"no piece reads shard {shard} at {rng}")

    def read(self, fetcher: ByteFetcher, path: str, rng, read):  # type: ignore[no-untyped-def]
        if path not in self.number:  # a sidecar
            return read(fetcher, path, rng)
        piece = self.piece_of(self.number[path], rng)
        with self.cond:
            self.started.append(piece)
            self.cond.notify_all()
            if piece != len(self.pieces) - 1 and not self.cond.wait_for(
                lambda: self.later_started(piece), timeout=30
            ):
                self.drained.append(piece)
        return read(fetcher, path, rng)

    def later_started(self, piece: int) -> bool:
        with self.cond:
            return any(other > piece for other in self.started)


@pytest.mark.s3
def test_the_next_pieces_reads_start_before_the_current_piece_is_in_or_taken(s3, monkeypatch):
    # 6 shards of 8 samples of 64 KiB; windows of 3 shards; a budget of four half shards:
    # each shard is two pieces, and every read is held, none of its bytes in, until a
    # read of a later piece has started, across the windows' ends too.
    base, options = s3
    payloads = _pack(base + "/ds", options, shards=6, samples=8, size=64 * 1024)
    storage = Storage(base + "/ds", options)
    manifest = storage.read_manifest()
    shard_bytes = max(info.bytes for info in manifest.shards)
    budget = PIECES_IN_BUDGET * (shard_bytes // 2 + 64 * 1024)
    dataset = shardstream.StreamingDataset(
        base + "/ds", storage_options=options, shuffle=False, read_budget=budget
    )
    plan = dataset.make_plan(num_workers=1, consume=False)
    windows = list(plan.worker_windows(0, 0))
    assert [len(w.runs) for w in windows] == [3, 3]
    reader = WindowReader(storage, manifest, read_budget=budget)
    spans = [[_span(reader, run) for run in piece.runs] for piece in reader.in_pieces(iter(windows))]
    held = HeldReads([info.path for info in manifest.shards], spans)
    read = ByteFetcher.read
    monkeypatch.setattr(ByteFetcher, "read", lambda self, path, rng: held.read(self, path, rng, read))
    got: dict[str, bytes] = {}
    taken = 0
    for _, samples, _ in reader.stream(iter(windows)):
        if taken < len(spans) - 1:  # before this piece is taken, a later one's reads went
            assert held.later_started(taken)
        taken += 1
        got.update((s["__key__"], bytes(s["bin"])) for s in samples)
    storage.close()
    assert held.drained == []
    assert got == payloads
    # two pieces a shard, across both windows' ends, and the first piece's short head
    assert taken == len(spans) == 13
    assert reader.budget is not None
    assert 0 < reader.budget.peak <= budget
    assert reader.budget.held == 0


def _span(reader: WindowReader, run: Run) -> tuple[int, int, int]:
    """``(shard, first byte, end)`` of ``run``'s samples, as its shard's sample index has them."""
    lo, hi = reader.index(run.shard).byte_ranges(np.array([run.start]), np.array([run.stop]))
    return run.shard, int(lo[0]), int(hi[0])


def _shards(count: int, samples: int, sample_bytes: int) -> list[ShardInfo]:
    size = samples * sample_bytes
    return [
        ShardInfo(path=f"{i}.tar", samples=samples, bytes=size, sha256="", index=f"{i}.idx")
        for i in range(count)
    ]


@pytest.mark.parametrize(
    ("samples", "sample_bytes"),
    [(8, MB), (32, MB), (1024, MB), (33_000, 250)],  # shards of 8 MB, 32 MB, 1 GB, 8 MB of small samples
)
def test_pieces_let_the_next_one_go_beside_the_one_in_flight_whatever_the_shard_size(samples, sample_bytes):
    # The budget counts bytes, not windows: whatever the shards' size, two pieces fit in
    # it beside each other, however little of either has arrived, so the one after the
    # piece in flight goes as soon as the caller lets go of the one it took; and most
    # fit three at once, the caller's and two in flight.
    limit = 64 * MB
    shards = _shards(8, samples, sample_bytes)
    runs = [Run(i, 0, samples) for i in range(len(shards))]
    windows = [
        Window(part, np.arange(sum(map(len, part))), in_run_order=True) for part in (runs[:4], runs[4:])
    ]
    pieces = list(in_pieces(iter(windows), shards, piece_limit(limit)))
    sizes = [sum(len(run) * sample_bytes for run in piece.runs) for piece in pieces]
    assert sum(sizes) == sum(info.bytes for info in shards)
    assert max(sizes) <= 1.5 * limit / PIECES_IN_BUDGET + sample_bytes
    budget = ReadBudget(limit)
    for ticket, size in enumerate(sizes):  # the caller's piece given back, the next goes at once
        if ticket >= 2:
            budget.give_back(ticket - 2)
        assert budget.held + size <= budget.limit  # else it would wait: the wire would drain
        budget.take(ticket, size)
    assert budget.peak <= limit
    threes = [sum(sizes[i : i + 3]) <= limit for i in range(len(sizes) - 2)]
    assert threes.count(True) >= len(threes) - 2  # at a window's ends a tail may join
    budget.close()


def test_a_cached_dataset_keeps_pieces_of_the_budget():
    # a shard's first read fills all of its cache entry: pieces of part of one would wait on it
    assert piece_limit(64 * MB, cached=True) == 64 * MB
    assert piece_limit(64 * MB) == 64 * MB // PIECES_IN_BUDGET
    assert piece_limit(2) == 1

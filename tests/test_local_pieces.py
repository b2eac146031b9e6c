"""A local folder read by copy takes its unshuffled windows in pieces of a quarter of the
read budget (NOTE [ Local copies in pieces ] in shardstream/dataset/reader.py): no read of a
piece passes its bytes, the samples and the resume state are those of whole windows, and a
mapped folder's windows stay whole."""

from __future__ import annotations

import os

import pytest

import shardstream
from shardstream.dataset.budget import PIECES_IN_BUDGET
from shardstream.dataset.fetch import ByteFetcher
from shardstream.pack import ShardWriter

SAMPLE = 64 * 1024  # one 64 KiB member a sample: 512 B of header, the rest payload
PER_SHARD = 16
BLOCK = 64 * 1024  # a read reaches out to the CRC blocks at its ends (NOTE [ Checksummed reads ])


def _pack(url: str, shards: int = 6) -> dict[str, bytes]:
    payloads = {f"{i:05d}": os.urandom(SAMPLE - 512 - 16 * (i % 3)) for i in range(shards * PER_SHARD)}
    with ShardWriter(url, format="tar", samples_per_shard=PER_SHARD) as writer:
        for key, payload in payloads.items():
            writer.write({"__key__": key, "bin": payload})
    return payloads


@pytest.fixture
def reads(monkeypatch):
    """The byte ranges of every shard read, as ``(path, length)``; sidecars left out."""
    seen: list[tuple[str, int]] = []
    read = ByteFetcher.read

    def spy(self, path, rng):  # type: ignore[no-untyped-def]
        data = read(self, path, rng)
        if path.endswith(".tar"):
            seen.append((path, len(data)))
        return data

    monkeypatch.setattr(ByteFetcher, "read", spy)
    return seen


def _epoch(url: str, **options: object) -> list[tuple[str, bytes]]:
    dataset = shardstream.StreamingDataset(url, shuffle=False, decode=False, **options)
    return [(s["__key__"], bytes(s["bin"])) for s in dataset]


def test_a_copied_window_is_read_in_pieces_of_a_quarter_of_the_budget(tmp_path, reads):
    url = str(tmp_path / "ds")
    payloads = _pack(url)
    shard = PER_SHARD * SAMPLE
    budget = PIECES_IN_BUDGET * shard // 2  # a piece is half a shard
    got = _epoch(url, local_reads="copy", read_budget=budget)
    assert got == list(payloads.items())
    piece = budget // PIECES_IN_BUDGET
    assert reads, "no shard was read"
    assert max(length for _, length in reads) <= 1.5 * piece + 2 * BLOCK < shard
    assert len(reads) >= 2 * 6  # two pieces a shard at least: no window read whole


def test_a_mapped_window_stays_whole(tmp_path, reads):
    url = str(tmp_path / "ds")
    payloads = _pack(url)
    budget = PIECES_IN_BUDGET * PER_SHARD * SAMPLE // 2
    assert _epoch(url, local_reads="map", read_budget=budget) == list(payloads.items())
    assert len(reads) <= 6  # a read a shard at most: its runs whole


def test_a_resume_inside_a_piece_gives_the_rest_of_the_epoch(tmp_path):
    url = str(tmp_path / "ds")
    payloads = _pack(url)
    budget = PIECES_IN_BUDGET * PER_SHARD * SAMPLE // 3
    first = shardstream.StreamingDataset(url, shuffle=False, decode=False, read_budget=budget)
    stream = iter(first)
    head = [next(stream)["__key__"] for _ in range(PER_SHARD + 7)]
    state = first.state_dict()
    stream.close()
    again = shardstream.StreamingDataset(url, shuffle=False, decode=False, read_budget=budget)
    again.load_state_dict(state)
    tail = [s["__key__"] for s in again]
    assert head + tail == list(payloads)


@pytest.mark.parametrize(
    "options",
    [
        {"decode": True},  # windows decoded in bulk, a column at a time
        {"decode": False, "on_error": "skip"},
        {"decode": False, "verify_checksums": False},
    ],
    ids=["decoded", "skip", "unchecked"],
)
def test_pieces_give_what_whole_windows_give(tmp_path, options):
    url = str(tmp_path / "ds")
    with ShardWriter(url, format="tar", samples_per_shard=PER_SHARD) as writer:
        for i in range(5 * PER_SHARD + 3):
            writer.write(
                {
                    "__key__": f"{i:05d}",
                    "bin": os.urandom(SAMPLE - 600),
                    "cls": b"%d" % i,
                    "json": b"[%d]" % i,
                }
            )
    budget = PIECES_IN_BUDGET * PER_SHARD * SAMPLE // 3

    def epoch(**reads: object) -> list:  # type: ignore[type-arg]
        dataset = shardstream.StreamingDataset(url, shuffle=False, read_budget=budget, **options, **reads)
        return [{k: (bytes(v) if isinstance(v, memoryview) else v) for k, v in s.items()} for s in dataset]

    pieces, whole = epoch(local_reads="copy"), epoch(local_reads="map")
    assert len(pieces) == 5 * PER_SHARD + 3
    assert pieces == whole


def test_a_data_loader_over_pieces_gives_every_sample_once(tmp_path):
    url = str(tmp_path / "ds")
    payloads = _pack(url)
    budget = PIECES_IN_BUDGET * PER_SHARD * SAMPLE // 3
    dataset = shardstream.StreamingDataset(
        url, shuffle=False, decode=False, read_budget=budget, local_reads="copy"
    )
    loader = shardstream.DataLoader(dataset, batch_size=5, num_workers=2, collate_fn=list)
    got = {s["__key__"]: bytes(s["bin"]) for batch in loader for s in batch}
    assert got == payloads

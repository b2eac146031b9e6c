"""A MapDataset's single samples of a local folder read by copy come from the file kept open
in one call (``OpenFiles.read_span``, bound per shard), not through the reader's
``read_bytes``; one on other storage (no files kept open) reads through it."""

from __future__ import annotations

import pytest

import shardstream
from shardstream.dataset.window_fetch import WindowFetcher
from shardstream.pack import ShardWriter
from shardstream.storage.open_files import OpenFiles


def _write(url: str) -> None:
    with ShardWriter(url, format="tar", samples_per_shard=10) as writer:
        for i in range(30):
            writer.write({"__key__": f"k{i:03d}", "txt": f"text {i}"})


def _spy(monkeypatch: pytest.MonkeyPatch, owner: type, name: str) -> list[tuple]:
    calls: list[tuple] = []
    original = getattr(owner, name)

    def spying(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, spying)
    return calls


@pytest.mark.parametrize("local", [True, False])
def test_a_single_sample_is_read_directly_from_its_open_file(tmp_path, monkeypatch, local):
    url = str(tmp_path / "ds") if local else f"memory://direct-{tmp_path.name}"
    _write(url)
    spans = _spy(monkeypatch, OpenFiles, "read_span")
    fetched = _spy(monkeypatch, WindowFetcher, "read_bytes")
    with shardstream.MapDataset(url) as dataset:
        expected = list(shardstream.StreamingDataset(url, shuffle=False))
        assert [dataset[i] for i in (3, 4, 17, 3, 29)] == [expected[i] for i in (3, 4, 17, 3, 29)]
    if not local:  # no file kept open: the reader's reads
        assert spans == []
        assert len(fetched) == 5
    else:
        assert fetched == []
        assert len(spans) == 5
        assert {call[0] for call in spans} == {"shard-000000.tar", "shard-000001.tar", "shard-000002.tar"}

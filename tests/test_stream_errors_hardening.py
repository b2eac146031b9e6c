"""Per-sample errors while streaming follow ``on_error`` (issue 10, clear errors).

A refused pickle is one sample's problem like a field a decoder cannot read: with
``on_error="skip"`` that sample is left out and reported, the others stream.
"""

from __future__ import annotations

import logging
import pickle

import pytest

import shardstream
from shardstream.dataset.decode import PickleRefusedError
from shardstream.pack import ShardWriter


@pytest.fixture
def with_pickles(tmp_path):
    """10 samples in 3 tar shards; samples 3 and 7 carry a pickled field."""
    url = str(tmp_path / "ds")
    with ShardWriter(url, format="tar", samples_per_shard=4) as writer:
        for i in range(10):
            sample = {"__key__": f"k{i:02d}", "txt": f"sample {i}"}
            if i in (3, 7):
                sample["pkl"] = pickle.dumps({"i": i})
            writer.write(sample)
    return url


def test_a_refused_pickle_is_skipped_with_on_error_skip(with_pickles, caplog):
    dataset = shardstream.StreamingDataset(with_pickles, shuffle=False, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        keys = [sample["__key__"] for sample in dataset]
    assert keys == [f"k{i:02d}" for i in range(10) if i not in (3, 7)]
    assert dataset.num_skipped == 2
    reported = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(reported) == 2  # the first skip of each shard: 3 is in shard 0, 7 in shard 1
    for part in ("'pkl'", "k03", "shard-000000.tar"):
        assert part in reported[0]


def test_a_refused_pickle_is_skipped_through_the_dataloader(with_pickles):
    dataset = shardstream.StreamingDataset(with_pickles, shuffle=False, on_error="skip")
    loader = shardstream.DataLoader(dataset, batch_size=None, num_workers=1)
    keys = sorted(sample["__key__"] for sample in loader)
    assert keys == [f"k{i:02d}" for i in range(10) if i not in (3, 7)]


def test_a_refused_pickle_still_raises_by_default_and_names_the_sample(with_pickles):
    with pytest.raises(PickleRefusedError, match="allow_pickle") as info:
        list(shardstream.StreamingDataset(with_pickles, shuffle=False))
    assert info.value.shard == "shard-000000.tar"
    assert info.value.offset is not None
    assert "k03" in str(info.value)
    allowed = list(shardstream.StreamingDataset(with_pickles, shuffle=False, allow_pickle=True))
    assert [s["pkl"] for s in allowed if s["pkl"] is not None] == [{"i": 3}, {"i": 7}]  # None: no pkl

"""The pack lease and destination after review (issue 10): parts that overwrite at once,
whole packs against parts, a writer that fails or is dropped, fencing, ``index`` against
packs, impossible claims, cleanup that keeps the first error, and worker counts."""

from __future__ import annotations

import gc
import logging
import os
import threading
import time

import pytest

from shardstream import lock
from shardstream.catalog import index_dataset, verify_dataset
from shardstream.errors import PackError, StorageError, UsageError
from shardstream.lock import LEASE_ENV, PackLease
from shardstream.pack import ShardWriter, api, lifeline, pack
from shardstream.storage import Storage
from tests.test_pack import read_shards
from tests.test_pack_dest_safety import LINES, claim_doc, claims


def write_part(dest, part: str, tag: str, *, overwrite: bool = False) -> ShardWriter:
    writer = ShardWriter(dest, samples_per_shard=2, part=part, overwrite=overwrite)
    index = int(part.split("/")[0])
    for i in range(5):
        writer.write({"__key__": f"p{index}-{i:03d}", "txt": f"{tag} {i}"})
    return writer


def lease_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "shardstream-lease"]


def texts(dest) -> list[str]:
    return sorted(s["txt"].decode() for s in read_shards(dest))


# -- H1: parts that overwrite at the same time ------------------------------------------


def test_parts_overwriting_at_once_keep_each_others_new_shards(tmp_path):
    dest = tmp_path / "ds"
    for part in ("0/2", "1/2"):
        write_part(dest, part, "old").close()
    index_dataset(str(dest))
    w0 = write_part(dest, "0/2", "new", overwrite=True)
    w1 = write_part(dest, "1/2", "new", overwrite=True)
    w1.close()
    w0.close()
    index_dataset(str(dest))
    assert verify_dataset(str(dest)).ok
    assert texts(dest) == sorted(f"new {i}" for i in range(5) for _ in range(2))
    assert any(p.startswith("part-00001-shard-") for p in os.listdir(dest))


# -- H2: a whole-dataset pack and a part pack exclude each other -----------------------


def test_a_whole_pack_and_a_part_pack_exclude_each_other(tmp_path):
    dest = tmp_path / "ds"
    with ShardWriter(dest, samples_per_shard=2, part="0/2") as writer:
        with pytest.raises(UsageError, match="another pack is writing this destination"):
            ShardWriter(dest, samples_per_shard=2, overwrite=True)
        writer.write({"__key__": "k", "txt": "x"})
    with ShardWriter(dest, samples_per_shard=2, overwrite=True) as writer:
        with pytest.raises(UsageError, match="another pack is writing this destination"):
            ShardWriter(dest, samples_per_shard=2, part="1/2", overwrite=True)
        writer.write({"__key__": "k", "txt": "x"})
    assert verify_dataset(str(dest)).ok


def test_a_whole_lease_sees_part_claims_as_rivals_and_a_part_sees_whole_ones(tmp_path):
    storage = Storage(str(tmp_path / "ds"))
    part_claim = ".shardstream-lock-part-00003." + "cd" * 8 + ".json"
    storage.write(part_claim, claim_doc())
    with pytest.raises(UsageError, match=r"its lock \.shardstream-lock-part-00003"):
        PackLease(storage).acquire()
    storage.delete(part_claim)
    storage.write(".shardstream-lock." + "ef" * 8 + ".json", claim_doc())
    with pytest.raises(UsageError, match=r"its lock \.shardstream-lock\.efef"):
        PackLease(storage, "-part-00000").acquire()
    storage.close()


# -- H3: a writer that fails to start, or is never closed, leaves no lease ----------


def test_a_shard_writer_that_fails_to_start_leaves_no_lease(tmp_path):
    with pytest.raises(UsageError, match="smaller than an empty tar shard"):
        ShardWriter(tmp_path / "ds", shard_size=100)
    assert not lease_threads()
    assert not (tmp_path / "ds").exists() or not claims(str(tmp_path / "ds"))


def test_a_shard_writer_dropped_without_close_releases_its_lease(tmp_path):
    writer = ShardWriter(tmp_path / "ds", samples_per_shard=2)
    writer.write({"__key__": "k", "txt": "x"})
    assert claims(str(tmp_path / "ds"))
    del writer
    gc.collect()
    assert not lease_threads()
    assert not claims(str(tmp_path / "ds"))
    with ShardWriter(tmp_path / "ds", samples_per_shard=2) as writer:  # not blocked
        writer.write({"__key__": "k", "txt": "x"})


# -- M3: fencing -------------------------------------------------------------------------


def test_a_writer_whose_renewals_lag_stops_before_the_next_shard(tmp_path):
    writer = ShardWriter(tmp_path / "ds", samples_per_shard=2)
    for i in range(3):
        writer.write({"__key__": f"k{i}", "txt": "x"})
    lease = writer._target._lease
    lease._renewed = time.monotonic() - lease.seconds * 0.6  # as if renewals failed for 36 s
    writer.write({"__key__": "k3", "txt": "x"})  # into the open shard
    with pytest.raises(UsageError, match=r"this pack lost its lock \.shardstream-lock\..*half its lease"):
        writer.write({"__key__": "k4", "txt": "x"})  # would store shard 1 and start shard 2
    writer.abort()
    assert not (tmp_path / "ds" / ".shardstream" / "manifest.json").exists()
    assert not claims(str(tmp_path / "ds"))


def test_a_renewal_gives_up_retrying_within_a_quarter_of_the_lease(tmp_path, monkeypatch):
    made = []

    class Recording(Storage):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self.retry)

    monkeypatch.setattr(lock, "Storage", Recording)
    storage = Storage(str(tmp_path / "ds"))
    lease = PackLease(storage, seconds=8)
    lease.acquire()
    lease.release()
    storage.close()
    assert [r.timeout for r in made] == [2.0]


# -- M4: index against packs -----------------------------------------------------------


def test_index_is_refused_while_a_pack_writes(tmp_path):
    dest = tmp_path / "ds"
    with ShardWriter(dest, samples_per_shard=2) as writer:
        for i in range(5):
            writer.write({"__key__": f"k{i}", "txt": "x"})
        with pytest.raises(UsageError, match="another pack is writing this destination"):
            index_dataset(str(dest))
        assert not (dest / ".shardstream" / "manifest.json").exists()


def test_index_is_refused_over_a_killed_packs_output(tmp_path):
    dest = tmp_path / "ds"
    writer = ShardWriter(dest, samples_per_shard=2)
    for i in range(5):
        writer.write({"__key__": f"k{i}", "txt": "x"})
    writer.abort()  # as a killed pack: its shards and its record stay
    with pytest.raises(
        UsageError, match=r"an unfinished pack left \.shardstream-pack\.json.*rerun that pack"
    ):
        index_dataset(str(dest))
    assert not (dest / ".shardstream" / "manifest.json").exists()
    assert not claims(str(dest))


def test_index_joins_a_finished_part_that_a_rerun_left_a_record_of(tmp_path):
    dest = tmp_path / "ds"
    for part in ("0/2", "1/2"):
        write_part(dest, part, "old").close()
    write_part(dest, "1/2", "old").abort()  # a rerun, killed: it could only rewrite the same shards
    assert (dest / ".shardstream-pack-part-00001.json").exists()
    index_dataset(str(dest))
    assert verify_dataset(str(dest)).ok


def test_index_refuses_a_part_whose_overwrite_was_interrupted(tmp_path):
    dest = tmp_path / "ds"
    for part in ("0/2", "1/2"):
        write_part(dest, part, "old").close()
    index_dataset(str(dest))
    write_part(dest, "1/2", "new", overwrite=True).abort()  # its shards 0 and 1 are new, its record old
    with pytest.raises(UsageError, match=r"an unfinished pack left \.shardstream-pack-part-00001\.json"):
        index_dataset(str(dest))
    assert not (dest / ".shardstream" / "manifest.json").exists()


# -- M5: claims that could never run out ----------------------------------------------


def raw_claim(lease: str = "60.0", renewed: str | float | None = None) -> bytes:
    """A claim's JSON; ``renewed`` a float is seconds from now (made here, not at collection:
    pytest-xdist's workers must collect the same parameters)."""
    if renewed is None or isinstance(renewed, float):
        renewed = repr(time.time() + (renewed or 0.0))
    text = f'{{"run": "{"ab" * 8}", "host": "another-machine", "pid": 1, "lease": {lease}, "renewed": {renewed}}}'
    return text.encode()


@pytest.mark.parametrize(
    ("lease", "renewed"),
    [
        ("60.0", "NaN"),
        ("60.0", "Infinity"),
        ("Infinity", None),
        ("NaN", None),
        ("1" + "0" * 400, None),  # float() of it overflows
        ("1e9", None),
        ("0.01", None),
        ("60.0", "1e300"),
        ("60.0", 3600.0),  # renewed an hour from now
    ],
)
def test_an_impossible_claim_is_taken_over_with_a_warning(tmp_path, caplog, lease, renewed):
    storage = Storage(str(tmp_path / "ds"))
    name = ".shardstream-lock." + "ab" * 8 + ".json"
    storage.write(name, raw_claim(lease, renewed))
    taking = PackLease(storage)
    with caplog.at_level(logging.WARNING, logger="shardstream.pack"):
        taking.acquire()
    taking.release()
    assert "taking over" in caplog.text
    assert "unreadable" in caplog.text
    assert storage.list_files() == []
    storage.close()


# -- M8: cleanup keeps the first error and closes everything ---------------------------


@pytest.fixture
def claims_cannot_be_deleted(monkeypatch):
    delete = Storage.delete

    def refusing(self, path):
        if path.startswith(".shardstream-lock"):
            raise StorageError("the server refused the delete", url=self.url)
        delete(self, path)

    monkeypatch.setattr(Storage, "delete", refusing)


def test_a_failed_pack_raises_its_own_error_when_its_lock_cannot_be_deleted(
    tmp_path, caplog, claims_cannot_be_deleted
):
    (tmp_path / "bad.jsonl").write_text("".join(LINES[:50]) + "{not json\n")
    with (
        caplog.at_level(logging.WARNING, logger="shardstream.pack"),
        pytest.raises(PackError, match="invalid JSON"),
    ):
        pack(tmp_path / "bad.jsonl", tmp_path / "ds", samples_per_shard=10, workers=1)
    assert "cannot delete its lock" in caplog.text
    assert not lease_threads()


def test_an_aborted_writer_raises_its_own_error_when_its_lock_cannot_be_deleted(
    tmp_path, claims_cannot_be_deleted
):
    def program() -> None:
        with ShardWriter(tmp_path / "ds") as writer:
            writer.write({"__key__": "k", "txt": "x"})
            raise ValueError("the program's own error")

    with pytest.raises(ValueError, match="the program's own"):
        program()
    assert not lease_threads()


def test_a_bad_lease_setting_closes_the_destination_storage(tmp_path, monkeypatch):
    closed = []
    close = Storage.close

    def recording(self):
        closed.append(self.url)
        close(self)

    monkeypatch.setattr(Storage, "close", recording)
    monkeypatch.setenv(LEASE_ENV, "soon")
    (tmp_path / "c.jsonl").write_text("".join(LINES))
    with pytest.raises(UsageError, match=LEASE_ENV):
        pack(tmp_path / "c.jsonl", tmp_path / "ds", samples_per_shard=10, workers=1)
    assert str(tmp_path / "ds") in closed


# -- L1: a refused pack leaves no record ---------------------------------------------


def test_a_pack_refused_for_another_format_leaves_no_record(tmp_path):
    with ShardWriter(tmp_path / "ds", samples_per_shard=2) as writer:
        writer.write({"__key__": "k", "txt": "x"})
    with pytest.raises(UsageError, match="holds a tar dataset and this pack writes parquet"):
        ShardWriter(tmp_path / "ds", format="parquet", samples_per_shard=2)
    assert sorted(os.listdir(tmp_path / "ds")) == [".shardstream", "shard-000000.tar"]
    assert sorted(os.listdir(tmp_path / "ds" / ".shardstream")) == ["manifest.json", "shard-000000.tar.idx"]


# -- L6: worker counts -----------------------------------------------------------------


@pytest.mark.parametrize("workers", ["many", 1.5, 0, 2**70, True])
def test_a_bad_worker_count_is_a_usage_error(tmp_path, workers):
    (tmp_path / "c.jsonl").write_text("".join(LINES))
    with pytest.raises(UsageError, match="workers"):
        api.pack(tmp_path / "c.jsonl", tmp_path / "ds", samples_per_shard=10, workers=workers)
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize(
    ("text", "cores"),
    [("150000 100000\n", 2), ("100000 100000\n", 1), ("1000 100000\n", 1), ("max 100000\n", None)],
)
def test_a_cgroup_cpu_quota_caps_the_usable_cores(tmp_path, monkeypatch, text, cores):
    (tmp_path / "cpu.max").write_text(text)
    monkeypatch.setattr(lifeline, "_CPU_MAX", str(tmp_path / "cpu.max"))
    assert lifeline.cgroup_cpu_quota() == cores
    affinity = len(os.sched_getaffinity(0))
    assert lifeline.usable_cores() == (affinity if cores is None else min(affinity, cores))

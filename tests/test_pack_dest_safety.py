"""No pack loses data at its destination: foreign shards are refused without --overwrite
(issue 10, item 1), and one pack (or one pack per part) writes a destination at a time (item 2)."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable

import pytest

from shardstream.catalog import index_dataset, verify_dataset
from shardstream.cli import main
from shardstream.errors import PackError, UsageError
from shardstream.lock import LEASE_ENV, PackLease, host_id, lease_seconds
from shardstream.pack import ShardWriter, pack, parallel
from shardstream.storage import Storage
from tests.test_pack import read_shards
from tests.test_pack_restart import console_script, kill, snapshot, wait_for

LINES = [json.dumps({"txt": f"document {i} " * (1 + i % 13), "cls": i % 5}) + "\n" for i in range(120)]


def foreign_tars(folder, count: int = 10) -> None:
    """Tars as another tool writes them (WebDataset's ShardWriter: ``shard-%06d.tar``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        with tarfile.open(folder / f"shard-{n:06d}.tar", "w") as tar:
            for i in range(3):
                data = f"their sample {n}/{i}".encode()
                info = tarfile.TarInfo(f"{n:04d}{i:02d}.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def stored(url: str, options: dict | None = None) -> dict[str, bytes]:
    with Storage(url, options) as storage:
        return {path: storage.read(path) for path in storage.list_files()}


def claims(url: str, options: dict | None = None) -> list[str]:
    return [p for p in stored(url, options) if p.startswith(".shardstream-lock")]


# -- item 1: files this pack did not write --------------------------------------------


def test_foreign_tars_without_a_manifest_are_refused_then_replaced_with_overwrite(tmp_path, capsys):
    (tmp_path / "c.jsonl").write_text("".join(LINES))
    dest = tmp_path / "ds"
    foreign_tars(dest)
    before = snapshot(dest)
    args = ["pack", str(tmp_path / "c.jsonl"), str(dest), "--samples-per-shard", "40", "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "shard-000000.tar (and 9 more like it), which this pack did not write" in err
    assert "--overwrite" in err
    assert snapshot(dest) == before  # nothing replaced, nothing deleted
    assert main([*args, "--overwrite"]) == 0
    assert sorted(snapshot(dest)) == [
        ".shardstream/manifest.json",
        *(f".shardstream/shard-00000{i}.tar.idx" for i in range(3)),
        *(f"shard-00000{i}.tar" for i in range(3)),
    ]
    assert verify_dataset(str(dest)).ok


def test_a_shard_writer_refuses_foreign_tars_too(tmp_path):
    foreign_tars(tmp_path / "ds", 1)
    with pytest.raises(UsageError, match=r"shard-000000\.tar, which this pack did not write") as caught:
        ShardWriter(tmp_path / "ds", samples_per_shard=4)
    assert caught.value.shard == "shard-000000.tar"
    assert sorted(os.listdir(tmp_path / "ds")) == ["shard-000000.tar"]  # and no lock or record is left


def test_foreign_file_beside_a_manifest_is_neither_deleted_nor_replaced(tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(LINES))
    pack(tmp_path / "c.jsonl", tmp_path / "ds", samples_per_shard=40, workers=1)
    foreign = tmp_path / "ds" / "shard-000007.tar"
    foreign.write_bytes(b"theirs")  # beyond the 3 shards the manifest lists
    with pytest.raises(UsageError, match="the manifest there does not list it"):
        pack(tmp_path / "c.jsonl", tmp_path / "ds", samples_per_shard=40, workers=1)
    assert foreign.read_bytes() == b"theirs"
    assert verify_dataset(str(tmp_path / "ds")).ok


def test_shards_of_an_unfinished_pack_with_other_options_are_not_taken_over(tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(LINES))
    data = [{"__key__": f"k{i:03d}", "txt": f"x{i}"} for i in range(30)]

    def stopped_writer() -> None:
        with ShardWriter(tmp_path / "ds", samples_per_shard=6) as writer:
            for sample in data[:20]:
                writer.write(sample)
            raise RuntimeError("stopped")

    with pytest.raises(RuntimeError):
        stopped_writer()
    before = snapshot(tmp_path / "ds")
    with pytest.raises(UsageError, match="an unfinished pack with other options left it"):
        pack(tmp_path / "c.jsonl", tmp_path / "ds", samples_per_shard=6, workers=1)
    assert snapshot(tmp_path / "ds") == before
    with ShardWriter(tmp_path / "ds", samples_per_shard=6) as writer:  # the same pack again resumes
        for sample in data:
            writer.write(sample)
    assert sorted(os.listdir(tmp_path / "ds"))[:2] == [".shardstream", "shard-000000.tar"]  # no record left


@pytest.mark.s3
def test_foreign_tars_on_s3_are_refused(s3, tmp_path):
    base, options = s3
    foreign_tars(tmp_path / "theirs", 3)
    with Storage(f"{base}/ds", options) as storage:
        for path in sorted((tmp_path / "theirs").iterdir()):
            storage.write(path.name, path.read_bytes())
    before = stored(f"{base}/ds", options)
    (tmp_path / "c.jsonl").write_text("".join(LINES))
    with pytest.raises(UsageError, match="which this pack did not write"):
        pack(tmp_path / "c.jsonl", f"{base}/ds", samples_per_shard=40, workers=1, storage_options=options)
    assert stored(f"{base}/ds", options) == before


# -- item 2: one pack per destination -------------------------------------------------


class BlockedPack:
    """``shardstream pack`` from a FIFO, fed 65 lines then held: it holds its lease, mid-way."""

    def __init__(self, tmp_path, dest: str, *extra: str, env: dict | None = None) -> None:
        self.source = tmp_path / f"feed-{len(os.listdir(tmp_path))}.jsonl"
        os.mkfifo(self.source)
        self.command = [console_script(), "pack", str(self.source), dest, "--samples-per-shard", "10", *extra]
        self.process = subprocess.Popen(
            self.command,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.feed = open(self.source, "w")  # noqa: SIM115 (closed by finish or stop)
        self.feed.writelines(LINES[:65])
        self.feed.flush()

    def finish(self) -> str:
        self.feed.writelines(LINES[65:])
        self.feed.close()
        _, err = self.process.communicate(timeout=300)
        assert self.process.returncode == 0, err
        return err

    def stop(self) -> None:
        if self.process.poll() is None:
            kill(self.process)
        self.feed.close()
        self.process.communicate()


def six_shards_stored(exists: Callable[[str], bool]) -> bool:
    """Whether shards 0..5 and their sidecars are stored: a sidecar follows its shard, and a
    pack's workers (the core count by default) finish shards out of order."""
    return all(exists(f".shardstream/shard-00000{i}.tar.idx") for i in range(6))


def run_pack(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [console_script(), "pack", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_a_second_pack_into_a_local_destination_is_refused_while_the_first_runs(tmp_path):
    (tmp_path / "other.jsonl").write_text("".join(reversed(LINES)))
    dest = str(tmp_path / "ds")
    first = BlockedPack(tmp_path, dest, "--workers", "2")
    try:
        wait_for(
            lambda: six_shards_stored(lambda name: os.path.exists(os.path.join(dest, name))), "shards 0..5"
        )
        second = run_pack(str(tmp_path / "other.jsonl"), dest, "--samples-per-shard", "10", "--overwrite")
        assert second.returncode == 2
        assert "another pack is writing this destination: its lock .shardstream-lock." in second.stderr
        first.finish()
    finally:
        first.stop()
    assert verify_dataset(dest).ok
    texts = [sample["txt"] for sample in read_shards(tmp_path / "ds")]
    assert texts == [json.loads(line)["txt"].encode() for line in LINES]  # the first pack's dataset, whole
    assert sorted(os.listdir(dest))[:2] == [".shardstream", "shard-000000.tar"]  # no lock nor record left


@pytest.mark.slow
@pytest.mark.s3
def test_a_second_pack_into_an_s3_destination_is_refused_while_the_first_runs(s3, tmp_path):
    base, options = s3
    (tmp_path / "other.jsonl").write_text("".join(reversed(LINES)))
    url = f"{base}/ds"
    first = BlockedPack(tmp_path, url)
    try:
        with Storage(url, options) as storage:
            wait_for(lambda: six_shards_stored(storage.exists), "shards 0..5")
        second = run_pack(str(tmp_path / "other.jsonl"), url, "--samples-per-shard", "10")
        assert second.returncode == 2
        assert "its lock .shardstream-lock." in second.stderr
        first.finish()
    finally:
        first.stop()
    assert verify_dataset(url, storage_options=options).ok
    assert not [p for p in stored(url, options) if p.startswith(".") and not p.startswith(".shardstream/")]


@pytest.mark.slow
def test_parts_pack_into_one_destination_at_once(tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(LINES))
    dest = str(tmp_path / "parts")
    args = [str(tmp_path / "c.jsonl"), dest, "--samples-per-shard", "10", "--part"]
    # A part pack reads its whole source before it writes (to count it): part 0 is written
    # here instead, by a ShardWriter, which holds part 0's lease from start to close.
    with ShardWriter(dest, samples_per_shard=10, part="0/2") as writer:
        for i, line in enumerate(LINES[:60]):
            writer.write({"__key__": f"{i:09d}", **json.loads(line)})
        other = run_pack(*args, "1/2")
        assert other.returncode == 0, other.stderr
        same = run_pack(*args, "0/2")
        assert same.returncode == 2  # one pack per part
        assert "its lock .shardstream-lock-part-00000." in same.stderr
    index_dataset(dest)
    assert verify_dataset(dest).ok
    assert [s["txt"] for s in read_shards(tmp_path / "parts")] == [
        json.loads(line)["txt"].encode() for line in LINES
    ]


@pytest.mark.slow
@pytest.mark.s3
def test_a_sigkilled_pack_on_s3_does_not_block_its_rerun_which_reuses_its_shards(s3, tmp_path):
    base, options = s3
    url = f"{base}/ds"
    first = BlockedPack(tmp_path, url)
    try:
        with Storage(url, options) as storage:
            wait_for(lambda: six_shards_stored(storage.exists), "shards 0..5")
        kill(first.process)
    finally:
        first.stop()
    left = stored(url, options)
    assert len(claims(url, options)) == 1
    assert ".shardstream-pack.json" in left
    first.source.unlink()
    first.source.write_text("".join(LINES))
    rerun = run_pack(str(first.source), url, "--samples-per-shard", "10")
    assert rerun.returncode == 0, rerun.stderr
    assert "taking over" in rerun.stderr
    assert "on this machine is gone" in rerun.stderr
    after = stored(url, options)
    assert all(after[f"shard-00000{i}.tar"] == left[f"shard-00000{i}.tar"] for i in range(6))
    clean = run_pack(str(first.source), f"{base}/clean", "--samples-per-shard", "10")
    assert clean.returncode == 0, clean.stderr
    assert after == stored(f"{base}/clean", options)  # byte-identical, and no lock nor record left


@pytest.mark.slow
def test_the_lease_of_a_pack_killed_on_another_machine_runs_out(tmp_path):
    dest = tmp_path / "ds"
    first = BlockedPack(tmp_path, str(dest), env={LEASE_ENV: "1"})
    try:
        wait_for(lambda: six_shards_stored(lambda name: (dest / name).exists()), "shards 0..5")
        (name,) = claims(str(dest))
        claim = json.loads((dest / name).read_text())
        wait_for(lambda: json.loads((dest / name).read_text())["renewed"] > claim["renewed"], "a renewal")
        kill(first.process)
    finally:
        first.stop()
    claim = json.loads((dest / name).read_text())
    (dest / name).write_text(json.dumps({**claim, "host": "another-machine"}))  # its pid means nothing here
    first.source.unlink()
    first.source.write_text("".join(LINES))
    reruns = []

    def rerun_finishes() -> bool:
        reruns.append(run_pack(str(first.source), str(dest), "--samples-per-shard", "10"))
        if reruns[-1].returncode == 2:
            assert "another pack is writing this destination" in reruns[-1].stderr
        return reruns[-1].returncode == 0

    wait_for(rerun_finishes, "the lease to run out", timeout=120)
    assert "lease of 1 s ran out" in reruns[-1].stderr
    assert verify_dataset(str(dest)).ok


# -- the lease itself ------------------------------------------------------------------


def claim_doc(**fields) -> bytes:
    doc = {"run": "ab" * 8, "host": "another-machine", "pid": 1, "lease": 60.0, "renewed": time.time()}
    return json.dumps({**doc, **fields}).encode()


def test_a_live_claim_from_another_machine_refuses_and_an_expired_one_is_taken_over(tmp_path, caplog):
    (tmp_path / "c.jsonl").write_text("".join(LINES))
    dest = tmp_path / "ds"
    dest.mkdir()
    name = ".shardstream-lock." + "ab" * 8 + ".json"
    (dest / name).write_bytes(claim_doc())
    with pytest.raises(
        UsageError, match=r"its lock \.shardstream-lock\.abab.* is held \(pid 1 on another-machine"
    ):
        pack(tmp_path / "c.jsonl", dest, samples_per_shard=40, workers=1)
    assert sorted(os.listdir(dest)) == [name]  # refused before anything was written
    (dest / name).write_bytes(claim_doc(renewed=time.time() - 3600))
    with caplog.at_level(logging.WARNING, logger="shardstream.pack"):
        pack(tmp_path / "c.jsonl", dest, samples_per_shard=40, workers=1)
    assert "taking over" in caplog.text
    assert "lease of 60 s ran out" in caplog.text
    assert sorted(os.listdir(dest))[:2] == [".shardstream", "shard-000000.tar"]


def test_claims_of_other_parts_do_not_block(tmp_path):
    storage = Storage(str(tmp_path / "ds"))
    storage.write(".shardstream-lock-part-00001." + "cd" * 8 + ".json", claim_doc())
    storage.write(".shardstream-lock-part-00002." + "ef" * 8 + ".json", claim_doc())
    lease = PackLease(storage, "-part-00000")
    lease.acquire()
    try:
        lease.check()
    finally:
        lease.release()
    assert len(storage.list_files()) == 2


def test_two_packs_starting_at_the_same_moment_do_not_both_go_on(tmp_path, monkeypatch):
    storage = Storage(str(tmp_path / "ds"))
    lease = PackLease(storage)
    write = lease._write

    def and_a_rival_writes_too(into=None):
        write(into)
        storage.write(".shardstream-lock." + "12" * 8 + ".json", claim_doc(host=host_id(), pid=os.getpid()))

    monkeypatch.setattr(lease, "_write", and_a_rival_writes_too)
    with pytest.raises(UsageError, match="another pack started writing here at the same moment"):
        lease.acquire()
    assert storage.list_files() == [".shardstream-lock." + "12" * 8 + ".json"]  # this one's claim withdrawn


def test_a_writer_that_lost_its_lease_writes_no_manifest(tmp_path):
    writer = ShardWriter(tmp_path / "ds", samples_per_shard=4)
    for i in range(10):
        writer.write({"__key__": f"k{i}", "txt": "x"})
    (name,) = claims(str(tmp_path / "ds"))
    os.remove(tmp_path / "ds" / name)  # another pack took it over while this one was stopped
    (tmp_path / "ds" / (".shardstream-lock." + "34" * 8 + ".json")).write_bytes(claim_doc())
    with pytest.raises(UsageError, match="this pack lost its lock"):
        writer.close()
    assert not (tmp_path / "ds" / ".shardstream" / "manifest.json").exists()


def test_two_writers_in_one_process_exclude_each_other(tmp_path):
    with ShardWriter(tmp_path / "ds", samples_per_shard=4) as writer:
        with pytest.raises(UsageError, match="another pack is writing this destination"):
            ShardWriter(tmp_path / "ds", samples_per_shard=4)
        writer.write({"__key__": "k", "txt": "x"})
    assert verify_dataset(str(tmp_path / "ds")).ok


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan"])
def test_a_bad_lease_time_is_a_usage_error(monkeypatch, value):
    monkeypatch.setenv(LEASE_ENV, value)
    with pytest.raises(UsageError, match=LEASE_ENV):
        lease_seconds()


def test_a_pack_that_fails_releases_its_lease_and_keeps_its_record(tmp_path):
    (tmp_path / "bad.jsonl").write_text("".join(LINES[:50]) + "{not json\n")
    with pytest.raises(PackError, match="invalid JSON"):
        pack(tmp_path / "bad.jsonl", tmp_path / "ds", samples_per_shard=10, workers=1)
    assert not claims(str(tmp_path / "ds"))
    assert (tmp_path / "ds" / ".shardstream-pack.json").exists()


def test_temp_files_of_a_killed_runs_lock_and_record_are_removed(tmp_path):
    dest = tmp_path / "ds"
    dest.mkdir()
    left = [
        ".shardstream-tmp-0123456789ab-.shardstream-lock." + "56" * 8 + ".json",
        ".shardstream-tmp-ba9876543210-.shardstream-pack.json",
    ]
    other_part = ".shardstream-tmp-0123456789ab-.shardstream-lock-part-00001." + "78" * 8 + ".json"
    for name in [*left, other_part]:
        (dest / name).write_bytes(b"{")  # a SIGKILL mid-write leaves these
    (dest / ".shardstream").mkdir()
    sidecars = [
        ".shardstream-tmp-0123456789ab-shard-000003.tar.idx",
        ".shardstream-tmp-0123456789ab-other.idx",
    ]
    for name in sidecars:
        (dest / ".shardstream" / name).write_bytes(b"SS")
    with ShardWriter(dest, samples_per_shard=4) as writer:
        writer.write({"__key__": "k", "txt": "x"})
    assert sorted(os.listdir(dest)) == [".shardstream", other_part, "shard-000000.tar"]
    assert sorted(os.listdir(dest / ".shardstream")) == [sidecars[1], "manifest.json", "shard-000000.tar.idx"]


def test_the_lease_thread_does_not_stop_workers_being_forked(tmp_path, monkeypatch):
    """The lease is taken at the first cut, once the workers exist: its thread never forces spawn."""
    (tmp_path / "c.jsonl").write_text("".join(LINES))
    seen = []
    choose = parallel._mp_context

    def spy():
        seen.append([t.name for t in threading.enumerate()])
        return choose()

    monkeypatch.setattr(parallel, "_mp_context", spy)
    pack(tmp_path / "c.jsonl", tmp_path / "ds", samples_per_shard=10, workers=2)
    assert len(seen) == 1
    assert "shardstream-lease" not in seen[0]

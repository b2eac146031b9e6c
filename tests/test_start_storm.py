"""Start at scale: one manifest read per job (per node without a process group), a rank's
first sidecars read once and shared by its workers (once per node through a cache
directory), and every reader still gets its exact plan (NOTE [ One manifest read per
job ] and NOTE [ First sidecars through the parent ] in shardstream/dataset/startup.py).

S3 is moto behind a proxy that counts GETs per object. The multi-process runs launch
this file as the rank script (``python -m torch.distributed.run ... THIS URL OUT``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # run by torchrun: import the tree this file is in
    sys.path.insert(0, str(ROOT))

import shardstream  # noqa: E402
from shardstream.dataset.startup import by_source, first_window_shards  # noqa: E402
from shardstream.testing.wanproxy import ForwardingProxy, ProxyHandler  # noqa: E402

SIZES = [9, 13, 7, 11, 10, 8, 12, 10]  # 80 samples, 8 shards: no padding for 1, 2 or 4 ranks
BATCH = 2
MANIFEST = ".shardstream/manifest.json"


class CountingProxy(ForwardingProxy):
    """Forwards to S3 and counts GETs per object path (query left out)."""

    def __init__(self, upstream_endpoint: str) -> None:
        super().__init__(upstream_endpoint)
        self.gets: collections.Counter[str] = collections.Counter()
        self._counting = threading.Lock()

    def respond(self, handler: ProxyHandler, body: bytes) -> int:
        if handler.command == "GET":
            with self._counting:
                self.gets[urllib.parse.urlsplit(handler.path).path] += 1
        return super().respond(handler, body)

    def of(self, suffix: str) -> int:
        """GETs of objects whose path ends with ``suffix``."""
        return sum(n for path, n in self.gets.items() if path.endswith(suffix))

    def per_sidecar(self) -> dict[str, int]:
        return {path: n for path, n in self.gets.items() if path.endswith(".idx")}


def keys_of(samples: list[dict]) -> list[str]:
    return [sample["__key__"] for sample in samples]


def planned_keys(dataset: shardstream.StreamingDataset, rank: int) -> list[str]:
    """The keys this rank's loader must yield, in order, from the plan alone."""
    plan = dataset.make_plan(consume=False)
    return [f"s{shard:03d}-{index:04d}" for shard, index in plan.rank_samples(rank)]


# -- one process (and its DataLoader workers) ----------------------------------------------


@pytest.fixture
def counted(s3, moto_server):
    from tests.resume_harness import write_dataset

    base, options = s3
    url = f"{base}/ds"
    write_dataset(url, SIZES, storage_options=options)
    with CountingProxy(moto_server.endpoint) as proxy:
        yield url, dict(options, endpoint_url=proxy.endpoint), proxy


def test_ranks_on_one_node_share_one_manifest_read_without_a_process_group(counted, tmp_path, monkeypatch):
    url, options, proxy = counted
    node_a, node_b = tmp_path / "a", tmp_path / "b"
    node_a.mkdir()
    node_b.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(node_a))
    first = shardstream.StreamingDataset(url, num_replicas=4, rank=0, storage_options=options)
    second = shardstream.StreamingDataset(url, num_replicas=4, rank=1, storage_options=options)
    assert proxy.of(MANIFEST) == 1
    assert second.fingerprint == first.fingerprint
    monkeypatch.setattr(tempfile, "tempdir", str(node_b))  # another node
    shardstream.StreamingDataset(url, num_replicas=4, rank=2, storage_options=options)
    assert proxy.of(MANIFEST) == 2
    # a node's copy that is not the dataset it names (its fingerprint does not match) is read again
    (copy,) = (node_b / f"shardstream-start-{os.getuid()}").glob("manifest-*.json")
    record = json.loads(copy.read_text())
    record["digest"] = "0" * 32
    copy.write_text(json.dumps(record))
    third = shardstream.StreamingDataset(url, num_replicas=4, rank=3, storage_options=options)
    assert proxy.of(MANIFEST) == 3
    assert third.fingerprint == first.fingerprint


def test_one_rank_alone_keeps_no_node_copy(counted, tmp_path, monkeypatch):
    url, options, proxy = counted
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shardstream.StreamingDataset(url, storage_options=options)
    assert proxy.of(MANIFEST) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_workers_share_the_first_sidecars_and_follow_the_plan(counted, start, tmp_path, monkeypatch):
    url, options, proxy = counted
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the node's copies of the first sidecars
    dataset = shardstream.StreamingDataset(
        url, num_replicas=2, rank=1, shuffle=True, seed=3, decode=False, storage_options=options,
        share_manifest=False,
    )  # fmt: skip
    loader = shardstream.DataLoader(
        dataset, batch_size=BATCH, num_workers=2, collate_fn=keys_of, multiprocessing_context=start
    )
    expected = planned_keys(dataset, 1)
    got = [key for batch in loader for key in batch]
    assert got == expected
    assert proxy.of(MANIFEST) == 1  # the workers never read it
    assert proxy.per_sidecar(), "no sidecar was read"
    assert max(proxy.per_sidecar().values()) == 1, proxy.per_sidecar()


def test_a_mixtures_workers_share_each_streams_first_sidecars(s3, moto_server, tmp_path, monkeypatch):
    from tests.resume_harness import write_dataset

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the node's copies of the manifests

    base, options = s3
    for name in ("a", "b"):
        write_dataset(f"{base}/{name}", SIZES[:5] if name == "a" else SIZES[3:], storage_options=options)
    with CountingProxy(moto_server.endpoint) as proxy:
        proxied = dict(options, endpoint_url=proxy.endpoint)
        streams = [shardstream.Stream(f"{base}/a"), shardstream.Stream(f"{base}/b")]
        dataset = shardstream.StreamingDataset(
            streams, num_replicas=2, rank=0, shuffle=True, seed=5, decode=False, storage_options=proxied
        )
        loader = shardstream.DataLoader(
            dataset, batch_size=BATCH, num_workers=2, collate_fn=lambda b: [f"{s['__stream__']}/{s['__key__']}" for s in b]
        )  # fmt: skip
        counts = [len(source.manifest.shards) for source in dataset.sources]
        plan = dataset.make_plan(consume=False)
        expected = []
        for shard, index in plan.rank_samples(0):
            stream = 0 if shard < counts[0] else 1
            expected.append(f"{stream}/s{shard - stream * counts[0]:03d}-{index:04d}")
        firsts = {shard for worker in (0, 1) for shard in first_window_shards(plan, 0, worker)}
        assert [key for batch in loader for key in batch] == expected
    assert proxy.of(MANIFEST) == 2  # one per stream
    for stream, shards in by_source(sorted(firsts), counts).items():
        for shard in shards:  # later windows' sidecars are each worker's own to read
            assert proxy.of(f"/{'ab'[stream]}/shard-{shard:06d}.tar.idx") == 1, proxy.per_sidecar()


# -- the broadcast's rule, with torch.distributed's calls stood in for -----------------------


class FakeGroup:
    """torch.distributed as a rank other than 0 of a gloo group of 2 sees it; rank 0 sent ``sent``."""

    def __init__(self, sent):
        self.sent = sent

    def install(self, monkeypatch):
        import torch.distributed as dist

        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
        monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
        monkeypatch.setattr(dist, "broadcast_object_list", self.broadcast)

    def broadcast(self, objects, src=0, group=None):
        objects[0] = self.sent


@pytest.fixture
def two_local(tmp_path):
    from tests.resume_harness import write_dataset

    write_dataset(str(tmp_path / "one"), SIZES)
    write_dataset(str(tmp_path / "other"), SIZES[::-1])  # the same shard sizes, other contents
    return str(tmp_path / "one"), str(tmp_path / "other")


def sent_by_rank_0(url):
    from shardstream.dataset.source import DatasetSource
    from shardstream.dataset.startup import source_key

    source = DatasetSource(url, shardstream.StreamingDataset(url).config.read)
    return source_key(source), source.manifest, source.fingerprint


def test_a_rank_takes_the_broadcast_manifest_of_its_own_dataset(two_local, monkeypatch):
    one, _ = two_local
    sent = sent_by_rank_0(one)
    FakeGroup([sent]).install(monkeypatch)
    dataset = shardstream.StreamingDataset(one)
    assert dataset.manifest is sent[1]


def test_a_rank_never_takes_the_manifest_of_another_dataset(two_local, monkeypatch):
    one, other = two_local
    key, manifest, fingerprint = sent_by_rank_0(other)
    own_key = sent_by_rank_0(one)[0]
    for sent in (
        [(key, manifest, fingerprint)],  # rank 0 was given another dataset
        [
            (own_key, manifest, sent_by_rank_0(one)[2])
        ],  # this name, but not the dataset the fingerprint sent names
        None,  # rank 0's read failed: read our own (and fail with our own error, if any)
    ):
        FakeGroup(sent).install(monkeypatch)
        dataset = shardstream.StreamingDataset(one)
        assert dataset.manifest is not manifest
        assert dataset.fingerprint == sent_by_rank_0(one)[2]


# -- real ranks: torchrun ------------------------------------------------------------------


def torchrun(url: str, out: pathlib.Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        __file__, url, str(out), *args,
    ]  # fmt: skip
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )


def finished(run: subprocess.Popen[str]) -> None:
    output, _ = run.communicate(timeout=240)
    assert run.returncode == 0, f"torchrun failed:\n{output[-6000:]}"


def check_exact(out: pathlib.Path, ranks: range) -> None:
    for rank in ranks:
        record = json.loads((out / f"rank-{rank}.json").read_text())
        assert record["keys"] == record["planned"], f"rank {rank} did not get its plan"
        assert record["keys"], f"rank {rank} got nothing"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_storm_one_job_with_a_process_group(counted, tmp_path, backend):
    """``nccl``: the default group's backend is said to be NCCL (no GPU here), so the
    manifest goes over a gloo group made for it."""
    url, options, proxy = counted
    env = dict(os.environ, AWS_ENDPOINT_URL=options["endpoint_url"])
    out = tmp_path / "out"
    out.mkdir()
    finished(torchrun(url, out, env, "--group", backend, "--cache-dir", str(tmp_path / "cache")))
    check_exact(out, range(2))
    assert proxy.of(MANIFEST) == 1  # 2 ranks x 2 workers: one read for the job
    assert max(proxy.per_sidecar().values()) == 1, proxy.per_sidecar()  # one node: its cache dir


@pytest.mark.slow
def test_storm_two_nodes_without_a_process_group(s3, moto_server, tmp_path):
    from tests.resume_harness import write_dataset

    base, options = s3
    url = f"{base}/ds"
    write_dataset(url, SIZES, storage_options=options)
    with CountingProxy(moto_server.endpoint) as node_a, CountingProxy(moto_server.endpoint) as node_b:
        runs = []
        for number, proxy in enumerate((node_a, node_b)):
            node = tmp_path / f"node-{number}"
            (node / "tmp").mkdir(parents=True)
            (node / "out").mkdir()
            env = dict(os.environ, AWS_ENDPOINT_URL=proxy.endpoint, TMPDIR=str(node / "tmp"))
            node_args = ("--host", str(number), "--hosts", "2", "--cache-dir", str(node / "cache"))
            runs.append(torchrun(url, node / "out", env, *node_args))
        try:
            for run in runs:
                finished(run)
        finally:
            for run in runs:
                if run.poll() is None:
                    run.kill()
                    run.wait()
    for number, proxy in enumerate((node_a, node_b)):
        assert proxy.of(MANIFEST) == 1, f"node {number}"  # two ranks on the node, one read
        assert max(proxy.per_sidecar().values()) == 1, proxy.per_sidecar()  # its cache dir
        check_exact(tmp_path / f"node-{number}" / "out", range(2 * number, 2 * number + 2))


# -- the rank script -----------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("--group", default=None, help="the backend the default group is said to have")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--host", type=int, default=0)  # a simulated node (torchrun owns --node*)
    parser.add_argument("--hosts", type=int, default=1)
    args = parser.parse_args()
    local, per_node = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    rank, world = args.host * per_node + local, args.hosts * per_node
    if args.group:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        if args.group == "nccl":  # what an NCCL job's default group says of itself
            dist.get_backend = lambda group=None: "nccl" if group is None else "gloo"
    options = {} if args.cache_dir is None else {"cache_dir": args.cache_dir}
    dataset = shardstream.StreamingDataset(
        args.url, num_replicas=world, rank=rank, shuffle=True, seed=7, decode=False, **options
    )
    loader = shardstream.DataLoader(dataset, batch_size=BATCH, num_workers=2, collate_fn=keys_of)
    planned = planned_keys(dataset, rank)
    keys = [key for batch in loader for key in batch]
    record = {"keys": keys, "planned": planned}
    pathlib.Path(args.out, f"rank-{rank}.json").write_text(json.dumps(record))
    if args.group:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

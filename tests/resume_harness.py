"""One resume harness for the plan, the dataset and the DataLoader (and torchrun runs).

As torchdata's ``run_test_save_load_state``: a subject is opened for one rank of a
topology, yields batches (lists of sample ids), and says where it stands with
``state_dict()``. The harness stops it after ``k`` batches, opens a fresh subject with
the saved state, and requires:

- same topology: the resumed batches are exactly those the uninterrupted run yields
  after batch ``k`` (mid epoch, at the epoch's end, and into the next epoch);
- another topology (world size or workers): every sample of the epoch exactly once
  across the ranks before and after the checkpoint (a dataset that needs no padding).

An adapter is a function ``open(rank, world_size, num_workers, epoch, state) -> Subject``
where ``state`` is ``None`` for a fresh start; ``Subject`` has ``batches()``,
``state_dict()`` and ``close()``.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "Opener",
    "Subject",
    "Topo",
    "assert_exactly_once",
    "check_resume_elastic",
    "check_resume_same_topology",
    "interleave_round_robin",
    "take",
]


class Subject(Protocol):
    def batches(self) -> Iterator[list[Hashable]]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


Opener = Callable[[int, int, int, int, "dict[str, Any] | None"], Subject]


@dataclass(frozen=True)
class Topo:
    world_size: int
    num_workers: int


def take(subject: Subject, k: int | None) -> tuple[list[list[Hashable]], dict[str, Any]]:
    """The first ``k`` batches (all if ``None``) and the state right after them; the state
    goes through JSON, as a checkpoint would."""
    iterator = subject.batches()
    got = list(iterator) if k is None else list(itertools.islice(iterator, k))
    state = json.loads(json.dumps(subject.state_dict()))
    with contextlib.suppress(AttributeError):
        iterator.close()  # type: ignore[attr-defined]
    subject.close()
    return got, state


def check_resume_same_topology(
    open_subject: Opener,
    topo: Topo,
    *,
    steps: Sequence[int],
    epoch: int = 0,
    ranks: Iterable[int] | None = None,
) -> None:
    """Stop after each of ``steps`` batches and resume: the batches must equal the
    uninterrupted run's, for every rank. A step past the end checkpoints at the epoch's
    end; then the resumed run is empty and the next epoch follows unchanged."""
    for rank in range(topo.world_size) if ranks is None else ranks:
        full, _ = take(open_subject(rank, topo.world_size, topo.num_workers, epoch, None), None)
        for k in steps:
            head, state = take(open_subject(rank, topo.world_size, topo.num_workers, epoch, None), k)
            assert head == full[:k], f"rank {rank}: the first {k} batches differ from the uninterrupted run"
            assert state["epoch"] == epoch
            tail, _ = take(open_subject(rank, topo.world_size, topo.num_workers, epoch, state), None)
            assert head + tail == full, f"rank {rank}: resuming after {k} batches changed the batches"
            if k >= len(full):
                next_full, _ = take(
                    open_subject(rank, topo.world_size, topo.num_workers, epoch + 1, None), None
                )
                assert next_full != full, "another epoch came in the same order"


def check_resume_elastic(
    open_subject: Opener,
    before: Topo,
    after: Topo,
    *,
    steps: int,
    expected: Iterable[Hashable],
    epoch: int = 0,
) -> dict[str, Any]:
    """All ranks of ``before`` take ``steps`` batches in lockstep and checkpoint; the ranks
    of ``after`` resume from that state and finish the epoch. Every expected sample must
    come exactly once over both. Returns the state (the same on every rank)."""
    seen: list[Hashable] = []
    states = []
    for rank in range(before.world_size):
        head, state = take(open_subject(rank, before.world_size, before.num_workers, epoch, None), steps)
        assert len(head) == steps, f"rank {rank} ran out of batches before step {steps}"
        seen += [key for batch in head for key in batch]
        states.append(state)
    assert all(s == states[0] for s in states), "ranks disagree on the state after the same steps"
    for rank in range(after.world_size):
        tail, _ = take(open_subject(rank, after.world_size, after.num_workers, epoch, states[0]), None)
        seen += [key for batch in tail for key in batch]
    assert_exactly_once(seen, expected)
    return states[0]


def assert_exactly_once(seen: Iterable[Hashable], expected: Iterable[Hashable]) -> None:
    """Every expected id exactly once, and nothing else."""
    counts = collections.Counter(seen)
    want = set(expected)
    repeated = sorted(str(k) for k, n in counts.items() if n > 1)[:5]
    missing = sorted(str(k) for k in want - counts.keys())[:5]
    extra = sorted(str(k) for k in counts.keys() - want)[:5]
    assert not repeated, f"repeated: {repeated}"
    assert not missing, f"missing: {missing}"
    assert not extra, f"unexpected: {extra}"


def interleave_round_robin(per_worker: Sequence[Sequence[Any]], first: int = 0) -> list[Any]:
    """Batches as torch's DataLoader yields them from iterable-dataset workers: one from
    each worker in turn, starting at ``first``, skipping workers that have run out."""
    count = len(per_worker)
    order = [(first + i) % count for i in range(count)]
    out = []
    for r in range(max((len(b) for b in per_worker), default=0)):
        out += [per_worker[w][r] for w in order if r < len(per_worker[w])]
    return out


# -- adapters: the plan, the dataset and the DataLoader as harness subjects -------------------


def write_dataset(url: str, shard_sizes: Sequence[int], storage_options: dict | None = None) -> list[str]:
    """A tar dataset with shards of exactly these sample counts (written with the tar
    codec and Storage, as ShardWriter cuts shards by one size only); returns every key."""
    import hashlib
    import io

    from shardstream.formats import get_format
    from shardstream.manifest import Manifest, ShardInfo
    from shardstream.storage import Storage

    fmt, storage = get_format("tar"), Storage(url, storage_options)
    keys, shards = [], []
    for shard, count in enumerate(shard_sizes):
        path = f"shard-{shard:06d}.tar"
        buffer = io.BytesIO()
        encoder = fmt.encoder(buffer, name=path)
        for i in range(count):
            key = f"s{shard:03d}-{i:04d}"
            encoder.write({"__key__": key, "txt": f"sample {key}".encode(), "cls": str(i).encode()})
            keys.append(key)
        sidecar = encoder.close().to_bytes()
        data = buffer.getvalue()
        storage.write(path, data)
        storage.write(path + ".idx", sidecar)
        digest = hashlib.sha256(data).hexdigest()
        shards.append(ShardInfo(path, count, len(data), digest, path + ".idx", len(sidecar)))
    storage.write_manifest(Manifest(format="tar", shards=tuple(shards), fields=("cls", "txt")))
    storage.close()
    return keys


def chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """Consecutive lists of ``size`` items (the last may be shorter); takes no item more
    than the batch it yields needs."""
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class PlanSubject:
    """An ``EpochPlan`` for one rank, its batches made as torch's DataLoader makes them."""

    def __init__(self, sizes, config, rank, world, workers, epoch, state, *, batch_size):  # type: ignore[no-untyped-def]
        from shardstream.plan import EpochPlan

        topology = {"world_size": world, "num_workers": workers, "batch_size": batch_size}
        if state is None:
            self.plan = EpochPlan(sizes, config, epoch=epoch, **topology)
        else:
            self.plan = EpochPlan.resume(sizes, config, state, **topology)
        self.rank, self.steps = rank, 0

    def batches(self) -> Iterator[list[Hashable]]:
        plan = self.plan
        per_worker = [
            list(chunks(plan.worker_samples(self.rank, w), plan.batch_size)) for w in range(plan.num_workers)
        ]
        for batch in interleave_round_robin(per_worker, plan.first_worker()):
            self.steps += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return self.plan.state_dict(self.steps)

    def close(self) -> None:
        pass


class DatasetSubject:
    """A ``StreamingDataset`` iterated directly (one worker), its keys cut into batches."""

    def __init__(self, url, options, rank, world, workers, epoch, state, *, batch_size, **kwargs):  # type: ignore[no-untyped-def]
        from shardstream.dataset import StreamingDataset

        if workers > 1:
            raise ValueError("a dataset iterated directly is one worker")
        self.dataset = StreamingDataset(
            url,
            num_replicas=world,
            rank=rank,
            batch_size=batch_size,
            decode=False,
            storage_options=options,
            **kwargs,
        )
        self.dataset.set_epoch(epoch)
        if state is not None:
            self.dataset.load_state_dict(state)
        self._iterator: Any = None

    def batches(self) -> Iterator[list[Hashable]]:
        self._iterator = iter(self.dataset)
        keys = (sample["__key__"] for sample in self._iterator)
        return chunks(keys, self.dataset.batch_size())

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def close(self) -> None:
        if self._iterator is not None:
            self._iterator.close()


def collate_keys(samples: list[dict[str, Any]]) -> list[str]:
    return [sample["__key__"] for sample in samples]


class LoaderSubject:
    """A ``shardstream.DataLoader`` (with ``workers`` processes, 0 for in-process)."""

    def __init__(self, url, options, rank, world, workers, epoch, state, *, batch_size, **kwargs):  # type: ignore[no-untyped-def]
        from shardstream.dataset import DataLoader, StreamingDataset

        dataset_kwargs = {
            k: kwargs.pop(k) for k in ("shuffle", "seed", "shuffle_window", "drop_last") if k in kwargs
        }
        self.dataset = StreamingDataset(
            url, num_replicas=world, rank=rank, decode=False, storage_options=options, **dataset_kwargs
        )
        self.dataset.set_epoch(epoch)
        self.loader = DataLoader(
            self.dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate_keys, **kwargs
        )
        if state is not None:
            self.loader.load_state_dict(state)
        self._iterator: Any = None

    def batches(self) -> Iterator[list[Hashable]]:
        self._iterator = iter(self.loader)
        return self._iterator

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def close(self) -> None:
        iterator, self._iterator = self._iterator, None
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        persistent = getattr(self.loader, "_iterator", None)
        if persistent is not None:
            persistent._shutdown_workers()

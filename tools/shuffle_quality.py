"""How well do batches mix a corpus whose shards are sorted by label (the worst case)?

    python tools/shuffle_quality.py           # 400 shards x 100 samples, 8 ranks x 2 workers
    python tools/shuffle_quality.py --quick   # a small smoke run

The corpus has 10 classes; shard ``s`` holds only label ``s * 10 // shards``, so the
shards are sorted by label. For every global batch (each rank's batch at one step,
together) the script takes the total-variation distance between the batch's label
histogram and the corpus's (uniform), and prints its mean over every global batch of
a few epochs, for:

- a perfect shuffle: a uniform random permutation of the whole corpus each epoch;
- shardstream's epoch plan, for several shuffle windows (in shards' worth of samples),
  read as the DataLoader reads it (``EpochPlan.rank_samples``: per-worker batches taken
  round-robin); and the same with consecutive windows (one lane, no striping, NOTE
  [ Striped windows ]) to show what striping buys;
- the same plan with ``order="global"`` (NOTE [ Global order ]; global batch = ranks x
  rank batch, default read lanes), read the same way: its global batches are the same
  on every topology. Its mixing follows the read lanes, not the window (NOTE [ Default
  lanes ]), so one more row has 64 lanes (runs of global batch / 64 samples);
- WebDataset's buffer shuffle of the same shards: real ``webdataset.WebDataset`` over
  real tar shards written by ``webdataset.TarWriter`` (labels in ``.cls``) with
  ``shardshuffle=100`` and ``.shuffle(1000)``. Ranks and workers are simulated the way
  webdataset splits them: the pipeline of rank ``r``, worker ``w`` gets
  ``nodesplitter=islice(urls, r, None, R)`` and ``workersplitter=islice(., w, None, W)``
  (what ``split_by_node`` and ``split_by_worker`` do with torch's rank and worker), then
  shuffles its shards and a 1000-sample buffer with its own seed; each worker's samples
  are cut into batches and taken round-robin over workers, as torch's DataLoader does.
  Ranks get uneven counts under WebDataset; only the steps every rank has are counted.

Ratios are to the perfect shuffle of the same global batch size (lower is better;
1.0 is as good as a global shuffle).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from itertools import islice
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shardstream.plan import EpochPlan, PlanConfig
from shardstream.plan import epoch as plan_epoch

CLASSES = 10
TARGET = 1.5  # at a window of 4 shards


def shard_labels(num_shards: int) -> np.ndarray:
    return np.arange(num_shards) * CLASSES // num_shards


def mean_tv(batches: list[np.ndarray]) -> float:
    """Mean total-variation distance of each batch's label histogram from uniform."""
    distances = [
        0.5 * np.abs(np.bincount(b, minlength=CLASSES) / len(b) - 1 / CLASSES).sum() for b in batches
    ]
    return float(np.mean(distances))


def global_batches(per_rank: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Step t's global batch: every rank's batch t (only steps all ranks have)."""
    steps = min(len(batches) for batches in per_rank)
    return [np.concatenate([batches[t] for batches in per_rank]) for t in range(steps)]


def dataloader_batches(worker_streams: list[Iterable[int]], batch_size: int) -> list[np.ndarray]:
    """torch's DataLoader over workers: each worker's batches, taken round-robin."""
    per_worker = []
    for stream in worker_streams:
        labels = np.fromiter(stream, dtype=np.int64)
        per_worker.append([labels[i : i + batch_size] for i in range(0, len(labels), batch_size)])
    turns = max((len(b) for b in per_worker), default=0)
    return [b[t] for t in range(turns) for b in per_worker if t < len(b)]


def perfect(num_shards: int, per_shard: int, ranks: int, batch: int, epochs: int) -> float:
    labels = np.repeat(shard_labels(num_shards), per_shard)
    size = ranks * batch
    batches = []
    for epoch in range(epochs):
        order = np.random.default_rng(epoch).permutation(labels.size)
        shuffled = labels[order][: labels.size // size * size]
        batches += list(shuffled.reshape(-1, size))
    return mean_tv(batches)


@contextmanager
def consecutive_windows() -> Iterator[None]:
    """The plan with one lane: windows of consecutive positions (an ablation)."""
    original = plan_epoch.lanes_for
    plan_epoch.lanes_for = lambda window, sizes, shuffle: 1
    try:
        yield
    finally:
        plan_epoch.lanes_for = original


def shardstream_plan(
    num_shards: int,
    per_shard: int,
    ranks: int,
    workers: int,
    batch: int,
    window_shards: int,
    epochs: int,
    order: str = "local",
    lanes: int | None = None,
) -> float:
    labels = shard_labels(num_shards)
    config = PlanConfig(seed=17, shuffle_window=window_shards * per_shard)
    if order == "global":
        config = PlanConfig(
            seed=17,
            shuffle_window=window_shards * per_shard,
            order="global",
            global_batch_size=ranks * batch,
            read_lanes=lanes,
        )
    batches = []
    for epoch in range(epochs):
        plan = EpochPlan(
            [per_shard] * num_shards,
            config,
            epoch=epoch,
            world_size=ranks,
            num_workers=workers,
            batch_size=batch,
        )
        per_rank = []
        for rank in range(ranks):
            samples = np.array([shard for shard, _ in plan.rank_samples(rank)], dtype=np.int64)
            rank_labels = labels[samples]
            per_rank.append([rank_labels[i : i + batch] for i in range(0, len(rank_labels), batch)])
        batches += global_batches(per_rank)
    return mean_tv(batches)


def write_shards(folder: Path, num_shards: int, per_shard: int) -> list[str]:
    import webdataset as wds

    urls = []
    for shard, label in enumerate(shard_labels(num_shards).tolist()):
        path = folder / f"shard-{shard:05d}.tar"
        with wds.TarWriter(str(path)) as sink:
            for i in range(per_shard):
                sink.write({"__key__": f"s{shard:05d}i{i:05d}", "cls": label})
        urls.append(str(path))
    return urls


def webdataset_shuffle(urls: list[str], ranks: int, workers: int, batch: int, epochs: int) -> float:
    import webdataset as wds

    batches = []
    for epoch in range(epochs):
        per_rank = []
        for rank in range(ranks):
            streams = []
            for worker in range(workers):
                seed = (epoch * ranks + rank) * workers + worker
                dataset = wds.WebDataset(
                    urls,
                    shardshuffle=100,
                    seed=seed,
                    nodesplitter=lambda src, r=rank: islice(src, r, None, ranks),
                    workersplitter=lambda src, w=worker: islice(src, w, None, workers),
                    empty_check=False,
                )
                streams.append(int(s["cls"]) for s in dataset.shuffle(1000, seed=seed))
            per_rank.append(dataloader_batches(streams, batch))
        batches += global_batches(per_rank)
    return mean_tv(batches)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        num_shards, per_shard, ranks, workers, epochs = 40, 25, 4, 2, 1
        batch_sizes, windows = [4], [1, 4]
    else:
        num_shards, per_shard, ranks, workers, epochs = 400, 100, 8, 2, 3
        batch_sizes, windows = [4, 16, 64], [1, 2, 4, 8, 16]
    print(
        f"{num_shards} shards x {per_shard} samples sorted by label ({CLASSES} classes), "
        f"{ranks} ranks x {workers} workers, {epochs} epoch(s); mean TV distance (ratio to perfect)"
    )
    rows: dict[str, list[float]] = {}
    rows["perfect global shuffle"] = [perfect(num_shards, per_shard, ranks, b, epochs) for b in batch_sizes]
    for w in windows:
        rows[f"shardstream, window {w} shards"] = [
            shardstream_plan(num_shards, per_shard, ranks, workers, b, w, epochs) for b in batch_sizes
        ]
    for w in windows:
        rows[f"shardstream global order, window {w} shards"] = [
            shardstream_plan(num_shards, per_shard, ranks, workers, b, w, epochs, order="global")
            for b in batch_sizes
        ]
    rows["  global order, 64 lanes, window 4 shards"] = [
        shardstream_plan(num_shards, per_shard, ranks, workers, b, 4, epochs, order="global", lanes=64)
        for b in batch_sizes
    ]
    with consecutive_windows():
        for w in windows:
            rows[f"  consecutive windows, {w} shards"] = [
                shardstream_plan(num_shards, per_shard, ranks, workers, b, w, epochs) for b in batch_sizes
            ]
    folder = Path(tempfile.mkdtemp(prefix="shardstream-quality-"))
    try:
        urls = write_shards(folder, num_shards, per_shard)
        rows["webdataset shardshuffle + shuffle(1000)"] = [
            webdataset_shuffle(urls, ranks, workers, b, epochs) for b in batch_sizes
        ]
    finally:
        shutil.rmtree(folder)

    base = rows["perfect global shuffle"]
    header = "".join(f"{f'rank batch {b} (global {b * ranks})':>28}" for b in batch_sizes)
    print(f"{'':42}{header}")
    for name, values in rows.items():
        cells = "".join(f"{v:>20.4f} ({v / p:4.2f}x)" for v, p in zip(values, base, strict=True))
        print(f"{name:42}{cells}")
    # the defaults: the local order's window, and the global order's for small samples
    # and for big ones (NOTE [ Global window ])
    checked = [("window of 4 shards", "shardstream, window 4 shards")]
    checked += [
        (f"global order, window of {w} shards", f"shardstream global order, window {w} shards")
        for w in (4, 16)
    ]
    print()
    for label, row in checked:
        if row not in rows:
            continue
        ratios = [v / p for v, p in zip(rows[row], base, strict=True)]
        verdicts = ", ".join(
            f"batch {b}: {r:.2f}x {'meets' if r <= TARGET else 'misses'}"
            for b, r in zip(batch_sizes, ratios, strict=True)
        )
        print(f"{label} vs perfect (target <= {TARGET}x): {verdicts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

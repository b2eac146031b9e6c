"""What the engine tests share: rows, the same rows packed by ``shardstream pack --part``, checks."""

from __future__ import annotations

import hashlib
import json
import os

from shardstream.catalog.index import index_dataset
from shardstream.catalog.verify import verify_dataset
from shardstream.pack import pack
from shardstream.storage import Storage

ROWS = [{"__key__": f"{i:06d}", "txt": f"row {i} " + "x" * (i % 13), "cls": i} for i in range(120)]
PARTITIONS = 3
SPARK_SCHEMA = "__key__ string, txt string, cls long"


def partition(p: int, rows: list[dict] = ROWS, count: int = PARTITIONS) -> list[dict]:
    """Rows of partition ``p``: the slice ``pack --part p/count`` takes (and Spark's ``parallelize``)."""
    return rows[p * len(rows) // count : (p + 1) * len(rows) // count]


def packed_by_parts(
    folder: str, fmt: str, samples_per_shard: int, count: int = PARTITIONS, **options: object
) -> str:
    """``ROWS`` packed in ``count`` parts (``options`` as pack's), then indexed: what an engine
    must write, byte for byte."""
    source = os.path.join(folder, "rows.jsonl")
    with open(source, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in ROWS)
    dest = os.path.join(folder, f"packed-{fmt}")
    for i in range(count):
        pack(
            source,
            dest,
            format=fmt,
            samples_per_shard=samples_per_shard,
            part=f"{i}/{count}",
            workers=1,
            **options,  # type: ignore[arg-type]
        )
    index_dataset(dest)
    return dest


def files_of(url: str, storage_options: dict | None = None) -> dict[str, str]:
    """Every file under ``url``: relative path -> sha256 of its bytes."""
    with Storage(url, storage_options) as storage:
        return {p: hashlib.sha256(storage.read(p)).hexdigest() for p in storage.list_files()}


def check_exactly_once(url: str, storage_options: dict | None = None) -> None:
    """Every row once (by key, across shards), verify clean, and nothing but the dataset's files."""
    with Storage(url, storage_options) as storage:
        manifest = storage.read_manifest()
        files = set(storage.list_files())
    assert sum(s.samples for s in manifest.shards) == len(ROWS)
    report = verify_dataset(url, storage_options=storage_options)
    assert not report.problems, report
    assert not report.unlisted, report
    listed = {p for s in manifest.shards for p in (s.path, s.index)}
    extra = {f for f in files - listed if not f.startswith(".shardstream/part-")}
    assert extra == {".shardstream/manifest.json"}, f"orphans: {sorted(extra)}"
    keys = _keys(url, storage_options)
    assert sorted(keys) == sorted(row["__key__"] for row in ROWS)


def _keys(url: str, storage_options: dict | None) -> list[str]:
    from shardstream.dataset import StreamingDataset

    ds = StreamingDataset(url, shuffle=False, storage_options=storage_options, num_replicas=1, rank=0)
    return [sample["__key__"] for sample in ds]

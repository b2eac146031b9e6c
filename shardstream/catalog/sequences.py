"""``record_sequences``: a token dataset's packed sequences of one packing, counted once
and kept with the dataset, so that a plan counts them from the manifest alone.

NOTE [ Recorded sequences ]
A plan over packed sequences needs every shard's sequence count before its first
sample. concat's is the shard's tokens over S, in the manifest already; best_fit's and
pad's depend on where each document ends, in the shard's sidecar: 100,000 shards would
be 100,000 sidecar reads on every rank at every start. ``shardstream index URL --seq-len
S`` (or ``pack ... --seq-len S``) reads each sidecar once, writes best_fit's bins as a
sidecar of their own (``.shardstream/<shard>.fit<S>``: a reader takes them instead of
making them), and records the counts in the manifest under ``sequences_key``, written
last and atomically as every manifest is. Recording another packing keeps the ones there;
indexing the shards again starts the manifest afresh, without them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shardstream.errors import UsageError
from shardstream.folder import fit_sidecar_name
from shardstream.formats import get_format
from shardstream.formats.tokens import doc_ends
from shardstream.lock import PackLease
from shardstream.manifest import Manifest, ShardInfo, sequences_key
from shardstream.storage import Storage
from shardstream.tokens import Packing, best_fit, count_sequences


def record_sequences(
    url: str,
    seq_len: int,
    *,
    packing: str = "best_fit",
    long_docs: str = "split",
    storage_options: Mapping[str, Any] | None = None,
    threads: int = 8,
) -> Manifest:
    """Count the packed sequences of every shard of the token dataset at ``url`` (NOTE
    [ Recorded sequences ]), keep best_fit's bins beside the shards, and record the counts
    in its manifest; return the manifest."""
    try:
        chosen = Packing(seq_len, packing, long_docs)
    except UsageError as error:
        raise UsageError(error.message, url=url) from None
    storage = Storage(url, storage_options)
    lease = PackLease(storage)
    try:
        lease.acquire()
        manifest = storage.read_manifest()
        if manifest.format != "tokens":
            raise UsageError(
                f"--seq-len counts the packed sequences of a token dataset; this one is {manifest.format!r}",
                url=storage.url,
            )
        fmt = get_format(manifest.format)

        def one(info: ShardInfo) -> int:
            ends = doc_ends(fmt.load_index(storage.read(info.index), name=info.path))
            if chosen.mode != "best_fit":
                return count_sequences(chosen, ends)
            fit = best_fit(ends, chosen.seq_len)
            storage.write(fit_sidecar_name(info.path, chosen.seq_len), fit.to_bytes())
            return fit.count

        with ThreadPoolExecutor(max(1, threads)) as pool:
            counts = tuple(pool.map(one, manifest.shards))
        key = sequences_key(chosen.mode, chosen.seq_len, chosen.long_docs)
        recorded = dataclasses.replace(manifest, sequences={**manifest.sequences, key: counts})
        lease.check()
        storage.write_manifest(recorded)
        lease.release()
        return recorded
    finally:
        lease.release(cleanup=True)
        storage.close()

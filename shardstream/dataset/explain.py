"""Which data was at step k: the samples (for a token dataset read as sequences, the
documents and token ranges) of one global batch, from the plan alone.

A global batch of ``order="global"`` is the same on every world size (NOTE [ Global
order ]), so it is a function of the dataset (or mixture), the seed, the epoch and the
global batch size: ``explain_step`` makes that plan for one rank and lays out the batch
(O(window) from the seed), then names each sample by its shard's sidecar (keys, or
document ends). It reads manifests and sidecars, never a shard.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardstream.dataset.mixture import Stream, StreamMixture
from shardstream.dataset.sequences import SequenceReader
from shardstream.dataset.streaming import StreamingDataset
from shardstream.errors import UsageError
from shardstream.formats.tokens import doc_ends
from shardstream.plan.batches import BatchPlan

__all__ = ["Explained", "explain_step"]


@dataclass(frozen=True, slots=True)
class Explained:
    """Entry ``position`` of the global batch: sample ``index`` of shard ``shard`` (its
    path; ``stream`` its stream's number in a mixture). A sample has ``key``; a packed
    sequence has ``pieces``: ``(document key, document in its shard, first token, end
    token)``, tokens counted in the document."""

    position: int
    stream: int | None
    shard: str
    index: int
    key: str | None = None
    pieces: tuple[tuple[str, int, int, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"position": self.position, "shard": self.shard, "index": self.index}
        if self.stream is not None:
            out["stream"] = self.stream
        if self.key is not None:
            out["key"] = self.key
        if self.pieces:
            out["documents"] = [
                {"key": key, "document": doc, "tokens": [lo, hi]} for key, doc, lo, hi in self.pieces
            ]
        return out


def explain_step(
    url: str | os.PathLike[str] | Sequence[Stream | str],
    *,
    step: int,
    global_batch_size: int,
    epoch: int = 0,
    **options: Any,
) -> list[Explained]:
    """The samples of global batch ``step`` of ``epoch`` for ``StreamingDataset(url,
    order="global", global_batch_size=..., **options)`` (``seed``, ``shuffle``,
    ``read_lanes``, ``seq_len``, ``packing``, ``mix``, ... as a training run gives them)."""
    dataset = StreamingDataset(
        url, order="global", global_batch_size=global_batch_size, num_replicas=1, rank=0, **options
    )
    dataset.set_epoch(epoch)
    plan = dataset.make_plan(num_workers=1, consume=False)
    if not isinstance(plan, BatchPlan):
        raise UsageError("a step names a global batch: explain needs order='global'", url=dataset.url)
    samples = plan.global_batch(step)
    reader = dataset.open_reader()
    try:
        name = _Namer(reader, dataset)
        return [name(position, shard, index) for position, (shard, index) in enumerate(samples)]
    finally:
        reader.close()


class _Namer:
    """Names samples of a dataset's shards (mixture shards numbered across its streams) by
    their sidecars, each sidecar's keys and document ends read once."""

    def __init__(self, reader: Any, dataset: StreamingDataset) -> None:
        self.reader = reader
        self.mixed = isinstance(dataset.kind, StreamMixture)  # then a sample names its stream
        self.manifests = [source.manifest for source in dataset.sources]
        self.paths = [(number, info.path) for number, m in enumerate(self.manifests) for info in m.shards]
        self._keys: dict[int, list[str]] = {}

    def keys(self, shard: int) -> list[str]:
        if shard not in self._keys:
            index = self.reader.reader.index(shard) if self.sequences else self.reader.index(shard)
            self._keys[shard] = index.keys
        return self._keys[shard]

    @property
    def sequences(self) -> bool:
        return isinstance(self.reader, SequenceReader)

    def __call__(self, position: int, shard: int, index: int) -> Explained:
        stream, path = self.paths[shard]
        mixed = stream if self.mixed else None
        if not self.sequences:
            return Explained(position, mixed, path, index, key=self.keys(shard)[index])
        pieces = self.reader.layout(shard).run(index, index + 1).pieces
        ends = doc_ends(self.reader.reader.index(shard))
        starts = np.where(pieces.doc > 0, ends[np.maximum(pieces.doc - 1, 0)], 0)
        keys = self.keys(shard)
        named = tuple(
            (keys[doc], doc, lo, hi)
            for doc, lo, hi in zip(
                pieces.doc.tolist(), (pieces.lo - starts).tolist(), (pieces.hi - starts).tolist(), strict=True
            )
        )
        return Explained(position, mixed, path, index, pieces=named)

"""Every sample has every field of its dataset: None where it has no value.

# NOTE [ Missing fields ]
# A sample without a field the dataset has (a JSON Lines row without ``cls``, a tar
# sample without a ``.cls`` member) would stream as ``'cls': None`` from Parquet, whose
# rows have every column, and with no ``cls`` at all from tar, whose samples have the
# members they have, or from a Parquet shard without the column at all. One behaviour for both, and for every shard: a sample holds every field of
# the manifest (the union over its shards), None where it has no value, as a Parquet
# row and a Hugging Face dataset give it. Not the other way (leave the field out):
# Parquet cannot tell a null from a missing value, and columns of one set of fields
# decode and batch a column at a time (NOTE [ Bulk decode ] in bulk.py). Decoders
# leave None as it is, and ``collate`` sees the same keys in every sample of a stream.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardstream.formats.base import Sample, SampleColumns
from shardstream.formats.samples import TYPED_COLUMN

__all__ = ["with_all_fields", "with_all_fields_one"]


def with_all_fields(
    part: SampleColumns | list[Sample | None], fields: Sequence[str]
) -> SampleColumns | list[Sample | None]:
    """``part`` with every one of ``fields`` in each sample, None where it was missing."""
    if isinstance(part, SampleColumns):
        missing = [f for f in fields if f not in part.fields]
        if not missing:
            return part
        rows = len(part.keys)
        kinds = part.kinds and part.kinds + (TYPED_COLUMN,) * len(missing)  # None is no bytes
        return SampleColumns(
            part.fields + tuple(missing), part.keys, [*part.values, *([None] * rows for _ in missing)], kinds
        )
    for sample in part:
        if sample is not None:
            with_all_fields_one(sample, fields)
    return part


def with_all_fields_one(sample: Sample, fields: Sequence[str]) -> Sample:
    """``sample`` (changed in place) with every one of ``fields``, None where it was missing."""
    if len(sample) <= len(fields):  # it holds ``__key__`` and at most all fields: one may be missing
        for field in fields:
            if field not in sample:
                sample[field] = None
    return sample

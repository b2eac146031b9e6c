"""``shardstream.pack(source, dest, ...)``: a source folder or file in, a dataset out."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from functools import partial
from typing import Any

from shardstream.counts import parse_count
from shardstream.errors import PackError, UsageError
from shardstream.formats import get_format
from shardstream.manifest import Manifest
from shardstream.pack.dest import DatasetTarget
from shardstream.pack.durable import ShardSync
from shardstream.pack.jobs import JobContext, Packed, PackProgress, ShardJob, ShardJobs
from shardstream.pack.lifeline import usable_cores
from shardstream.pack.options import PackOptions, Part
from shardstream.pack.parallel import run_jobs
from shardstream.pack.sources import Source, open_source
from shardstream.pack.sources.base import Entry, input_storage
from shardstream.pack.tokenize import load_tokenizing
from shardstream.storage import Storage

_log = logging.getLogger("shardstream.pack")


def pack(
    source: str | os.PathLike[str] | Source,
    dest: str | os.PathLike[str],
    *,
    format: str | None = None,
    shard_size: int | str | None = None,
    samples_per_shard: int | None = None,
    workers: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    compression: str | None = None,
    source_type: str | None = None,
    source_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    part: str | tuple[int, int] | Part | None = None,
    progress: PackProgress | None = None,
    tokenizer: str | os.PathLike[str] | None = None,
    text_field: str | None = None,
    append_eos: bool | None = None,
) -> Manifest:
    """Pack ``source`` into shards at ``dest`` and return the manifest.

    ``source`` is a folder of files grouped by key, a JSON Lines or CSV file, Parquet
    files or tar shards (``source_type`` names one; by default it is detected).
    ``shard_size`` (bytes or ``"256MB"``) and/or ``samples_per_shard`` cut shards;
    with neither, shards are of 256MB. ``workers`` processes write shards (default:
    the core count; for a folder this process is one of them, and all of them list and
    size its files too, see NOTE [ Every process sizes and writes ]); the result is
    byte-identical for any number. ``storage_options``
    go to fsspec for ``dest`` (and for a remote source, unless ``source_options``).
    With ``part="I/N"`` only the I-th of N slices is packed, into shards named for the
    part and a part record instead of the manifest (``shardstream index`` joins parts).

    With ``tokenizer`` (a ``tokenizer.json``, or a name that ``tokenizers`` or
    ``transformers`` loads) each sample's ``text_field`` (default: ``text``, or a
    folder's ``.txt`` files) is tokenized into a document of token ids, an EOS appended
    where ``append_eos`` (default: when the tokenizer has one): ``format="tokens"`` (the
    default with a tokenizer; else ``"tar"``) writes flat token arrays,
    ``format="parquet"`` an ``input_ids`` column (NOTE [ Tokenizing in the pack's workers ]).

    Workers are forked when this process runs no other thread (fsspec's aside), and
    spawned otherwise; a script that packs with spawned workers needs the usual
    ``if __name__ == "__main__":`` guard. A ``memory://`` destination is written by
    this process alone. Local shards are made durable (fsync) before the manifest is
    written (NOTE [ Durable before the manifest ]).

    One pack writes ``dest`` at a time (one per part with ``part``): another one there
    raises ``UsageError`` naming its lock (NOTE [ One pack per destination ]). Without
    ``overwrite``, files with shard names that neither the manifest there nor an
    unfinished run of this same pack explains are refused, never replaced (NOTE
    [ Packs in progress ]).
    """
    if format is None:  # tar, or the token format where there are tokens to write
        format = "tokens" if tokenizer is not None else "tar"
    options = PackOptions.create(
        format=format,
        shard_size=shard_size,
        samples_per_shard=samples_per_shard,
        compression=compression,
        part=part,
        overwrite=overwrite,
        tokenizing=None
        if tokenizer is None
        else load_tokenizing(tokenizer, text_field=text_field, append_eos=append_eos),
    )
    if tokenizer is None and (text_field is not None or append_eos is not None):
        raise UsageError("text_field and append_eos say how to tokenize: pass a tokenizer too")
    if workers is not None:
        workers = parse_count(workers, "workers")
    src = (
        source if isinstance(source, Source) else _open(source, source_type, storage_options, source_options)
    )
    with contextlib.ExitStack() as cleanup:
        storage = Storage(os.fspath(dest), storage_options)
        cleanup.callback(storage.close)
        sync = ShardSync(storage)
        cleanup.callback(sync.close)
        target = DatasetTarget(storage, options, origin=src.url)
        # the lease, if finish did not release it (NOTE [ One pack per destination ])
        cleanup.callback(target.close, cleanup=True)
        manifest = _run(src, options, storage, sync, target, workers, progress)
    return manifest


def _run(
    src: Source,
    options: PackOptions,
    storage: Storage,
    sync: ShardSync,
    target: DatasetTarget,
    workers: int | None,
    progress: PackProgress | None,
) -> Manifest:
    """Cut and write the shards, then the manifest (``pack`` owns and closes what is passed)."""
    start, stop, total = _slice(src, options.part, want_total=_shows(progress))
    if progress is not None:
        progress.set_total(total)
    jobs = ShardJobs(src, options, partial(_job, options, target), start, stop)
    context = JobContext(storage, src, options)
    if storage.url.startswith("memory://"):
        workers = 1  # a memory:// file system lives in one process: other processes cannot write it
    results = run_jobs(jobs, context, workers or usable_cores(), sync, progress)
    if not results and options.part is None:
        raise PackError("the source holds no samples", url=src.url)
    reused = getattr(progress, "reused", None)  # an optional member of PackProgress
    if reused is not None:
        reused(sum(result.reused for result in results), len(results))
    target.prepare_once()
    manifest = target.finish(results, sync)
    advise_format(manifest)
    return manifest


# NOTE [ Small samples in tar ]
# Every tar member carries a 512-byte header and is padded to 512 bytes, so a ~250-byte
# field costs ~1 KiB on disk and on the wire; a Parquet row group stores the same
# columns back to back (and compressed). Where a tar dataset's members average under
# ``SMALL_MEMBERS`` x 512 bytes on disk, more than half of what a reader downloads is headers and
# padding: pack says so and names Parquet, which streams the same samples in fewer bytes
# (tools/bench_wan.py measures both formats over a slow link).
SMALL_MEMBERS = 3  # members under this many times their format's overhead, on average


def advise_format(manifest: Manifest) -> str | None:
    """The advice logged (and returned) when a tar dataset's members are small; else None."""
    overhead = get_format(manifest.format).member_overhead
    members = sum(shard.samples for shard in manifest.shards) * max(1, len(manifest.fields))
    if not overhead or not members:
        return None
    average = sum(shard.bytes for shard in manifest.shards) / members
    if average >= SMALL_MEMBERS * overhead:
        return None
    advice = (
        f"pack: tar members average {average:.0f} bytes on disk, most of it their 512-byte headers "
        "and padding; --format parquet stores and streams these samples in fewer bytes"
    )
    _log.warning("%s", advice)
    return advice


def _open(
    source: str | os.PathLike[str],
    source_type: str | None,
    storage_options: Mapping[str, Any] | None,
    source_options: Mapping[str, Any] | None,
) -> Source:
    url = os.fspath(source)
    if source_options is None and input_storage(url, {}).local_root is None:  # a remote source
        source_options = storage_options
    return open_source(url, source_type=source_type, storage_options=source_options)


def _shows(progress: PackProgress | None) -> bool:
    return progress is not None and bool(getattr(progress, "enabled", True))


def _slice(source: Source, part: Part | None, *, want_total: bool) -> tuple[int, int | None, int | None]:
    """(start, stop, sample count if known) of the samples to pack."""
    if part is None:
        return 0, None, source.estimate() if want_total else None
    total = source.count()
    if total == 0:
        raise PackError("the source holds no samples", url=source.url)
    start, stop = part.slice(total)
    return start, stop, stop - start


def _job(
    options: PackOptions, target: DatasetTarget, number: int, parts: tuple[list[Entry] | Packed, ...]
) -> ShardJob:
    # The destination is touched (an old manifest deleted with overwrite) only once the
    # first shard is cut: an empty or unreadable source changes nothing.
    target.prepare_once()
    name = options.shard_name(number)
    return ShardJob(number, name, parts, target.expected(name))

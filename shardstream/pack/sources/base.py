"""What every pack source is: a class that lists samples in a fixed order.

A source turns some input (a folder of files, a JSON Lines file, ...) into a sequence
of :class:`Entry` in a deterministic order. An entry carries its sample itself
(``inline`` sources: the sample was parsed anyway), or only what a worker process needs
to load it later (``lazy`` sources: the folder source cuts shards from file sizes and
lets workers read the files). Either way the parent process knows every sample's size
in the shard before any shard is written; see NOTE [ Deterministic parallel pack ] in
``shardstream.pack.parallel``. A lazy source is listed in chunks that any process
expands into entries (NOTE [ Every process sizes and writes ] there).

Sources read their input through a read-only ``Storage`` (``input_storage``), so the
retries and timeouts of NOTE [ One retry layer ] (storage/retry.py) apply to a pack's
input as to everything else it reads.
"""

from __future__ import annotations

import io
import json
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from itertools import islice
from typing import IO, Any, ClassVar, NamedTuple

from shardstream.errors import PackError, StorageError, UsageError
from shardstream.formats.base import Sample, ShardFormat
from shardstream.storage import Storage
from shardstream.storage.retry import is_not_found

_BATCH = 2048  # entries of a chunk of a lazy source that only defines scan (the default chunks)

# What fsspec decompresses on the fly (``compression="infer"``).
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".lz4")


class Entry(NamedTuple):
    """One sample of a source, in source order."""

    key: str
    sample: Sample | None  # the sample (inline sources), or None: ``Source.load`` reads it
    where: Any  # what ``load`` needs (lazy sources); None for inline ones
    url: str  # the file it comes from, for errors
    line: int | None = None  # its line in that file (JSON Lines, CSV), for errors


class Source(ABC):
    """A registered kind of input to ``shardstream pack``.

    Subclasses set ``name`` and implement ``detect`` and ``scan``; lazy ones also
    ``chunks``, ``expand``, ``size`` and ``load``. A source pickles as its
    configuration: worker processes rebuild their own file handles.
    """

    name: ClassVar[str]
    lazy: ClassVar[bool] = False
    # A fallback source (the folder of files) is tried only when no other one claims a URL.
    fallback: ClassVar[bool] = False

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    @classmethod
    @abstractmethod
    def detect(cls, url: str, storage_options: Mapping[str, Any], is_dir: bool) -> bool:
        """Whether this source reads ``url`` (called by auto-detection)."""

    @abstractmethod
    def scan(self, start: int = 0, stop: int | None = None) -> Iterator[Entry]:
        """Entries ``[start, stop)`` in source order; ``PackError`` names file and line."""

    def chunks(self) -> Iterator[tuple[Any, ...]]:
        """A lazy source in order, as picklable chunks (tuples) for ``expand``; cheap to list.

        By default the entries of ``scan`` in batches: listed in one process, sized in any.
        """
        scan = self.scan()
        while batch := tuple(islice(scan, _BATCH)):
            yield ("entries", batch)

    def expand(self, chunk: tuple[Any, ...]) -> list[list[Entry] | tuple[Any, ...]]:
        """What ``chunk`` holds, in order: lists of entries, and chunks found in it (a
        folder's subfolders) that are expanded in turn, in place. Runs in any process.

        By default the entries of a batch from the default ``chunks``.
        """
        return [list(chunk[1])]

    def count(self) -> int:
        """The exact number of samples (``--part`` needs it); may read the whole source."""
        return sum(1 for _ in self.scan())

    def estimate(self) -> int | None:
        """The number of samples if it is cheap to know (for the progress bar), else None."""
        return None

    def size(self, entry: Entry, fmt: ShardFormat) -> int:
        """Bytes ``entry`` adds to a shard of ``fmt``, known before the sample is loaded."""
        if entry.sample is None:
            raise PackError(f"source {self.name!r} gave no sample for {entry.key!r}", url=entry.url)
        return fmt.sample_size(entry.sample)

    def entry_url(self, entry: Entry, field: str | None = None) -> str:
        """Where an error about ``entry`` (about its ``field``, if one is named) points: its
        file (a folder source: the field's file, else the sample's first)."""
        return entry.url

    def load(self, entry: Entry) -> Sample:
        """The sample of ``entry`` (in a worker process, for lazy sources)."""
        if entry.sample is None:
            raise PackError(f"source {self.name!r} gave no sample for {entry.key!r}", url=entry.url)
        return entry.sample


def walk(source: Source) -> Iterator[Entry]:
    """Every entry of a lazy source, in order: its chunks expanded here, one after another."""
    stack: list[Iterator[list[Entry] | tuple[Any, ...]]] = [iter(source.chunks())]
    while stack:
        part = next(stack[-1], None)
        if part is None:
            stack.pop()
        elif isinstance(part, list):
            yield from part
        else:
            stack.append(iter(source.expand(part)))


def has_suffix(url: str, suffixes: tuple[str, ...], *, compressed: bool = True) -> bool:
    """Whether ``url`` ends with one of ``suffixes``, optionally followed by a compression suffix."""
    name = url.rstrip("/").rsplit("/", 1)[-1].lower()
    if compressed:
        for compression in COMPRESSION_SUFFIXES:
            if name.endswith(compression):
                name = name[: -len(compression)]
                break
    return name.endswith(suffixes)


def input_storage(url: str, storage_options: Mapping[str, Any]) -> Storage:
    """A read-only Storage of the source file or folder ``url`` (``""`` names it itself)."""
    return Storage(url, storage_options, read_only=True)


def list_inputs(url: str, storage_options: Mapping[str, Any]) -> Iterator[tuple[str, str, int]]:
    """(path relative to the folder ``url``, full path or URL, size) of every file in it.

    Recursive, in no particular order; files and folders whose name starts with a dot
    are skipped. Symbolic links to files are followed, to folders not.
    """
    storage = input_storage(url, storage_options)
    root = storage.local_root
    if root is not None:  # walked here: FIFOs and the like are refused, never opened
        yield from _walk_local(root, "")
        return
    try:
        found = storage.list_sizes()
    except StorageError as error:
        raise PackError(f"cannot list source folder: {error.message}", url=url) from None
    for rel, size in found:
        if not any(part.startswith(".") for part in rel.split("/")):
            yield rel, storage.full_url(rel), size


def _walk_local(directory: str, prefix: str) -> Iterator[tuple[str, str, int]]:
    try:
        with os.scandir(directory) as it:
            found = list(it)
    except OSError as error:
        raise PackError(f"cannot list folder: {error.strerror}", url=directory) from None
    for item in found:
        if item.name.startswith("."):
            continue
        try:
            if item.is_dir(follow_symlinks=False):
                yield from _walk_local(item.path, f"{prefix}{item.name}/")
            elif item.is_file():
                yield f"{prefix}{item.name}", item.path, item.stat().st_size
            else:  # a FIFO, socket, device or broken link: refused, never skipped (nor opened)
                broken = item.is_symlink() and not os.path.exists(item.path)
                what = "broken symbolic link" if broken else "not a regular file"
                raise PackError(f"cannot read file: {what}", url=item.path)
        except OSError as error:
            raise PackError(f"cannot read file: {error.strerror}", url=item.path) from None


def source_files(url: str, storage_options: Mapping[str, Any], suffixes: tuple[str, ...]) -> list[str]:
    """``url`` itself, or the files with one of ``suffixes`` in the folder ``url``, sorted.

    Names starting with ``_`` (Spark's ``_SUCCESS``) are skipped in a folder; any other
    file is an error, so a typo never silently drops data.
    """
    if not is_dir(url, storage_options):
        return [url]
    found = []
    for rel, path, _ in list_inputs(url, storage_options):
        if rel.rsplit("/", 1)[-1].startswith("_"):
            continue
        if not has_suffix(rel, suffixes):
            raise PackError(f"unexpected file in a folder of {'/'.join(suffixes)} files", url=path)
        found.append((rel, path))
    if not found:
        raise PackError("source folder holds no files", url=url)
    return [path for _, path in sorted(found)]


def folder_of(url: str, storage_options: Mapping[str, Any], suffixes: tuple[str, ...]) -> bool:
    """Whether the folder ``url`` holds files, all with one of ``suffixes`` (markers aside)."""
    try:
        return bool(source_files(url, storage_options, suffixes))
    except PackError:
        return False


def is_dir(url: str, storage_options: Mapping[str, Any]) -> bool:
    """Whether ``url`` is a folder; ``UsageError`` if it does not exist."""
    try:
        return input_storage(url, storage_options).is_folder()
    except StorageError as error:
        if is_not_found(error):
            raise UsageError("source not found", url=url) from None
        raise PackError(f"cannot reach source: {error.message}", url=url) from None


def open_input(url: str, storage_options: Mapping[str, Any], mode: str = "rb") -> IO[Any]:
    """``url`` opened for reading (any fsspec URL; ``.gz``, ``.zst``, ... decompressed).

    A local path is opened directly, so pipes work too (``<(zcat corpus.jsonl.gz)``);
    anything else is read through the source's Storage (ranged reads, retried).
    """
    from fsspec.compression import compr
    from fsspec.utils import infer_compression

    try:
        storage = input_storage(url, storage_options)
        root = storage.local_root
        raw: IO[Any] = open(root, "rb") if root is not None else storage.open("")  # noqa: SIM115 (returned)
        compression = infer_compression(url)
        f = raw if compression is None else compr[compression](raw, mode="rb")
        return f if "b" in mode else io.TextIOWrapper(f)
    except FileNotFoundError:
        raise PackError("source file not found", url=url) from None
    except StorageError as error:
        if is_not_found(error):
            raise PackError("source file not found", url=url) from None
        raise PackError(f"cannot open source file: {error.message}", url=url) from None
    except (OSError, ValueError) as error:
        raise PackError(f"cannot open source file: {error}", url=url) from None


def sample_key(number: int) -> str:
    """The key of sample ``number`` (from 0) of a source whose samples have no names."""
    return f"{number:09d}"


def tar_ready(sample: Sample, entry_url: str, line: int | None) -> Sample:
    """``sample`` with values a tar member can hold: bytes, str (UTF-8) or int (decimal).

    JSON Lines, CSV and Parquet give other Python values: a float or bool becomes its
    JSON text, a list or dict its JSON document, and a None (a missing value) leaves
    the field out of that sample, as a missing file would.
    """
    for value in sample.values():
        if type(value) not in (bytes, str, int):
            break
    else:
        return sample
    ready: Sample = {}
    for field, value in sample.items():
        if value is None:
            continue
        if isinstance(value, (bytes, bytearray, memoryview, str)) or (
            isinstance(value, int) and not isinstance(value, bool)
        ):
            ready[field] = value
        elif isinstance(value, float) and not math.isfinite(value):
            raise PackError(f"field {field!r} is {value}, which JSON cannot hold", url=entry_url, line=line)
        else:
            try:
                ready[field] = json.dumps(
                    value, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str
                )
            except (TypeError, ValueError) as error:
                raise PackError(
                    f"field {field!r} cannot be stored in a tar shard: {error}", url=entry_url, line=line
                ) from None
    return ready

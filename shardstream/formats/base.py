"""The contract every shard format keeps (no fsspec, no torch here).

A *sample* is a dict: ``"__key__"`` (str) and one entry per field, raw ``bytes`` for tar
members (field name = extension, e.g. ``"txt"``, ``"cls"``, ``"jpg"``) or Python values
for Parquet columns (bytes for those made from bytes: NOTE [ Typed columns ]). Decoding
by extension happens later, in the dataset.

Every shard has a *sample index*, stored as a sidecar file (``.shardstream/<shard
path>.idx``, see ``shardstream.folder``), so a reader loads only the indexes of the
shards it reads. From the index a reader gets the byte range that holds any run of
consecutive samples, fetches that range with one ranged GET, and decodes just those
samples from the bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, ClassVar, cast

import numpy as np

from shardstream.errors import UsageError
from shardstream.formats.checks import ShardChecks
from shardstream.formats.samples import Sample as Sample
from shardstream.formats.samples import SampleColumns as SampleColumns
from shardstream.formats.samples import check_covers as check_covers
from shardstream.formats.samples import check_covers_all as check_covers_all
from shardstream.formats.samples import run_positions as run_positions
from shardstream.formats.samples import sample_builder as sample_builder
from shardstream.types import ByteRange


class SingleSamples(ABC):
    """One sample at a time, cut from exactly its own bytes: what ``MapDataset[i]`` reads
    (NOTE [ Checked single reads ] in shardstream/dataset/sample_reads.py). An index gives
    one (:meth:`SampleIndex.singles`) when each of its samples is a byte range whose values
    are slices of it, and every sample has the same ``fields``."""

    __slots__ = ()
    fields: tuple[str, ...]  # in the order ``values`` gives them

    @abstractmethod
    def span(self, position: int) -> tuple[int, int]:
        """``(start, end)`` of sample ``position``'s bytes: ``byte_range(position, position + 1)``."""

    @abstractmethod
    def key(self, position: int) -> str:
        """The ``__key__`` of sample ``position``."""

    @abstractmethod
    def values(self, data: bytes, base: int, position: int) -> list[bytes]:
        """The values of sample ``position`` in ``fields`` order, cut from ``data`` (the
        shard's bytes from offset ``base``, holding the sample's ``span``)."""


class SampleIndex(ABC):
    """Where each sample of one shard lies, and (sidecar version 2) the shard's checks:
    its size, sha256 and block CRCs (NOTE [ Checksummed reads ] in ``checks``)."""

    _checks: ShardChecks | None = None

    @property
    def checks(self) -> ShardChecks | None:
        """The shard's size, sha256 and block CRCs; ``None`` for an index built from an
        encoder alone or loaded from a version 1 sidecar."""
        return self._checks

    def bind_checks(self, checks: ShardChecks) -> None:
        """Tie this index to its shard's bytes; done once, by whoever hashed the shard,
        before the sidecar is written."""
        if self._checks is not None and self._checks != checks:
            raise UsageError("the sample index is already tied to other shard bytes", shard=self.name)
        self._checks = checks

    def read_range(self, start: int, stop: int) -> ByteRange:
        """What to read to decode samples ``[start, stop)`` with their checks: their byte
        range grown to whole check blocks (the byte range itself without checks)."""
        rng = self.byte_range(start, stop)
        return rng if self._checks is None else self._checks.widen(rng)

    def byte_ranges(self, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``byte_range`` of every run ``[starts[i], stops[i])``, as start and end arrays
        (int64), with the same errors; a format overrides it with array arithmetic."""
        spans = [self.byte_range(a, b) for a, b in zip(starts.tolist(), stops.tolist(), strict=True)]
        return (
            np.fromiter((rng.start for rng in spans), dtype=np.int64, count=len(spans)),
            np.fromiter((rng.end for rng in spans), dtype=np.int64, count=len(spans)),
        )

    def read_ranges(self, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``read_range`` of every run ``[starts[i], stops[i])``, as ``byte_ranges`` gives them."""
        lo, hi = self.byte_ranges(starts, stops)
        return (lo, hi) if self._checks is None else self._checks.widen_all(lo, hi)

    def singles(self) -> SingleSamples | None:
        """A cutter of single samples, where the format has one for this shard (else ``None``:
        a single sample is decoded as a run of one)."""
        return None

    @property
    @abstractmethod
    def num_samples(self) -> int: ...

    @property
    @abstractmethod
    def keys(self) -> list[str]:
        """The ``__key__`` of every sample, in shard order."""

    @abstractmethod
    def byte_range(self, start: int, stop: int) -> ByteRange:
        """The smallest byte range of the shard holding samples ``[start, stop)``."""

    @abstractmethod
    def to_bytes(self, *, with_checks: bool = True) -> bytes:
        """The sidecar's content; ``ShardFormat.load_index`` reads it back. Without
        ``with_checks``, the index alone (what a version 1 sidecar held)."""

    @property
    @abstractmethod
    def name(self) -> str:
        """The shard's name, for errors."""

    @property
    def fields(self) -> tuple[str, ...]:
        """The field names of the shard's samples, for the manifest (none known: empty)."""
        return ()

    @property
    def schema(self) -> dict[str, str]:
        """Field name -> type name, for formats with typed fields (Parquet); else empty."""
        return {}

    # A token shard's id count (the manifest's per-shard ``tokens``) and numpy id type name.
    num_tokens = property(lambda self: None, doc="Token ids in a token shard; None for others.")
    token_dtype = property(lambda self: None, doc="A token shard's id type (``'uint16'``); None for others.")

    @classmethod
    @abstractmethod
    def from_bytes(cls, data: bytes | memoryview, *, name: str) -> SampleIndex:
        """The index whose ``to_bytes`` is ``data``; ``FormatError`` naming ``name`` if it is not one."""

    # Two indexes are equal when their sidecars are; an index pickles as its sidecar.
    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.to_bytes() == cast(SampleIndex, other).to_bytes()

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_load_index, (type(self), self.to_bytes(), self.name))


def _load_index(cls: type[SampleIndex], data: bytes, name: str) -> SampleIndex:
    return cls.from_bytes(data, name=name)


class ShardEncoder(ABC):
    """Writes samples, in order, into one shard on a binary file object."""

    @abstractmethod
    def write(self, sample: Sample) -> None: ...

    @property
    @abstractmethod
    def num_samples(self) -> int: ...

    @property
    @abstractmethod
    def num_bytes(self) -> int:
        """Bytes written so far (for tar, exact; for Parquet, an estimate until close)."""

    @abstractmethod
    def close(self) -> SampleIndex:
        """Finish the shard (tar end blocks, Parquet footer); the file object stays open."""


FileSizer = Callable[[str, tuple[str, ...], Sequence[int]], int]


class ShardFormat(ABC):
    """A codec for one shard format. Instances are stateless and picklable.

    Everything the rest of shardstream asks of a format is here, so that code outside
    ``shardstream.formats`` never tests a format's name, and a format registered with
    ``register_format`` packs, streams, indexes and verifies like the built-in ones.
    """

    name: ClassVar[str]  # the registry key and the manifest's "format": "tar", "parquet"
    suffix: ClassVar[str]  # of every shard file: ".tar", ".parquet"
    # ``build_index`` reads the shard once from its start to its end and never seeks, so
    # whoever indexes it can hash the same bytes as they stream by (tar); a format that
    # reads its footer first (Parquet) is hashed in a second pass.
    sequential_index: ClassVar[bool] = False
    # A sample's values are stored as bytes (tar members): a pack turns the Python values
    # of JSON Lines, CSV or Parquet sources into text first (``tar_ready``).
    stores_bytes: ClassVar[bool] = False
    # Bytes a stored field costs beyond its value, about (tar: a 512-byte header, and
    # padding to 512 bytes): pack advises another format when samples are this small
    # (NOTE [ Small samples in tar ] in shardstream/pack/api.py).
    member_overhead: ClassVar[int] = 0
    # Suffixes of other tools' files that ``index`` takes as shards (Megatron's ``.bin``);
    # the field a pack with a tokenizer writes ids to (None: the format holds no ids), as
    # a numpy array or (``token_lists``) a list of ints.
    foreign_suffixes: ClassVar[tuple[str, ...]] = ()
    token_field: ClassVar[str | None] = None
    token_lists: ClassVar[bool] = False

    def file_sizer(self) -> FileSizer:
        """``size(key, fields, sizes)``: the bytes a sample of files not read yet adds to a
        shard, from its key, field names and file sizes (the pack cuts a folder's shards
        before reading it). A new sizer per call: it may cache what it learns.

        This default sizes the sample with empty values, plus the data.
        """
        exact = self.sample_size

        def size(key: str, fields: tuple[str, ...], sizes: Sequence[int]) -> int:
            return exact({"__key__": key, **dict.fromkeys(fields, b"")}) + sum(sizes)

        return size

    def refusal(self, path: str) -> str | None:
        """Why a file named like ``path`` cannot be one of this format's shards although it
        looks like one (a compressed tar), or None; ``index`` refuses such a folder."""
        return None

    @abstractmethod
    def encoder(self, fileobj: IO[bytes], *, name: str, compression: str | None = None) -> ShardEncoder:
        """An encoder writing one shard called ``name`` (for errors) to ``fileobj``."""

    @abstractmethod
    def sample_size(self, sample: Sample) -> int:
        """Bytes this sample adds to a shard (exact for tar; an estimate for Parquet)."""

    @abstractmethod
    def build_index(self, fileobj: IO[bytes], *, name: str) -> tuple[SampleIndex, tuple[str, ...]]:
        """Read a whole shard once (ours or another tool's); return its index and fields.

        Raises ``FormatError`` naming ``name`` and the offset for corrupt or truncated data.
        """

    def index_source(self, path: str, sidecar: str) -> str | None:
        """The file whose bytes ``build_index_from`` needs to index shard ``path`` (a token
        array's sidecar ``sidecar``, or another tool's index); None: the shard alone."""
        return None

    def build_index_from(
        self, fileobj: IO[bytes], source: bytes, *, name: str
    ) -> tuple[SampleIndex, tuple[str, ...]]:
        """``build_index`` given ``source``, the bytes of the ``index_source`` file."""
        raise UsageError(f"format {self.name!r} indexes a shard from the shard alone", shard=name)

    @abstractmethod
    def load_index(self, data: bytes, *, name: str) -> SampleIndex:
        """Parse a sidecar written by ``SampleIndex.to_bytes``; ``FormatError`` if corrupt."""

    @abstractmethod
    def decode(
        self,
        data: bytes | memoryview,
        rng: ByteRange,
        index: SampleIndex,
        start: int,
        stop: int,
        *,
        name: str,
    ) -> Iterator[Sample]:
        """Samples ``[start, stop)`` from ``data``, the bytes of ``rng`` in the shard.

        ``rng`` must contain ``index.byte_range(start, stop)``; the whole shard
        (``ByteRange(0, size)``) always does.
        """

    def decode_runs(
        self,
        data: bytes | memoryview,
        rng: ByteRange,
        index: SampleIndex,
        starts: np.ndarray,
        stops: np.ndarray,
        *,
        name: str,
    ) -> SampleColumns | list[Sample]:
        """The samples of the runs ``[starts[i], stops[i])``, one after the other, from
        ``data`` (the bytes of ``rng``), in one call: a reader decodes all the runs of a
        read with it (short runs, as ``order="global"`` reads, would otherwise cost a call
        each). The same samples as chaining :meth:`decode` over the runs, as
        ``SampleColumns`` where the format has them; a ``FormatError`` wherever one of
        those calls would raise one (not necessarily the same error: a reader that needs
        the error of a run redoes the runs one by one). This default chains :meth:`decode`.
        """
        out: list[Sample] = []
        for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
            out.extend(self.decode(data, rng, index, start, stop, name=name))
        return out

"""The sample index of a tar shard: where every sample and member lies.

Members are stored flat, in shard order, with ``member_first`` (``num_samples + 1``
entries) marking where each sample's members begin, as a CSR matrix does. Each member
has a field id (into ``fields``), the offset of its data and its size; each sample the
offset of its first header (a PAX or GNU long-name header when it has one).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardstream.errors import FormatError, UsageError
from shardstream.formats._sidecar import (
    StringTable,
    array_section,
    pack_sidecar,
    pack_strings,
    read_array,
    unpack_strings,
    unpack_versioned,
)
from shardstream.formats.base import SampleIndex, SingleSamples
from shardstream.formats.checks import ShardChecks
from shardstream.formats.tar.singles import TarSingles
from shardstream.types import ByteRange

_KIND = b"tar\0"
_VERSION = 2  # 2: the shard's checks follow the index (NOTE [ Checksummed reads ]); 1 still loads
_SECTIONS = {1: 10, 2: 13}


class TarIndex(SampleIndex):
    """The index of one tar shard. Build it with ``TarIndex.from_lists`` or load a sidecar."""

    __slots__ = (
        "_archive_end",
        "_fields",
        "_keys",
        "_member_field",
        "_member_first",
        "_member_offset",
        "_member_size",
        "_name",
        "_sample_start",
        "_uniform",
    )

    def __init__(
        self,
        *,
        name: str,
        keys: list[str] | StringTable,
        sample_start: np.ndarray,
        member_first: np.ndarray,
        fields: list[str],
        member_field: np.ndarray,
        member_offset: np.ndarray,
        member_size: np.ndarray,
        archive_end: int,
    ) -> None:
        self._name = name
        self._keys = keys if isinstance(keys, StringTable) else StringTable.of(keys)
        self._sample_start = sample_start
        self._member_first = member_first
        self._fields = fields
        self._member_field = member_field
        self._member_offset = member_offset
        self._member_size = member_size
        self._archive_end = archive_end
        self._uniform: tuple[str, ...] | bool | None = False  # False: not computed yet
        self._validate()

    @classmethod
    def from_lists(
        cls,
        *,
        name: str,
        keys: list[str],
        sample_start: Sequence[int] | np.ndarray,
        member_first: Sequence[int] | np.ndarray,
        fields: list[str],
        member_field: Sequence[int] | np.ndarray,
        member_offset: Sequence[int] | np.ndarray,
        member_size: Sequence[int] | np.ndarray,
        archive_end: int,
    ) -> TarIndex:
        return cls(
            name=name,
            keys=keys,
            sample_start=np.asarray(sample_start, dtype=np.int64),
            member_first=np.asarray(member_first, dtype=np.int64),
            fields=fields,
            member_field=np.asarray(member_field, dtype=np.uint32),
            member_offset=np.asarray(member_offset, dtype=np.int64),
            member_size=np.asarray(member_size, dtype=np.int64),
            archive_end=int(archive_end),
        )

    def _validate(self) -> None:
        """Reject an index whose arrays contradict each other (a CRC only catches accidents)."""
        n, m = len(self._keys), len(self._member_offset)
        first = self._member_first
        problems = []
        if len(self._sample_start) != n or len(first) != n + 1:
            problems.append("array lengths do not match the sample count")
        elif n and (first[0] != 0 or first[-1] != m or bool(np.any(np.diff(first) < 1))):
            problems.append("member ranges are not increasing")
        elif not n and (len(first) != 1 or first[0] != 0 or m):
            problems.append("members without samples")
        if len(self._member_field) != m or len(self._member_size) != m:
            problems.append("member arrays differ in length")
        elif m and (
            int(self._member_field.max()) >= len(self._fields)
            or int(self._member_size.min()) < 0
            or int(self._member_offset.min()) < 0
            or int(self._member_offset.max()) > self._archive_end
            or int(self._member_size.max()) > self._archive_end  # before the sum: no int64 overflow
            or int((self._member_offset + self._member_size).max()) > self._archive_end
        ):
            problems.append("member fields or offsets out of range")
        if not problems and n and not self._in_order():
            problems.append("samples or members out of order")
        if problems:
            raise FormatError("inconsistent tar sample index: " + "; ".join(problems), shard=self._name)

    def _in_order(self) -> bool:
        """Members in shard order, each sample's first header before its data: so every
        run's byte range is a real range (a hostile sidecar that passed its CRC)."""
        starts, offsets = self._sample_start, self._member_offset
        return (
            int(starts.min()) >= 0
            and not bool(np.any(np.diff(offsets) < 0))
            and not bool(np.any(starts > offsets[self._member_first[:-1]]))
            and not bool(np.any(np.diff(starts) < 0))
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def num_samples(self) -> int:
        return len(self._keys)

    @property
    def keys(self) -> list[str]:
        return list(self._keys.strings())

    @property
    def fields(self) -> tuple[str, ...]:
        """Every field name met in the shard, sorted."""
        used = np.unique(self._member_field).tolist()
        return tuple(sorted(self._fields[i] for i in used))

    @property
    def field_names(self) -> Sequence[str]:
        """The index's field table as stored (members name fields by their place in it),
        without looking at which members use them: cheap."""
        return self._fields

    @property
    def archive_end(self) -> int:
        """Offset of the end-of-archive blocks: the size of all members."""
        return self._archive_end

    def byte_range(self, start: int, stop: int) -> ByteRange:
        n = len(self._keys)
        if not 0 <= start <= stop <= n:
            raise UsageError(f"sample range [{start}, {stop}) is outside [0, {n})", shard=self._name)
        if start == stop:
            pos = int(self._sample_start[start]) if start < n else self._archive_end
            return ByteRange(pos, pos)
        last = int(self._member_first[stop]) - 1
        end = int(self._member_offset[last]) + int(self._member_size[last])
        return ByteRange(int(self._sample_start[start]), end)

    def byte_ranges(self, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = len(self._keys)
        outside = (starts < 0) | (starts > stops) | (stops > n)
        if bool(outside.any()):
            i = int(np.argmax(outside))
            self.byte_range(int(starts[i]), int(stops[i]))  # raises, naming the run
        empty = starts == stops
        if not n:
            ends = np.full(starts.shape, self._archive_end, dtype=np.int64)
            return ends, ends.copy()
        first = self._sample_start[np.minimum(starts, n - 1)]
        last = self._member_first[stops] - 1
        end = self._member_offset[last] + self._member_size[last]
        at = np.where(starts < n, first, self._archive_end)
        return np.where(empty, at, first), np.where(empty, at, end)

    def singles(self) -> SingleSamples | None:
        """Single samples cut by their spans, where every sample has the same fields."""
        uniform = self.uniform_fields()
        if not uniform:
            return None
        return TarSingles(self._name, self.key_slice(0, self.num_samples), self.sample_arrays(), uniform)

    def sample_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``sample_start``, ``member_first``, ``member_offset``, ``member_size`` (see the module)."""
        return self._sample_start, self._member_first, self._member_offset, self._member_size

    def key_slice(self, start: int, stop: int) -> list[str]:
        return self._keys.strings()[start:stop]

    def keys_at(self, positions: np.ndarray) -> list[str]:
        """The keys of the samples at ``positions``, in that order."""
        return self._keys.at(positions)

    def members(self, start: int, stop: int) -> tuple[int, int]:
        """The flat member positions ``[m0, m1)`` of samples ``[start, stop)``."""
        return int(self._member_first[start]), int(self._member_first[stop])

    def uniform_fields(self) -> tuple[str, ...] | None:
        """The field names, in shard order, when every sample has the same ones (the usual case)."""
        if self._uniform is False:
            self._uniform = self._compute_uniform()
        return self._uniform  # type: ignore[return-value]

    def _compute_uniform(self) -> tuple[str, ...] | None:
        n = len(self._keys)
        if not n:
            return ()
        k = int(self._member_first[1])
        if len(self._member_field) != n * k:
            return None
        grid = self._member_field.reshape(n, k)
        if not bool(np.all(grid == grid[0])):
            return None
        return tuple(self._fields[i] for i in grid[0].tolist())

    def member_fields(self, m0: int, m1: int) -> list[str]:
        fields = self._fields
        return [fields[i] for i in self._member_field[m0:m1].tolist()]

    def member_first_at(self, positions: np.ndarray) -> np.ndarray:
        """The flat position of the first member of each sample at ``positions``."""
        return self._member_first[positions]

    def member_spans_at(self, members: np.ndarray, base: int) -> tuple[list[int], list[int]]:
        """Start and end of the data of the members at ``members``, relative to ``base``."""
        starts = self._member_offset[members] - base
        return starts.tolist(), (starts + self._member_size[members]).tolist()

    def member_arrays_at(self, members: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray]:
        """Start (relative to ``base``) and size of the data of the members at ``members``."""
        return self._member_offset[members] - base, self._member_size[members]

    def member_spans(self, m0: int, m1: int, base: int) -> tuple[list[int], list[int]]:
        """Start and end of each member's data, relative to ``base``."""
        starts = self._member_offset[m0:m1] - base
        return starts.tolist(), (starts + self._member_size[m0:m1]).tolist()

    def sample_counts(self, start: int, stop: int) -> list[int]:
        return np.diff(self._member_first[start : stop + 1]).tolist()

    def to_bytes(self, *, with_checks: bool = True) -> bytes:
        checks = self._checks if with_checks else None
        key_blob, key_ends = self._keys.sections()
        field_blob, field_ends = pack_strings(self._fields)
        counts = np.array([len(self._keys), len(self._fields), len(self._member_offset), self._archive_end])
        return pack_sidecar(
            _KIND,
            _VERSION,
            [
                array_section(counts, "<i8"),
                key_blob,
                key_ends,
                field_blob,
                field_ends,
                array_section(self._sample_start, "<i8"),
                array_section(self._member_first, "<i8"),
                array_section(self._member_field, "<u4"),
                array_section(self._member_offset, "<i8"),
                array_section(self._member_size, "<i8"),
                *(checks.sections() if checks is not None else ShardChecks.empty_sections()),
            ],
        )

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, *, name: str) -> TarIndex:
        version, sections = unpack_versioned(data, _KIND, (1, _VERSION), name=name)
        if len(sections) != _SECTIONS[version]:
            raise FormatError(
                f"tar sample index has {len(sections)} sections, expected {_SECTIONS[version]}", shard=name
            )
        n, nfields, m, archive_end = read_array(sections[0], "<i8", 4, name=name, what="counts").tolist()
        if min(n, nfields, m, archive_end) < 0:
            raise FormatError("tar sample index has negative counts", shard=name)
        checks = ShardChecks.from_sections(sections[10:], name=name) if version > 1 else None
        if checks is not None and checks.size < archive_end:
            raise FormatError(
                f"tar sample index: members end past the shard's {checks.size} bytes", shard=name
            )
        index = cls(
            name=name,
            keys=unpack_strings(sections[1], sections[2], n, name=name, what="keys"),
            fields=unpack_strings(sections[3], sections[4], nfields, name=name, what="fields").strings(),
            sample_start=read_array(sections[5], "<i8", n, name=name, what="sample starts"),
            member_first=read_array(sections[6], "<i8", n + 1, name=name, what="member ranges"),
            member_field=read_array(sections[7], "<u4", m, name=name, what="member fields"),
            member_offset=read_array(sections[8], "<i8", m, name=name, what="member offsets"),
            member_size=read_array(sections[9], "<i8", m, name=name, what="member sizes"),
            archive_end=archive_end,
        )
        if checks is not None:
            index.bind_checks(checks)
        return index

    def __repr__(self) -> str:
        return f"TarIndex(name={self._name!r}, samples={len(self._keys)}, members={len(self._member_offset)})"

"""What a pack is asked to do: shard format and limits, compression, part, overwrite.

Shared by ``pack`` and ``ShardWriter`` so that both cut and name shards the same way.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

from shardstream.counts import MAX_COUNT, parse_count
from shardstream.errors import ShardstreamError, UsageError, shown
from shardstream.folder import SHARD_PREFIX, part_prefix, part_record_name, shard_name
from shardstream.formats import ShardFormat, available_formats, get_format
from shardstream.pack.tokenize import Tokenizing

DEFAULT_SHARD_SIZE = 256 * 10**6  # "256MB": used when neither a size nor a sample count is given
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_PART_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes from ``"256MB"`` (SI: 10**6), ``"64MiB"`` (2**20), ``"1.5GB"`` or a plain int."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE_RE.match(str(text))
        unit = _UNITS.get(match.group(2).lower()) if match else None
        if match is None or unit is None:
            raise UsageError(f"bad size {shown(text, 40)}: use bytes or a unit, as in 256MB, 64MiB, 1GB")
        digits = match.group(1)
        if len(digits) > 40:  # exact arithmetic below, but not on thousands of digits
            raise UsageError(f"size {shown(text, 40)} is too large: at most {MAX_COUNT} bytes")
        value = int(Fraction(digits) * unit)  # exact: a float turns 400 digits into infinity
    if value <= 0:
        raise UsageError(f"a size must be positive, not {shown(text, 40)}")
    if value > MAX_COUNT:
        raise UsageError(f"size {shown(text, 40)} is too large: at most {MAX_COUNT} bytes")
    return value


@dataclass(frozen=True, slots=True)
class Part:
    """Part ``index`` of ``count`` (``--part I/N``): the I-th of N slices of the source."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise UsageError(f"part {self.index}/{self.count}: need 0 <= I < N (parts count from 0)")

    @property
    def prefix(self) -> str:
        """The start of this part's shard names."""
        return part_prefix(self.index)

    @property
    def record(self) -> str:
        """The file listing this part's shards, written when the part is whole."""
        return part_record_name(self.index, self.count)

    def slice(self, total: int) -> tuple[int, int]:
        """Samples ``[start, stop)`` of a source of ``total`` samples that belong to this part."""
        return self.index * total // self.count, (self.index + 1) * total // self.count


def parse_part(value: str | tuple[int, int] | Part | None) -> Part | None:
    """A ``Part`` from ``"I/N"``, ``(I, N)`` or a ``Part``."""
    if value is None or isinstance(value, Part):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return Part(int(value[0]), int(value[1]))
    match = _PART_RE.match(str(value))
    if match is None:
        raise UsageError(f"bad part {value!r}: use I/N, as in 3/16 (parts count from 0)")
    return Part(int(match.group(1)), int(match.group(2)))


@dataclass(frozen=True, slots=True)
class PackOptions:
    """How samples become shards; validated on creation."""

    format: str = "tar"
    shard_size: int | None = None
    samples_per_shard: int | None = None
    compression: str | None = None
    part: Part | None = None
    overwrite: bool = False
    # text tokenized into documents: NOTE [ Tokenizing in the pack's workers ] in ``tokenize``
    tokenizing: Tokenizing | None = None

    def __post_init__(self) -> None:
        # UsageError naming the known formats, or for a compression the format does not have
        get_format(self.format).encoder(io.BytesIO(), name="<options>", compression=self.compression)
        if self.tokenizing is not None and get_format(self.format).token_field is None:
            able = ", ".join(name for name, fmt in available_formats().items() if fmt.token_field is not None)
            raise UsageError(f"{self.format} shards hold no token ids; a pack with a tokenizer writes {able}")
        if self.shard_size is not None:
            parse_count(self.shard_size, "shard_size")
        if self.samples_per_shard is not None:
            parse_count(self.samples_per_shard, "samples_per_shard")

    @classmethod
    def create(
        cls,
        *,
        format: str = "tar",
        shard_size: int | str | None = None,
        samples_per_shard: int | None = None,
        compression: str | None = None,
        part: str | tuple[int, int] | Part | None = None,
        overwrite: bool = False,
        tokenizing: Tokenizing | None = None,
    ) -> PackOptions:
        """Options from user-facing values (``"256MB"``, ``"3/16"``)."""
        size = parse_size(shard_size) if shard_size is not None else None
        if size is None and samples_per_shard is None:
            size = DEFAULT_SHARD_SIZE
        return cls(
            format=format,
            shard_size=size,
            samples_per_shard=None
            if samples_per_shard is None
            else parse_count(samples_per_shard, "samples_per_shard"),
            compression=None if compression in (None, "") else compression,
            part=parse_part(part),
            overwrite=bool(overwrite),
            tokenizing=tokenizing,
        )

    @property
    def fmt(self) -> ShardFormat:
        return get_format(self.format)

    @property
    def prefix(self) -> str:
        return self.part.prefix if self.part is not None else SHARD_PREFIX

    def shard_name(self, number: int) -> str:
        return shard_name(self.prefix, number, self.fmt.suffix)

    def limits(self) -> tuple[int, int]:
        """(byte budget for the samples of a shard, samples per shard); huge when unlimited.

        The budget is the shard size less what an empty shard takes (tar's end blocks),
        so a whole shard never exceeds ``shard_size``.
        """
        unlimited = 2**62
        budget = unlimited
        if self.shard_size is not None:
            budget = self.shard_size - _empty_shard_bytes(self.format, self.compression)
            if budget <= 0:
                raise UsageError(f"shard size {self.shard_size} is smaller than an empty {self.format} shard")
        return budget, self.samples_per_shard or unlimited


@cache
def _empty_shard_bytes(format: str, compression: str | None) -> int:
    """Bytes of a shard holding no samples (tar: its two end blocks)."""
    buffer = io.BytesIO()
    try:
        get_format(format).encoder(buffer, name="<empty>", compression=compression).close()
    except ShardstreamError:
        return 0  # a format that cannot write an empty shard has no fixed overhead to count
    return buffer.tell()

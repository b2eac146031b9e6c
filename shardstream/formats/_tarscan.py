"""Index any tar (ours, webdataset's, GNU tar's) in one sequential pass over its headers.

Only headers are read; member data is skipped with ``seek`` when the file object can,
read and dropped otherwise. Every malformed header, impossible size or early end is a
``FormatError`` with the shard name and the byte offset of the offending block.
"""

from __future__ import annotations

import io
import struct
from typing import IO

from shardstream.errors import FormatError
from shardstream.formats._tarheader import BLOCK
from shardstream.formats._tarindex import TarIndex
from shardstream.formats._tarwrite import KEY_FIELD_RE, webdataset_skips

__all__ = ["scan_tar"]

_ZERO = bytes(BLOCK)
_REGULAR = frozenset(b"07\0")  # typeflags (as ints) of regular files
_NO_DATA = frozenset(b"123456")  # links, devices, directories, fifos: size is not data
_MAX_EXTENDED = 1 << 20  # a PAX or GNU long-name header beyond this is garbage, not a name
_SIGNED = struct.Struct("148b8x356b")


class _Reader:
    """Exact reads and bounded skips with a running offset."""

    def __init__(self, fileobj: IO[bytes], name: str) -> None:
        self.file = fileobj
        self.name = name
        self.pos = 0
        self.size: int | None = None
        try:
            if fileobj.seekable():
                here = fileobj.tell()
                self.size = fileobj.seek(0, io.SEEK_END) - here
                fileobj.seek(here)
        except (OSError, AttributeError, ValueError):
            self.size = None

    def error(self, message: str, offset: int) -> FormatError:
        return FormatError(f"bad tar: {message}", shard=self.name, offset=offset)

    def read(self, n: int, what: str) -> bytes:
        if self.size is not None and self.pos + n > self.size:
            raise self.error(f"truncated {what}: needs {n} bytes, {self.size - self.pos} left", self.pos)
        data = self.file.read(n)
        if len(data) != n:
            raise self.error(f"truncated {what}: needs {n} bytes, got {len(data)}", self.pos)
        self.pos += n
        return data

    def read_block(self) -> bytes | None:
        """The next header block; None at the end of the file."""
        data = self.file.read(BLOCK)
        if not data:
            return None
        if len(data) != BLOCK:
            raise self.error(f"truncated header ({len(data)} of {BLOCK} bytes)", self.pos)
        self.pos += BLOCK
        return data

    def skip(self, n: int, what: str) -> None:
        if self.size is not None:
            if self.pos + n > self.size:
                raise self.error(
                    f"{what} runs {self.pos + n - self.size} bytes past the end of the file", self.pos
                )
            self.file.seek(n, io.SEEK_CUR)
            self.pos += n
            return
        left = n
        while left:
            got = len(self.file.read(min(left, 1 << 20)))
            if not got:
                raise self.error(f"truncated {what}: {left} bytes missing", self.pos)
            self.pos += got
            left -= got


def _number(field: bytes) -> int:
    """A numeric header field: octal text, or GNU base-256 when the high bit is set."""
    if field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == 0xFF else value
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _check_header(block: bytes, reader: _Reader, offset: int) -> int:
    """Verify the checksum; return the member's size field."""
    try:
        stored = _number(block[148:156])
        size = _number(block[124:136])
    except ValueError:
        raise reader.error("header has non-numeric checksum or size (not a tar header)", offset) from None
    unsigned = sum(block) - sum(block[148:156]) + 256
    if stored != unsigned and stored != sum(_SIGNED.unpack(block)) + 256:
        raise reader.error("header checksum mismatch (corrupt data or not a tar file)", offset)
    if size < 0:
        raise reader.error(f"negative member size {size}", offset)
    return size


def _pax_records(data: bytes, reader: _Reader, offset: int) -> dict[str, bytes]:
    records = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space]) if space > pos else 0
        except ValueError:
            length = 0
        end = pos + length
        if length <= 0 or end > len(data) or data[end - 1 : end] != b"\n" or b"=" not in data[space:end]:
            raise reader.error("malformed PAX extended header record", offset)
        key, _, value = data[space + 1 : end - 1].partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value
        pos = end
    return records


def _extended(reader: _Reader, size: int, offset: int) -> bytes:
    if size > _MAX_EXTENDED:
        raise reader.error(f"extended header of {size} bytes is implausible", offset)
    data = reader.read(size, "extended header")
    reader.skip(-size % BLOCK, "extended header padding")
    return data


class _Grouper:
    """Members to samples the way ``webdataset`` groups them: consecutive members sharing a key."""

    def __init__(self, reader: _Reader) -> None:
        self.reader = reader
        self.keys: list[str] = []
        self.sample_start: list[int] = []
        self.member_first: list[int] = [0]
        self.member_field: list[int] = []
        self.member_offset: list[int] = []
        self.member_size: list[int] = []
        self.fields: list[str] = []
        self.field_ids: dict[str, int] = {}
        self.current: set[str] = set()

    def add(self, name: str, header_start: int, data_offset: int, size: int) -> None:
        if webdataset_skips(name):
            return
        match = KEY_FIELD_RE.match(name)
        if match is None:
            return
        key, field = match.group(1), match.group(2)
        if not self.keys or key != self.keys[-1]:
            if self.keys:
                self.member_first.append(len(self.member_offset))
            self.keys.append(key)
            self.sample_start.append(header_start)
            self.current = set()
        elif field in self.current:
            raise self.reader.error(f"sample {key!r} has field {field!r} twice", header_start)
        self.current.add(field)
        fid = self.field_ids.get(field)
        if fid is None:
            fid = self.field_ids[field] = len(self.fields)
            self.fields.append(field)
        self.member_field.append(fid)
        self.member_offset.append(data_offset)
        self.member_size.append(size)

    def index(self, archive_end: int) -> TarIndex:
        if self.keys:
            self.member_first.append(len(self.member_offset))
        return TarIndex.from_lists(
            name=self.reader.name,
            keys=self.keys,
            sample_start=self.sample_start,
            member_first=self.member_first,
            fields=self.fields,
            member_field=self.member_field,
            member_offset=self.member_offset,
            member_size=self.member_size,
            archive_end=archive_end,
        )


def _decode_name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _ustar_name(block: bytes) -> str:
    name = block[0:100].split(b"\0", 1)[0]
    if block[257:263] == b"ustar\0":  # POSIX: a prefix field (GNU's "ustar  \0" has other data there)
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return _decode_name(name)


def _name_and_size(
    block: bytes, records: dict[str, bytes], long_name: str | None, size: int, reader: _Reader, offset: int
) -> tuple[str, int]:
    """A member's name and size: PAX records first, then a GNU long name, then the ustar fields."""
    if "size" in records:
        if not records["size"].isdigit():
            raise reader.error(f"PAX size {records['size']!r} is not a number", offset)
        size = int(records["size"])
    if "path" in records:
        return _decode_name(records["path"]), size
    return (long_name if long_name is not None else _ustar_name(block)), size


def scan_tar(fileobj: IO[bytes], name: str) -> TarIndex:
    """The index of the tar in ``fileobj``, read from its current position to its end marker."""
    reader = _Reader(fileobj, name)
    grouper = _Grouper(reader)
    global_pax: dict[str, bytes] = {}
    pax: dict[str, bytes] = {}
    long_name: str | None = None
    pending: int | None = None  # start of the extended headers that belong to the next member
    while True:
        offset = reader.pos
        block = reader.read_block()
        if block is None:
            raise reader.error("truncated: no end-of-archive marker", offset)
        if block == _ZERO:
            if pending is not None:
                raise reader.error("extended header without a member", pending)
            return grouper.index(offset)
        size = _check_header(block, reader, offset)
        typeflag = block[156]
        if typeflag in (0x78, 0x67):  # 'x' for the next member, 'g' for all that follow
            records = _pax_records(_extended(reader, size, offset), reader, offset)
            if typeflag == 0x67:
                global_pax.update(records)
            else:
                pax.update(records)
                pending = offset if pending is None else pending
            continue
        if typeflag in (0x4C, 0x4B):  # GNU 'L' long name, 'K' long link name
            data = _extended(reader, size, offset)
            if typeflag == 0x4C:
                long_name = _decode_name(data.split(b"\0", 1)[0])
            pending = offset if pending is None else pending
            continue
        records = {**global_pax, **pax} if global_pax else pax
        member, size = _name_and_size(block, records, long_name, size, reader, offset)
        start = offset if pending is None else pending
        pax, long_name, pending = {}, None, None
        if typeflag in _NO_DATA:
            continue
        data_offset = reader.pos
        reader.skip(size + (-size % BLOCK), f"member {member!r}")
        if typeflag in _REGULAR and not member.endswith("/"):
            grouper.add(member, start, data_offset, size)

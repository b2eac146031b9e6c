"""Read any tar (ours, webdataset's, GNU tar's) in one sequential pass over its headers.

``tar_members`` gives the members with their data, for ``pack`` to repack a tar; ``scan``
builds a shard's index from the same pass with the data skipped (``seek`` when the file
object can, read and dropped otherwise). Every malformed header, impossible size or early
end is a ``FormatError`` with the shard name and the byte offset of the offending block.

# NOTE [ Bounded tar reading ]
# Tars come from anywhere, so reading one must cost time and memory in proportion to its
# bytes, never to what its headers claim (Python's tarfile does not: a sparse member
# expands to the size it claims, a global PAX header is copied into every member that
# follows, a PAX record of digits is parsed in quadratic time, CVE-2024-6232). So:
# - an extended header (PAX, GNU long name) is read only up to _MAX_EXTENDED bytes, its
#   records are parsed in one linear pass, lengths of at most 20 digits, and only the
#   records that change a member's place or size (``path``, ``size``) are kept, so
#   neither a big global header nor many of them grow what is held;
# - sparse members (GNU type 'S', PAX ``GNU.sparse.*``) are refused: their data is a map
#   of holes, and expanding it is what a 5 KB tar claiming 8 GiB relies on;
# - member data is read in pieces of at most _PIECE bytes, and never past the end of a
#   file whose size is known, so a size field alone allocates nothing;
# - a field name starting with ``_`` is refused: it is metadata in webdataset's and our
#   samples (``KEY.__key__`` would replace the sample's key).
# A compressed file (gzip, bzip2, xz, zstd, lz4) is named as such when its first header
# fails, rather than reported as a corrupt header.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from typing import IO, NamedTuple

from shardstream.errors import FormatError, shown
from shardstream.formats.tar.header import BLOCK

_ZERO = bytes(BLOCK)
_REGULAR = frozenset(b"07\0")  # typeflags (as ints) of regular files
_NO_DATA = frozenset(b"123456")  # links, devices, directories, fifos: size is not data
_SPARSE = 0x53  # GNU 'S'
_MAX_EXTENDED = 1 << 20  # a PAX or GNU long-name header beyond this is garbage, not a name
_PIECE = 1 << 20  # member data is read in pieces of this size (NOTE [ Bounded tar reading ])
_KEPT_PAX = frozenset((b"path", b"size"))
_SIGNED = struct.Struct("148b8x356b")
_COMPRESSED = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\x04\x22\x4d\x18", "lz4"),
    (b"PK\x03\x04", "zip"),
)


class TarMember(NamedTuple):
    """A regular file in a tar: its name, where its headers start, where its data lies."""

    name: str
    start: int  # offset of its first header (a PAX or GNU long-name header when it has one)
    data_offset: int
    size: int
    data: bytes | None  # its bytes, when asked for


class MemberReader:
    """Exact reads and bounded skips with a running offset."""

    def __init__(self, fileobj: IO[bytes], name: str, sized: bool) -> None:
        self.file = fileobj
        self.name = name
        self.pos = 0
        self.size: int | None = None
        self.head = b""  # the first bytes read, to name a compressed file
        try:
            if sized and fileobj.seekable():
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
        pieces = []
        left = n
        while left:  # in pieces: a size field alone must not allocate (NOTE [ Bounded tar reading ])
            piece = self.file.read(min(left, _PIECE))
            if not piece:
                raise self.error(f"truncated {what}: needs {n} bytes, got {n - left}", self.pos)
            pieces.append(piece)
            left -= len(piece)
        self.pos += n
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def read_block(self) -> bytes | None:
        """The next header block; None at the end of the file."""
        data = self.file.read(BLOCK)
        if self.pos == 0:
            self.head = data
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
            got = len(self.file.read(min(left, _PIECE)))
            if not got:
                raise self.error(f"truncated {what}: {left} bytes missing", self.pos)
            self.pos += got
            left -= got

    def compressed(self) -> FormatError | None:
        """The error for a compressed file, if the first bytes say it is one."""
        return _compressed(self.head, self.name)


def _compressed(head: bytes, name: str) -> FormatError | None:
    for magic, kind in _COMPRESSED:
        if head.startswith(magic):
            return FormatError(
                f"bad tar: this is {kind} data, not an uncompressed tar: shardstream reads uncompressed "
                "tar (decompress it first; pack also reads .tar.gz, .tgz, .tar.bz2 and .tar.xz files)",
                shard=name,
                offset=0,
            )
    return None


def _number(field: bytes) -> int:
    """A numeric header field: octal text, or GNU base-256 when the high bit is set."""
    if field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == 0xFF else value
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _checksum_holds(block: bytes) -> bool:
    try:
        stored = _number(block[148:156])
    except ValueError:
        return False
    return stored in (sum(block) - sum(block[148:156]) + 256, sum(_SIGNED.unpack(block)) + 256)


def _check_header(block: bytes, reader: MemberReader, offset: int) -> int:
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


def _pax_records(data: bytes, reader: MemberReader, offset: int) -> dict[bytes, bytes]:
    """The ``path`` and ``size`` records of a PAX header, in one linear pass over it."""
    records = {}
    pos, n = 0, len(data)
    while pos < n and data[pos] != 0:
        space = data.find(b" ", pos, pos + 21)  # a length of at most 20 digits
        digits = data[pos:space] if space > pos else b""
        end = pos + int(digits) if digits.isdigit() else pos
        equals = data.find(b"=", space, end) if end > space else -1
        if equals < 0 or end > n or data[end - 1] != 0x0A:
            raise reader.error("malformed PAX extended header record", offset + BLOCK + pos)
        key = data[space + 1 : equals]
        if key.startswith(b"GNU.sparse."):
            raise reader.error(f"sparse member ({shown(key)} record): sparse files are not supported", offset)
        if key in _KEPT_PAX:
            records[key] = data[equals + 1 : end - 1]
        pos = end
    return records


def _extended(reader: MemberReader, size: int, offset: int) -> bytes:
    if size > _MAX_EXTENDED:
        raise reader.error(f"extended header of {size} bytes is implausible", offset)
    data = reader.read(size, "extended header")
    reader.skip(-size % BLOCK, "extended header padding")
    return data


def _decode_name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _ustar_name(block: bytes) -> str:
    name = block[0:100].split(b"\0", 1)[0]
    if block[257:263] == b"ustar\0":  # POSIX: a prefix field (GNU's "ustar  \0" has other data there)
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return _decode_name(name)


class _Pending:
    """What extended headers said about the next member, and where the first of them began."""

    def __init__(self) -> None:
        self.global_pax: dict[bytes, bytes] = {}
        self.clear()

    def clear(self) -> None:
        self.pax: dict[bytes, bytes] = {}
        self.long_name: str | None = None
        self.start: int | None = None

    def get(self, key: bytes) -> bytes | None:
        value = self.pax.get(key)
        return self.global_pax.get(key) if value is None else value


def _name_and_size(
    block: bytes, pending: _Pending, size: int, reader: MemberReader, offset: int
) -> tuple[str, int]:
    """A member's name and size: PAX records first, then a GNU long name, then the ustar fields."""
    pax_size = pending.get(b"size")
    if pax_size is not None:
        if not pax_size.isdigit() or len(pax_size) > 20:
            raise reader.error(f"PAX size {shown(pax_size)} is not a number", offset)
        size = int(pax_size)
    path = pending.get(b"path")
    if path is not None:
        return _decode_name(path), size
    return (pending.long_name if pending.long_name is not None else _ustar_name(block)), size


def _header(reader: MemberReader, offset: int) -> tuple[bytes, int] | None:
    """The next header block and its size field; None at the end-of-archive block."""
    try:
        block = reader.read_block()
        if block is None:
            raise reader.error("truncated: no end-of-archive marker", offset)
        if block == _ZERO:
            return None
        return block, _check_header(block, reader, offset)
    except FormatError:
        compressed = reader.compressed() if offset == 0 else None
        if compressed is not None:
            raise compressed from None
        raise


def read_members(reader: MemberReader, read_data: bool, max_size: int | None = None) -> Iterator[TarMember]:
    """The regular files of the tar, in order; returns at the end-of-archive block."""
    pending = _Pending()
    while True:
        offset = reader.pos
        header = _header(reader, offset)
        if header is None:
            if pending.start is not None:
                raise reader.error("extended header without a member", pending.start)
            return
        block, size = header
        typeflag = block[156]
        if typeflag in (0x78, 0x67):  # 'x' for the next member, 'g' for all that follow
            records = _pax_records(_extended(reader, size, offset), reader, offset)
            if typeflag == 0x67:
                pending.global_pax.update(records)
                continue
            pending.pax.update(records)
        elif typeflag in (0x4C, 0x4B):  # GNU 'L' long name, 'K' long link name
            data = _extended(reader, size, offset)
            if typeflag == 0x4C:
                pending.long_name = _decode_name(data.split(b"\0", 1)[0])
        else:
            member = _member(reader, block, typeflag, size, pending, offset, read_data, max_size)
            pending.clear()
            if member is not None:
                yield member
            continue
        pending.start = offset if pending.start is None else pending.start


def _member(
    reader: MemberReader,
    block: bytes,
    typeflag: int,
    size: int,
    pending: _Pending,
    offset: int,
    read_data: bool,
    max_size: int | None = None,
) -> TarMember | None:
    """The member whose (last) header is ``block`` if it is a regular file (else None); the
    reader is left after its data."""
    name, size = _name_and_size(block, pending, size, reader, offset)
    start = offset if pending.start is None else pending.start
    if typeflag == _SPARSE:
        raise reader.error(f"member {shown(name)} is a sparse file: sparse files are not supported", start)
    if typeflag in _NO_DATA:
        return None
    data_offset = reader.pos
    regular = typeflag in _REGULAR and not name.endswith("/")
    if regular and max_size is not None and size > max_size:  # refused on its header, before any read
        raise reader.error(
            f"member {shown(name)} of {size} bytes: members of more than {max_size} bytes are not supported",
            start,
        )
    if regular and read_data:
        data = reader.read(size, f"member {shown(name)}")
        reader.skip(-size % BLOCK, f"padding of member {shown(name)}")
    else:
        data = None
        reader.skip(size + (-size % BLOCK), f"member {shown(name)}")
    return TarMember(name, start, data_offset, size, data) if regular else None


def tar_members(
    fileobj: IO[bytes], name: str, *, read_data: bool = True, sized: bool = True, max_size: int | None = None
) -> Iterator[TarMember]:
    """The regular files of the tar in ``fileobj``, from its current position to its end marker.

    ``sized=False`` says ``fileobj`` should be read as a stream even if it can seek (a
    decompressing file, whose size is only known by decompressing it all). A regular
    member larger than ``max_size`` bytes is refused on its header, before its data is read.
    See NOTE [ Bounded tar reading ] for what is refused.
    """
    return read_members(MemberReader(fileobj, name, sized), read_data, max_size)


def metadata_field(member: str, field: str) -> str:
    """Why a member whose field starts with ``_`` is refused (the index and pack say the same)."""
    return (
        f"member {shown(member)} has field {shown(field)}: a field starting with '_' is sample "
        "metadata (such as __key__), not data, and would replace it"
    )


def check_uncompressed(head: bytes, name: str) -> None:
    """``FormatError`` if ``head``, a shard's first bytes, are those of a compressed file.

    A tar's first bytes are its first member's name (``BZhello.txt``), so a first block
    whose header checksum holds is a tar, whatever it starts with."""
    if len(head) >= BLOCK and _checksum_holds(head[:BLOCK]):
        return
    error = _compressed(head, name)
    if error is not None:
        raise error

"""Tar header blocks: the constant ustar template the encoder fills in, and PAX headers.

# NOTE [ Compact deterministic tar headers ]
# Every member gets one 512-byte ustar header: mode 0o444, uid/gid 0, empty user and
# group names, mtime 0, so the same samples always give the same bytes. Only the name,
# the size and the checksum change from member to member, so the header is the
# concatenation of constant pieces and those three fields, and the checksum (the sum of
# the header's bytes with the checksum field read as spaces) is a constant plus the byte
# sums of the name and the size field. The encoder keeps those sums per field name and
# per size, so it never sums a whole header. A PAX extended header ('x') precedes a
# member only when its name does not fit the ustar name/prefix fields or its size does
# not fit 11 octal digits (8 GiB and more), as POSIX.1-2001 and Python's tarfile do.
"""

from __future__ import annotations

__all__ = [
    "BLOCK",
    "CHECKSUM_BASE",
    "END_OF_ARCHIVE",
    "HEAD_CONST",
    "MAX_USTAR_SIZE",
    "NAME_FIELD",
    "PADDING",
    "checksum_field",
    "member_header",
    "size_field",
]

BLOCK = 512
NAME_FIELD = 100  # bytes of the ustar name field
MAX_USTAR_SIZE = 0o77777777777  # 11 octal digits: 8 GiB - 1
END_OF_ARCHIVE = bytes(2 * BLOCK)
# PADDING[n % 512] is what follows n bytes of member data to reach the next block.
PADDING = tuple(bytes(-i % BLOCK) for i in range(BLOCK))

_MODE_UID_GID = b"0000444\0" + b"0000000\0" + b"0000000\0"  # 100..124
_MTIME = b"00000000000\0"  # 136..148
_CHECKSUM_BLANK = b" " * 8  # 148..156, counted as spaces


def _tail(typeflag: bytes) -> bytes:
    """Bytes 156..345: typeflag, linkname, magic, version, uname, gname, devmajor, devminor."""
    return typeflag + bytes(100) + b"ustar\0" + b"00" + bytes(64) + b"0000000\0" * 2


_TAIL = {flag: _tail(flag) for flag in (b"0", b"x")}
# After the checksum for a regular file with an empty prefix: tail, prefix, padding.
HEAD_CONST = _TAIL[b"0"] + bytes(155 + 12)
# The checksum of a regular member is this plus the byte sums of its name and of size_field().
CHECKSUM_BASE = sum(_CHECKSUM_BLANK) + sum(_TAIL[b"0"])


def size_field(size: int) -> bytes:
    """Mode, uid, gid, size and mtime fields (bytes 100..148) for a member of ``size`` bytes."""
    return _MODE_UID_GID + (b"%011o\0" % size) + _MTIME


def checksum_field(checksum: int) -> bytes:
    return b"%06o\0 " % checksum


def _ustar(name: bytes, prefix: bytes, size: int, typeflag: bytes) -> bytes:
    head = name.ljust(100, b"\0") + size_field(size)
    tail = _TAIL[typeflag] + prefix.ljust(155, b"\0") + bytes(12)
    return head + checksum_field(sum(head) + sum(_CHECKSUM_BLANK) + sum(tail)) + tail


def _split_ustar(name: bytes) -> tuple[bytes, bytes] | None:
    """(prefix, name) fitting ustar's 155 + 100 bytes, shortest prefix first, as tarfile does."""
    if len(name) <= 100:
        return b"", name
    parts = name.split(b"/")
    for i in range(1, len(parts)):
        prefix, rest = b"/".join(parts[:i]), b"/".join(parts[i:])
        if len(prefix) <= 155 and 0 < len(rest) <= 100:
            return prefix, rest
    return None


def _pax_record(key: str, value: bytes) -> bytes:
    body = b" " + key.encode() + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:  # the length counts its own digits
        length = len(str(length)) + len(body)
    return str(length).encode() + body


def member_header(name: bytes, size: int) -> bytes:
    """Header block(s) of a regular member: one ustar block, or a PAX header and one."""
    split = _split_ustar(name)
    if split is not None and size <= MAX_USTAR_SIZE:
        return _ustar(split[1], split[0], size, b"0")
    records = b""
    if split is None:
        records += _pax_record("path", name)
        split = (b"", name[:100])
    if size > MAX_USTAR_SIZE:
        records += _pax_record("size", b"%d" % size)
    pax = _ustar(b"././@PaxHeader", b"", len(records), b"x") + records + PADDING[len(records) % BLOCK]
    return pax + _ustar(split[1], split[0], size if size <= MAX_USTAR_SIZE else 0, b"0")

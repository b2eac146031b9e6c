"""Tar files built by hand, byte by byte, for tests of hostile and odd archives.

Python's ``tarfile`` will not write most of these (sparse members, broken PAX records,
global headers of any size), and a test must not depend on the reader it replaces.
"""

from __future__ import annotations

BLOCK = 512
END = bytes(2 * BLOCK)


def header(name: bytes, size: int, typeflag: bytes = b"0", fields: dict[int, bytes] | None = None) -> bytes:
    """One ustar header block; ``fields`` overwrites bytes at given offsets (GNU extras)."""
    block = bytearray(BLOCK)
    block[0 : len(name)] = name[:100]
    block[100:108] = b"0000644\0"
    block[108:116] = b"0000000\0"
    block[116:124] = b"0000000\0"
    block[124:136] = b"%011o\0" % size
    block[136:148] = b"00000000000\0"
    block[156:157] = typeflag
    block[257:265] = b"ustar\x0000"
    for offset, value in (fields or {}).items():
        block[offset : offset + len(value)] = value
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def member(name: bytes, data: bytes, typeflag: bytes = b"0") -> bytes:
    return header(name, len(data), typeflag) + padded(data)


def pax_record(key: bytes, value: bytes) -> bytes:
    body = b" " + key + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return str(length).encode() + body


def pax(records: bytes, typeflag: bytes = b"x") -> bytes:
    """A PAX extended header (``x``: the next member, ``g``: all that follow) holding ``records``."""
    return member(b"././@PaxHeader", records, typeflag)


def gnu_long_name(name: bytes) -> bytes:
    return member(b"././@LongLink", name + b"\0", b"L")


def tar(*members: bytes) -> bytes:
    return b"".join(members) + END

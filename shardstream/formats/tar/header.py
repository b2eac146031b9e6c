"""Tar header blocks (the constant ustar template the encoder fills in, PAX headers),
the member names a sample may have, and the bytes a sample takes.

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

import re
from collections.abc import Sequence
from typing import Any

from shardstream.errors import PackError, shown
from shardstream.formats.base import FileSizer, Sample
from shardstream.formats.keys import check_key_path

# How webdataset splits a member name into key and field, and the names it skips as metadata.
KEY_FIELD_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
WDS_SKIPPED_RE = re.compile(r"__[^/]*__($|/)")
_SIZE_RECIPES_MAX = 4096  # distinct field sets whose sizes take the fast path

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


def webdataset_skips(name: str) -> bool:
    """True for a member name that ``webdataset.WebDataset`` drops as metadata."""
    if "/" not in name and name.startswith("__") and name.endswith("__"):
        return True
    return WDS_SKIPPED_RE.match(name) is not None


def encode_value(value: Any, key: str, field: str, shard: str | None) -> bytes:
    """A field value as member bytes: bytes-like as is, ``str`` as UTF-8, ``int`` as its decimal text."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise PackError(
                f"sample {shown(key)} field {shown(field)}: text is not valid Unicode ({error})", shard=shard
            ) from None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    try:
        return memoryview(value).tobytes()
    except TypeError:
        raise PackError(
            f"sample {shown(key)} field {shown(field)}: a tar field must be bytes, str or int, not {type(value).__name__}",
            shard=shard,
        ) from None


def check_key(key: Any, shard: str | None) -> bytes:
    """The UTF-8 key, after checking it names members that split back to it in every reader."""
    if not isinstance(key, str) or not key:
        raise PackError(f"sample key must be a non-empty str, not {shown(key)}", shard=shard)
    check_key_path(key, shard)  # NOTE [ Safe sample keys ]
    base = key.rsplit("/", 1)[-1]
    if not base or "." in base:
        raise PackError(
            f"sample key {shown(key)} is not usable in a tar shard: its last path part must be non-empty "
            "and without '.' (the first dot starts the field name)",
            shard=shard,
        )
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PackError(f"sample key {shown(key)} is not valid Unicode ({error})", shard=shard) from None


def check_field(field: Any, key: str, shard: str | None) -> bytes | None:
    """``b"." + field`` in UTF-8, or None for a metadata field (leading ``_``) that is not written."""
    if not isinstance(field, str):
        raise PackError(f"sample {shown(key)}: field names must be str, not {shown(field)}", shard=shard)
    if field.startswith("_"):
        return None
    if not field or "/" in field or "\\" in field or "\0" in field:  # NOTE [ Safe sample keys ]
        raise PackError(
            f"sample {shown(key)}: field name {shown(field)} must be non-empty, without '/', backslash "
            "or NUL (it ends a member name, which extracting a shard reads as a path)",
            shard=shard,
        )
    try:
        return b"." + field.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PackError(
            f"sample {shown(key)}: field name {shown(field)} is not valid Unicode ({error})", shard=shard
        ) from None


def sample_members(sample: Sample, shard: str | None) -> tuple[str, bytes, list[tuple[str, bytes, bytes]]]:
    """Validate a sample (slow, general path): key, UTF-8 key, sorted ``(field, b"." + field, data)``."""
    if not isinstance(sample, dict):
        raise PackError(f"a sample must be a dict, not {type(sample).__name__}", shard=shard)
    key_b = check_key(sample.get("__key__"), shard)
    key = key_b.decode("utf-8")  # the same str, now typed
    members: list[tuple[str, bytes, bytes]] = []
    for field in _sorted_fields(sample, key, shard):
        dot_field = check_field(field, key, shard)
        if dot_field is None:
            continue
        name = (key_b + dot_field).decode("utf-8")
        if webdataset_skips(name):
            raise PackError(
                f"sample {shown(key)}: member {shown(name)} would be skipped as metadata by webdataset",
                shard=shard,
            )
        split = KEY_FIELD_RE.match(name)
        if split is None or split.group(1) != key or split.group(2) != field:
            # e.g. a newline before a dotted directory: webdataset's regex would read another key
            raise PackError(
                f"sample {shown(key)}: member {shown(name)} would not read back as this key and field",
                shard=shard,
            )
        members.append((field, dot_field, encode_value(sample[field], key, field, shard)))
    if not members:
        raise PackError(f"sample {shown(key)} has no fields; a tar sample needs at least one", shard=shard)
    return key, key_b, members


def _sorted_fields(sample: Sample, key: Any, shard: str | None) -> list:
    try:
        return sorted(sample)
    except TypeError:
        raise PackError(f"sample {shown(key)}: field names must be str", shard=shard) from None


# NOTE [ Fast tar sample sizes ]
# Cutting shards by size asks for every sample's size before it is written (``pack``
# cuts in one process and writes in others), so ``sample_size`` must be fast and exact.
# A member takes one 512-byte ustar header while its name fits the 100-byte name field
# and its size 11 octal digits, plus its data padded to whole blocks. A sample with a
# plain key (ASCII; no dot, NUL, leading "_" or trailing "/"), a field set already seen
# (so its names were validated), names that fit and bytes, str or int values is sized
# by that rule alone, cheaply. Such a sample is valid by
# construction: its member names split back into its key and fields in every reader
# (see ``sample_members``). Anything else takes the general path, which validates the
# sample and builds every header (PAX ones too). A property test checks the two agree.
# The encoder's fast path applies the same rule while it writes (``write_within``).

# field names in dict order -> (the data fields, the longest b"." + field); bounded
_SIZE_RECIPES: dict[tuple[Any, ...], tuple[tuple[str, ...], int]] = {}


def plain_key(key: object) -> bool:
    """A key the fast paths (sizing, encoding) take as it is: a non-empty ASCII str with no
    dot, NUL, backslash, leading ``_`` or ``/``, drive (``C:``) or trailing ``/``. Any other
    key takes the slow path, which validates it and names what is wrong."""
    return (
        type(key) is str
        and bool(key)
        and "." not in key
        and "\0" not in key
        and "\\" not in key
        and key[0] != "_"
        and key[0] != "/"
        and key[-1] != "/"
        and key[1:2] != ":"
        and key.isascii()
    )


def sample_size(sample: Sample, shard: str | None) -> int:
    """Bytes ``sample`` adds to a tar shard, exactly; ``PackError`` (naming ``shard``) if invalid."""
    try:
        fields, longest = _SIZE_RECIPES[tuple(sample)]
        key = sample["__key__"]
    except (KeyError, TypeError):
        return _size_and_recipe(sample, shard)
    if type(sample) is not dict or not plain_key(key) or len(key) + longest > NAME_FIELD:
        return exact_sample_size(sample, shard)
    total = 0
    for field in fields:
        value = sample[field]
        kind = type(value)
        if kind is bytes or (kind is str and value.isascii()):
            n = len(value)
        elif kind is int:
            n = len(str(value))
        else:
            return exact_sample_size(sample, shard)
        if n > MAX_USTAR_SIZE:
            return exact_sample_size(sample, shard)
        total += (n + 1023) & -512  # a header block, then the data padded to whole blocks
    return total


def _size_and_recipe(sample: Sample, shard: str | None) -> int:
    """The general path; a valid sample of plain ASCII field names leaves a recipe for the next."""
    size = exact_sample_size(sample, shard)
    if type(sample) is dict and len(_SIZE_RECIPES) < _SIZE_RECIPES_MAX:
        fields = tuple(field for field in sample if not field.startswith("_"))
        if all(field.isascii() for field in fields):
            _SIZE_RECIPES[tuple(sample)] = (fields, 1 + max(map(len, fields)))
    return size


def exact_sample_size(sample: Sample, shard: str | None) -> int:
    """``sample_size`` the slow way: validate the sample and build its headers."""
    _key, key_b, members = sample_members(sample, shard)
    total = 0
    for _field, dot_field, data in members:
        total += len(member_header(key_b + dot_field, len(data))) + ((len(data) + BLOCK - 1) & -BLOCK)
    return total


def file_sample_sizer() -> FileSizer:
    """``size(key, fields, sizes)`` of a tar sample of files not read yet, exactly: the
    same sample with empty values, plus the data padded to whole blocks. Plain ASCII
    names that fit the ustar name field (one header block per member) skip building
    that sample (NOTE [ Fast tar sample sizes ])."""
    longest: dict[tuple[str, ...], int] = {}  # field set -> longest name, or -1 if not all plain

    def size(key: str, fields: tuple[str, ...], sizes: Sequence[int]) -> int:
        name = longest.get(fields)
        if name is None:
            name = longest[fields] = max(map(len, fields)) if all(map(_plain_field, fields)) else -1
        if name >= 0 and len(key) + 1 + name <= NAME_FIELD and key.isascii():
            total = 0
            for n in sizes:
                total += (n + 1023) & -512  # a header block, then the data in whole blocks
            return total
        overhead = sample_size({"__key__": key, **dict.fromkeys(fields, b"")}, None)
        return overhead + sum(-(-n // BLOCK) * BLOCK for n in sizes)

    return size


def _plain_field(field: str) -> bool:
    """A data field whose name needs no validation beyond the folder source's own."""
    return bool(field) and field[0] != "_" and field.isascii() and "/" not in field and "\0" not in field

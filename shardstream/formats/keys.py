"""The rules shard writers apply to sample keys: a path rule for tar, NUL alone for Parquet.

# NOTE [ Safe sample keys ]
# A tar shard's member names are its samples' keys plus a field, and people extract
# shards with GNU tar or Python's tarfile. A key that is an absolute path (``/etc/x``),
# has a ``..`` part (``../../x``), or a drive (``C:x``) or backslash (Windows reads
# ``..\\x`` as a path) would make that write outside the target folder, so the tar
# writer takes none; NUL is refused too, as it ends a name in C and in the tar header.
# A field name is the rest of a member name after the key's first dot, so it may hold no
# '/', backslash or NUL either (``tar.header.check_field``). ``.`` parts (``./a/b``, as
# ``tar -C dir .`` writes) and nested keys (``a/b/c``) are fine. In a Parquet shard a
# key is a value in a column and never names a file, so Parquet refuses only NUL
# (``check_key_value``): IDs such as ``q:123`` stay as they are; repacking such a dataset
# as tar applies the tar rule then. Reading (``index``, streaming) never writes a file,
# so it takes the keys of any tar as they are.
"""

from __future__ import annotations

from shardstream.errors import PackError, shown


def key_problem(key: str) -> str | None:
    """Why ``key`` may not name a sample in a shard (see NOTE [ Safe sample keys ]), or None."""
    if "\0" in key:
        return "contains NUL"
    if key.startswith("/"):
        return "is an absolute path"
    if "\\" in key:
        return "contains a backslash, a path separator on Windows"
    if key[1:2] == ":" and key[0].isascii() and key[0].isalpha():
        return "starts with a Windows drive"
    if ".." in key and ".." in key.split("/"):
        return "has a '..' part"
    return None


def check_key_path(key: str, shard: str | None) -> None:
    """``PackError`` naming ``key`` (cut) and ``shard`` if ``key`` breaks the rule."""
    problem = key_problem(key)
    if problem is not None:
        raise PackError(unsafe_key(key, problem), shard=shard)


def check_key_value(key: str, shard: str | None) -> None:
    """``PackError`` if ``key``, a Parquet key (a value, never a path), holds NUL."""
    if "\0" in key:
        raise PackError(f"sample key {shown(key)} contains NUL, which no key may hold", shard=shard)


def unsafe_key(key: str, problem: str) -> str:
    """The message for ``key``, which breaks the rule as ``problem`` says."""
    return (
        f"sample key {shown(key)} {problem}: a key must be a relative path without '..' parts, "
        "backslashes, a drive or NUL, so that extracting a shard stays inside its folder"
    )

"""Why a URL is not a dataset: said instead of one message for every case.

``read_manifest(storage)`` is ``storage.read_manifest()``, except that a folder with no
manifest is looked at once more, at its top level only, to say which of these it is:
a path that does not exist (a typo), a bucket that does not exist, an empty folder, a
pack that has not finished (its record ``.shardstream-pack*.json`` is there), shards
another tool wrote (``shardstream index`` makes them a dataset), or files that are no
shards (a corpus still to be packed). Only that error path lists anything.
"""

from __future__ import annotations

import posixpath
from typing import Any

from shardstream.errors import NotADatasetError, StorageError, UsageError
from shardstream.folder import PACK_RECORD_RE
from shardstream.formats import available_formats
from shardstream.manifest import MANIFEST_NAME, Manifest
from shardstream.storage import Storage
from shardstream.storage.retry import is_not_found

__all__ = [
    "has_manifest",
    "missing_bucket",
    "no_destination",
    "nothing_there",
    "read_manifest",
    "why_not_a_dataset",
]


def read_manifest(storage: Storage) -> Manifest:
    """``storage``'s manifest; where it has none, a ``NotADatasetError`` saying why."""
    try:
        return storage.read_manifest()
    except NotADatasetError as error:
        raise NotADatasetError(
            f"{storage.url} is not a shardstream dataset (no {MANIFEST_NAME}): {why_not_a_dataset(storage)}",
            url=error.url,
        ) from None


def has_manifest(url: str, storage_options: dict[str, Any] | None = None) -> bool:
    """Whether ``url`` holds a manifest (is a dataset already)."""
    storage = Storage(url, storage_options)
    try:
        storage.read_manifest()
        return True
    except NotADatasetError:
        return False
    finally:
        storage.close()


def why_not_a_dataset(storage: Storage) -> str:
    """What is at ``storage``'s URL instead of a dataset, and what to do about it."""
    url = storage.url
    names = _top_level(storage)
    if names is None:
        return _nothing_there(storage)
    if any(PACK_RECORD_RE.match(name) for name in names):
        return (
            "a pack into it has not finished (its record .shardstream-pack*.json is there): "
            "run the same `shardstream pack` command again to finish it"
        )
    formats = available_formats().values()
    suffixes = tuple(fmt.suffix for fmt in formats)
    shards = [name for name in names if name.endswith(suffixes)]
    if shards:
        return (
            f"it holds {len(shards)} shard file{'s' * (len(shards) != 1)} but no manifest "
            f"(another tool wrote them, or --part packs not joined yet): run `shardstream index {url}`"
        )
    if not names:
        return "the folder is empty"
    patterns = ", ".join(f"*{suffix}" for suffix in suffixes)
    entries = "entry" if len(names) == 1 else "entries"
    return (
        f"it holds no shards ({patterns}) but {len(names)} other {entries} (a corpus to pack?): "
        f"run `shardstream pack {url} DEST` to make a dataset of it"
    )


def _top_level(storage: Storage) -> list[str] | None:
    """The names at the top of the folder; ``None`` where there is no such folder."""
    fs = storage.fs
    try:
        entries: list[Any] = fs.ls(storage.full_url(""), detail=False)
    except Exception as error:
        if isinstance(error, FileNotFoundError) or is_not_found(error):
            return None
        raise
    if not entries and not fs.isdir(storage.full_url("")):
        return None
    return [posixpath.basename(str(entry).rstrip("/")) for entry in entries]


def nothing_there(storage: Storage) -> str | None:
    """Why there is nothing at ``storage``'s URL (no such folder, no such bucket), else None."""
    return _nothing_there(storage) if _top_level(storage) is None else None


def _nothing_there(storage: Storage) -> str:
    bucket = missing_bucket(storage)
    if bucket is not None:
        return f"the bucket {bucket!r} does not exist (or these credentials cannot see it)"
    return "nothing is there (no such folder: is the path spelled right?)"


def no_destination(storage: Storage, error: StorageError) -> StorageError | UsageError:
    """What to raise when a destination cannot even be listed: its bucket named when that
    is what is missing (the listing only said "not found"), else ``error``."""
    bucket = missing_bucket(storage) if is_not_found(error) else None
    if bucket is None:
        return error
    return UsageError(
        f"the bucket {bucket!r} does not exist (or these credentials cannot see it): create it, "
        "or check the URL and the endpoint (--endpoint-url, AWS_ENDPOINT_URL)",
        url=storage.url,
    )


def missing_bucket(storage: Storage) -> str | None:
    """The bucket of an object-store URL when it does not exist, else ``None``."""
    scheme, _, rest = storage.url.partition("://")
    if not rest or scheme in ("file", "local", "memory"):
        return None
    bucket = rest.split("/", 1)[0]
    try:
        exists = storage.fs.exists(f"{scheme}://{bucket}")
    except Exception:
        return None
    return None if exists else bucket

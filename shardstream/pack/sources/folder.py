"""A folder of files grouped into samples by key, as WebDataset names tar members.

``dir/img001.jpg`` and ``dir/img001.seg.png`` make the sample with key ``dir/img001``
and fields ``jpg`` and ``seg.png``: the key is the path relative to the folder up to
the first dot of the file's base name. Files and folders whose name starts with a dot
are skipped. Samples come in order of key, fields in order of name.

The folder is listed once, with sizes, in the parent process; the files are read by
whichever process writes their shard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import fsspec

from shardstream.errors import PackError
from shardstream.formats.base import Sample, ShardFormat
from shardstream.pack.sizing import sample_sizer
from shardstream.pack.sources.base import Entry, Source, is_local, list_files

__all__ = ["FolderSource"]

# Tar members of 8 GiB and more need an extra header whose size the folder plan does not compute.
_MAX_FILE = 8 * 2**30 - 1


class FolderSource(Source):
    """Every file under a folder (recursive), grouped into samples by key."""

    name = "folder"
    lazy = True
    fallback = True

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, storage_options)
        self._entries: list[Entry] | None = None
        self._sizer: Callable[[Sample], int] | None = None
        self._sizer_format = ""

    def __getstate__(self) -> dict[str, Any]:  # workers need the configuration, not the listing
        return {"url": self.url, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["storage_options"])  # type: ignore[misc]

    @classmethod
    def detect(cls, url: str, storage_options: Mapping[str, Any], is_dir: bool) -> bool:
        return is_dir

    def entries(self) -> list[Entry]:
        if self._entries is None:
            self._entries = _group(self.url, sorted(list_files(self.url, self.storage_options)))
        return self._entries

    def scan(self, start: int = 0, stop: int | None = None) -> Iterator[Entry]:
        return iter(self.entries()[start:stop])

    def count(self) -> int:
        return len(self.entries())

    def estimate(self) -> int | None:
        return len(self.entries())

    def size(self, entry: Entry, fmt: ShardFormat) -> int:
        # The bytes of a file's member are its header (which depends on the name only,
        # below 8 GiB) plus its data, padded to whole blocks for tar.
        sizer = self._sizer
        if sizer is None or self._sizer_format != fmt.name:
            sizer = sample_sizer(fmt)
            self._sizer, self._sizer_format = sizer, fmt.name
        overhead = sizer({"__key__": entry.key, **{field: b"" for field, _, _ in entry.where}})
        block = 512 if fmt.name == "tar" else 1
        return overhead + sum(-(-size // block) * block for _, _, size in entry.where)

    def load(self, entry: Entry) -> Sample:
        sample: Sample = {"__key__": entry.key}
        local = is_local(self.url)
        for field, path, size in entry.where:
            data = _read_local(path) if local else _read_remote(path, self.storage_options)
            if len(data) != size:
                raise PackError(
                    f"file changed while packing: {size} bytes when listed, {len(data)} now", url=path
                )
            sample[field] = data
        return sample


def _group(url: str, files: list[tuple[str, str, int]]) -> list[Entry]:
    """Entries of files grouped by key, in key order; the input is sorted by relative path."""
    by_key: dict[str, list[tuple[str, str, int]]] = {}
    for rel, path, size in files:
        slash = rel.rfind("/") + 1
        dot = rel.find(".", slash)
        if dot <= slash or dot == len(rel) - 1:
            raise PackError("file name has no extension to name its field (expected KEY.EXT)", url=path)
        if size > _MAX_FILE:
            raise PackError(f"file of {size} bytes: files of 8 GiB or more are not supported", url=path)
        by_key.setdefault(rel[:dot], []).append((rel[dot + 1 :], path, size))
    entries = []
    for key in sorted(by_key):
        fields = sorted(by_key[key])
        for (field, path, _), (other, _, _) in zip(fields[1:], fields[:-1], strict=True):
            if field == other:
                raise PackError(f"sample {key!r} has two files for field {field!r}", url=path)
        entries.append(Entry(key, None, tuple(fields), url))
    return entries


def _read_local(path: str) -> bytes:
    try:
        with open(path, "rb", buffering=0) as f:
            return f.readall()
    except OSError as error:
        raise PackError(f"cannot read file: {error.strerror}", url=path) from None


def _read_remote(path: str, storage_options: Mapping[str, Any]) -> bytes:
    try:
        fs, fspath = fsspec.core.url_to_fs(path, **storage_options)
        return fs.cat_file(fspath)
    except (OSError, ValueError) as error:
        raise PackError(f"cannot read file: {error}", url=path) from None

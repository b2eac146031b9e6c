"""A folder of files grouped into samples by key, as WebDataset names tar members.

``dir/img001.jpg`` and ``dir/img001.seg.png`` make the sample with key ``dir/img001``
and fields ``jpg`` and ``seg.png``: the key is the path relative to the folder up to
the first dot of the file's base name. Files and folders whose name starts with a dot
are skipped.

Samples come in walk order: in each folder its files, sorted by name, then each of its
subfolders, sorted by name, in turn. That order is known while walking, so the pack
cuts and writes the first shards while the rest of the folder is still being listed;
the files themselves are read by whichever process writes their shard.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import fsspec

from shardstream.errors import PackError
from shardstream.formats.base import Sample, ShardFormat
from shardstream.pack.sizing import file_sample_sizer
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
        self._sizer: Callable[[str, Any], int] | None = None
        self._sizer_format = ""

    def __getstate__(self) -> dict[str, Any]:  # workers need the configuration only
        return {"url": self.url, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["storage_options"])  # type: ignore[misc]

    @classmethod
    def detect(cls, url: str, storage_options: Mapping[str, Any], is_dir: bool) -> bool:
        return is_dir

    def scan(self, start: int = 0, stop: int | None = None) -> Iterator[Entry]:
        for index, entry in enumerate(_group(self.url, _walk(self.url, self.storage_options))):
            if stop is not None and index >= stop:
                return
            if index >= start:
                yield entry

    def estimate(self) -> int | None:
        """Samples in a local folder, counted from names alone (no file is opened or stat'ed)."""
        if not is_local(self.url):
            return None
        return _count_keys(_local_root(self.url))

    def size(self, entry: Entry, fmt: ShardFormat) -> int:
        sizer = self._sizer
        if sizer is None or self._sizer_format != fmt.name:
            sizer = file_sample_sizer(fmt)
            self._sizer, self._sizer_format = sizer, fmt.name
        return sizer(entry.key, entry.where)

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


def _local_root(url: str) -> str:
    return os.path.abspath(os.path.expanduser(fsspec.core.strip_protocol(url)))


def _walk(url: str, storage_options: Mapping[str, Any]) -> Iterator[tuple[str, str, int]]:
    """(relative path, full path, size) of every file, in walk order (see the module doc)."""
    if is_local(url):
        return _walk_local(_local_root(url), "")
    # A remote folder is listed whole, then put in the same order as a local walk.
    found = sorted(
        list_files(url, storage_options), key=lambda f: (tuple(f[0].split("/")[:-1]), f[0].rsplit("/", 1)[-1])
    )
    return iter(found)


def _walk_local(directory: str, prefix: str) -> Iterator[tuple[str, str, int]]:
    try:
        with os.scandir(directory) as it:
            found = sorted((item for item in it if not item.name.startswith(".")), key=lambda item: item.name)
    except OSError as error:
        raise PackError(f"cannot list folder: {error.strerror}", url=directory) from None
    folders = []
    for item in found:
        try:
            if item.is_dir(follow_symlinks=False):
                folders.append(item)
            elif item.is_file():
                yield prefix + item.name, item.path, item.stat().st_size
            elif item.is_symlink():
                raise PackError("cannot read file: broken symbolic link", url=item.path)
        except OSError as error:
            raise PackError(f"cannot read file: {error.strerror}", url=item.path) from None
    for item in folders:
        yield from _walk_local(item.path, f"{prefix}{item.name}/")


def _count_keys(directory: str) -> int:
    count = 0
    try:
        with os.scandir(directory) as it:
            items = [item for item in it if not item.name.startswith(".")]
    except OSError:
        return 0
    keys = set()
    for item in items:
        if item.is_dir(follow_symlinks=False):
            count += _count_keys(item.path)
        else:
            keys.add(item.name.split(".", 1)[0])
    return count + len(keys)


def _group(url: str, files: Iterator[tuple[str, str, int]]) -> Iterator[Entry]:
    """Entries of consecutive files sharing a key (files of one key are adjacent in walk order)."""
    key = ""
    fields: list[tuple[str, str, int]] = []
    for rel, path, size in files:
        slash = rel.rfind("/") + 1
        dot = rel.find(".", slash)
        if dot <= slash or dot == len(rel) - 1:
            raise PackError("file name has no extension to name its field (expected KEY.EXT)", url=path)
        if size > _MAX_FILE:
            raise PackError(f"file of {size} bytes: files of 8 GiB or more are not supported", url=path)
        if rel[:dot] != key:
            if fields:
                yield Entry(key, None, tuple(fields), url)
            key, fields = rel[:dot], []
        field = rel[dot + 1 :]
        if field[0] == "_":
            raise PackError(
                f"field name {field!r} starts with '_', which marks metadata such as __key__", url=path
            )
        if fields and fields[-1][0] == field:
            raise PackError(f"sample {key!r} has two files for field {field!r}", url=path)
        fields.append((field, path, size))
    if fields:
        yield Entry(key, None, tuple(fields), url)


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

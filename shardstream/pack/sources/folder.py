"""A folder of files grouped into samples by key, as WebDataset names tar members.

``dir/img001.jpg`` and ``dir/img001.seg.png`` make the sample with key ``dir/img001``
and fields ``jpg`` and ``seg.png``: the key is the path relative to the folder up to
the first dot of the file's base name. Files and folders whose name starts with a dot
are skipped.

Only regular files are packed. A symbolic link to a regular file is followed: the
file's bytes are packed under the link's name. Anything else beside a sample's files
(a FIFO, a socket, a device, a link to a folder or a broken link) is refused with a
``PackError`` naming it, rather than left out of the sample; a FIFO is never opened
(opening one blocks until something writes to it).

Samples come in walk order: in each folder its files, sorted by name, then each of its
subfolders, sorted by name, in turn. The walk is done in chunks that any process of a
pack expands (NOTE [ Every process sizes and writes ] in ``shardstream.pack.parallel``):
a chunk of folders is listed, about two thousand of their files are sized (a ``stat``
each: most of the time cutting takes), and the rest of their files and their subfolders
become further chunks, in walk order. A sample's files are never split between chunks.
The files themselves are read by whichever process writes their shard.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

from shardstream.errors import PackError, StorageError
from shardstream.formats.base import FileSizer, Sample, ShardFormat
from shardstream.pack.sources.base import Entry, Source, input_storage, list_inputs, walk
from shardstream.storage import file_kind

# Tar members of 8 GiB and more need an extra header whose size the folder source does not compute.
_MAX_FILE = 8 * 2**30 - 1
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO put in a file's place opens without waiting
_STAT_DIR_FD = os.stat in os.supports_dir_fd  # Unix: a file stat'ed relative to its folder
_CHUNK_FILES = 2048  # files sized by one task (a short task of stat calls)
_CHUNK_FOLDERS = 8  # folders listed by one task

# Chunks of the walk are ("files", pieces) or ("folders", ((folder, key prefix), ...)).
# A piece is a folder (a local path, or the remote folder's URL), the key prefix of its
# files, their names relative to it, and their sizes if the listing gave them.
Piece = tuple[str, str, tuple[str, ...], tuple[int, ...] | None]
Chunk = tuple[str, tuple[Any, ...]]


class FolderSource(Source):
    """Every file under a folder (recursive), grouped into samples by key.

    An entry's ``where`` is ``(fields, sizes)``: a file's path is the folder, the key and
    the field (``<folder>/<key>.<field>``), so a shard's entries stay small when they are
    sent to a worker process.
    """

    name = "folder"
    lazy = True
    fallback = True

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, storage_options)
        self._sizer: FileSizer | None = None
        self._sizer_format = ""
        # Read-only, so retries and timeouts apply to remote files (NOTE [ One retry layer ]).
        self._storage = input_storage(url, self.storage_options)
        root = self._storage.local_root
        self._local = root is not None
        self._base = root if root is not None else self._storage.url

    def __getstate__(self) -> dict[str, Any]:  # workers need the configuration only
        return {"url": self.url, "storage_options": self.storage_options, "base": self._base}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["storage_options"])  # type: ignore[misc]
        self._base = state["base"]

    @classmethod
    def detect(cls, url: str, storage_options: Mapping[str, Any], is_dir: bool) -> bool:
        return is_dir

    def scan(self, start: int = 0, stop: int | None = None) -> Iterator[Entry]:
        return islice(walk(self), start, stop)

    def chunks(self) -> Iterator[Chunk]:
        if self._local:
            return iter([("folders", ((self._base, ""),))])
        names, sizes = _remote_files(self.url, self.storage_options)
        return (("files", (piece,)) for piece in _split(self._base, "", names, sizes))

    def expand(self, chunk: Chunk) -> list[list[Entry] | Chunk]:
        kind, items = chunk
        if kind == "files":
            return [self._entries(items)]
        parts: list[list[Entry] | Chunk] = []
        here: list[Piece] = []  # the files this task sizes, up to _CHUNK_FILES of them
        room = _CHUNK_FILES
        for folder, prefix in items:
            names, subfolders = _list_local(folder)
            for piece in _split(folder, prefix, names, None, first=room):
                if room > 0:
                    here.append(piece)
                    room -= len(piece[2])
                    continue
                if here:
                    parts.append(self._entries(here))
                    here = []
                parts.append(("files", (piece,)))
            if subfolders:
                if here:
                    parts.append(self._entries(here))
                    here = []
                inside = [(f"{folder}/{name}", f"{prefix}{name}/") for name in subfolders]
                parts += [
                    ("folders", tuple(inside[i : i + _CHUNK_FOLDERS]))
                    for i in range(0, len(inside), _CHUNK_FOLDERS)
                ]
        if here:
            parts.append(self._entries(here))
        return parts

    def _entries(self, pieces: Iterable[Piece]) -> list[Entry]:
        entries: list[Entry] = []
        for folder, prefix, names, listed in pieces:
            sizes = listed if listed is not None else _stat_sizes(folder, names)
            entries += _group(self.url, f"{folder}/", zip(names, sizes, strict=True), prefix)
        return entries

    def estimate(self) -> int | None:
        """Samples in a local folder, counted from names alone (no file is opened or stat'ed)."""
        if not self._local:
            return None
        return _count_keys(self._base)

    def size(self, entry: Entry, fmt: ShardFormat) -> int:
        sizer = self._sizer
        if sizer is None or self._sizer_format != fmt.name:
            sizer = fmt.file_sizer()
            self._sizer, self._sizer_format = sizer, fmt.name
        return sizer(entry.key, *entry.where)  # where: (fields, file sizes)

    def entry_url(self, entry: Entry, field: str | None = None) -> str:
        fields = entry.where[0]
        return f"{self._base}/{entry.key}.{field if field in fields else fields[0]}"

    def load(self, entry: Entry) -> Sample:
        key = entry.key
        sample: Sample = {"__key__": key}
        for field, size in zip(*entry.where, strict=True):
            if self._local:
                sample[field] = _read_local(f"{self._base}/{key}.{field}", size)
            else:
                sample[field] = self._read_remote(f"{key}.{field}", size)
        return sample

    def _read_remote(self, rel: str, size: int) -> bytes:
        try:
            data = self._storage.read(rel)
        except StorageError as error:
            raise PackError(f"cannot read file: {error.message}", url=self._storage.full_url(rel)) from None
        if len(data) != size:
            raise _changed(self._storage.full_url(rel), size, len(data))
        return data


def _remote_files(url: str, storage_options: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Paths relative to the folder, in walk order, and their sizes (the listing gives them)."""
    found = [(rel, size) for rel, _, size in list_inputs(url, storage_options)]
    # A remote folder is listed whole, then put in the same order as a local walk.
    found.sort(key=lambda f: (tuple(f[0].split("/")[:-1]), f[0].rsplit("/", 1)[-1]))
    return tuple(rel for rel, _ in found), tuple(size for _, size in found)


def _list_local(folder: str) -> tuple[tuple[str, ...], list[str]]:
    """The names of a folder's files and of its subfolders, sorted, dot-names skipped.

    Only the listing is read: the kind of each entry comes with its name, so no file is
    stat'ed here but symbolic links (to tell a link to a file from a broken one) and
    whatever is neither a file nor a folder, which is refused.
    """
    files = []
    folders = []
    try:
        with os.scandir(folder) as it:
            for item in it:
                name = item.name
                if name[0] == ".":
                    continue
                try:
                    if item.is_file():
                        files.append(name)
                    elif item.is_dir(follow_symlinks=False):
                        folders.append(name)
                    else:
                        raise _not_regular(item.path)
                except OSError as error:
                    raise PackError(f"cannot read file: {error.strerror}", url=f"{folder}/{name}") from None
    except OSError as error:
        raise PackError(f"cannot list folder: {error.strerror}", url=folder) from None
    files.sort()
    folders.sort()
    return tuple(files), folders


def _split(
    folder: str, prefix: str, names: tuple[str, ...], sizes: tuple[int, ...] | None, first: int = _CHUNK_FILES
) -> Iterator[Piece]:
    """A folder's files in pieces: the first of about ``first`` files (if positive), the
    others of about ``_CHUNK_FILES``; a sample's files stay together."""
    start = 0
    want = first if first > 0 else _CHUNK_FILES
    while start < len(names):
        end = _key_boundary(names, start + want)
        yield folder, prefix, names[start:end], sizes[start:end] if sizes is not None else None
        start, want = end, _CHUNK_FILES


def _key_boundary(names: Sequence[str], position: int) -> int:
    """The first position from ``position`` on where a new key starts (files of a key are adjacent)."""
    if position >= len(names):
        return len(names)
    last = _stem(names[position - 1])
    while position < len(names) and _stem(names[position]) == last:
        position += 1
    return position


def _stem(path: str) -> str:
    slash = path.rfind("/") + 1
    dot = path.find(".", slash)
    return path[:dot] if dot > slash else path


def _stat_sizes(folder: str, names: Sequence[str]) -> list[int]:
    """The sizes of files in ``folder`` (symbolic links followed), each stat'ed relative to it."""
    if not _STAT_DIR_FD:
        return [_stat_size(f"{folder}/{name}") for name in names]
    try:
        fd = os.open(folder, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except OSError as error:
        raise PackError(f"cannot list folder: {error.strerror}", url=folder) from None
    try:
        sizes = []
        for name in names:
            found = os.stat(name, dir_fd=fd)
            if not stat.S_ISREG(found.st_mode):  # replaced since it was listed
                raise _not_regular(f"{folder}/{name}")
            sizes.append(found.st_size)
        return sizes
    except OSError as error:  # its filename is the name given to stat
        raise PackError(f"cannot read file: {error.strerror}", url=f"{folder}/{error.filename}") from None
    finally:
        os.close(fd)


def _stat_size(path: str) -> int:
    try:
        found = os.stat(path)
    except OSError as error:
        raise PackError(f"cannot read file: {error.strerror}", url=path) from None
    if not stat.S_ISREG(found.st_mode):
        raise _not_regular(path)
    return found.st_size


def _not_regular(path: str) -> PackError:
    # Refused, not skipped: a sample would silently lose the field (and a FIFO is never opened).
    return PackError(f"cannot read file: {_kind(path)}, not a regular file", url=path)


def _kind(path: str) -> str:
    """What ``path`` is, in words, for a file that is not a regular one (nothing is opened)."""
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            try:
                target = os.stat(path).st_mode
            except OSError:
                return "a broken symbolic link"
            unfollowed = " (links to folders are not followed)" if stat.S_ISDIR(target) else ""
            return f"a symbolic link to {file_kind(target)}{unfollowed}"
    except OSError as error:
        return f"a file that cannot be read ({error.strerror})"
    return file_kind(mode)


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


def _group(url: str, base: str, files: Iterable[tuple[str, int]], prefix: str = "") -> Iterator[Entry]:
    """Entries of consecutive files sharing a key (files of one key are adjacent in walk order).

    ``files`` are (path relative to ``base``, size); keys are ``prefix`` + the path up to
    the first dot of its last part. An entry's ``where`` is ``(fields, sizes)``, with one
    tuple object per field set (smaller pickles, and one size recipe per field set).
    """
    stem = ""
    fields: list[str] = []
    sizes: list[int] = []
    shapes: dict[tuple[str, ...], tuple[str, ...]] = {}
    for rel, size in files:
        dot = rel.find(".", rel.rfind("/") + 1)
        if dot <= rel.rfind("/") + 1 or dot == len(rel) - 1:
            raise PackError("file name has no extension to name its field (expected KEY.EXT)", url=base + rel)
        if size > _MAX_FILE:
            raise PackError(f"file of {size} bytes: files of 8 GiB or more are not supported", url=base + rel)
        field = rel[dot + 1 :]
        if rel[:dot] != stem:
            if fields:
                yield Entry(prefix + stem, None, (_shape(shapes, fields), tuple(sizes)), url)
            stem, fields, sizes = rel[:dot], [], []
        elif fields[-1] == field:
            raise PackError(f"sample {prefix + stem!r} has two files for field {field!r}", url=base + rel)
        if field[0] == "_":
            raise PackError(
                f"field name {field!r} starts with '_', which marks metadata such as __key__", url=base + rel
            )
        fields.append(field)
        sizes.append(size)
    if fields:
        yield Entry(prefix + stem, None, (_shape(shapes, fields), tuple(sizes)), url)


def _shape(shapes: dict[tuple[str, ...], tuple[str, ...]], fields: list[str]) -> tuple[str, ...]:
    shape = tuple(fields)
    return shapes.setdefault(shape, shape)


# NOTE [ Large reads and the allocator ]
# glibc serves a malloc of M_MMAP_THRESHOLD bytes or more (128 KiB at first) with a fresh
# mmap: every page faulted in and zeroed, then unmapped on free. Reading 1 MB files into
# new bytes objects takes that path for every file (a page fault per 4 KiB, a large share
# of a pack's time). glibc raises the threshold to the size of any mmapped block that is freed (up to
# 32 MiB; see mallopt(3)), so freeing one block a little larger than the files before
# reading them makes their buffers come from the heap, where freed ones are reused. Other
# allocators ignore this; ``bytes(n)`` uses calloc, which touches no page of a new mmap.
_MMAP_THRESHOLD_MAX = 32 << 20
_primed = [128 << 10]  # the largest block freed so far by _prime_allocator (per process)


def _prime_allocator(size: int) -> None:
    block = min(2 * size + (1 << 20), _MMAP_THRESHOLD_MAX)
    if block > _primed[0]:
        bytes(block)  # allocated and freed at once
        _primed[0] = block


def _read_local(path: str, size: int) -> bytes:
    """The file's bytes: one open, one read (its size is known from the listing), one close."""
    if size >= _primed[0]:
        _prime_allocator(size)  # see NOTE [ Large reads and the allocator ]
    try:
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NONBLOCK)
        try:
            data = os.read(fd, size + 1)  # one byte more than listed shows a file that grew
            while len(data) < size:  # a short read (or a file that shrank: then read returns b"")
                more = os.read(fd, size + 1 - len(data))
                if not more:
                    break
                data += more
        finally:
            os.close(fd)
    except OSError as error:
        raise PackError(f"cannot read file: {error.strerror}", url=path) from None
    if len(data) != size:
        raise _changed(path, size, len(data))
    return data


def _changed(path: str, listed: int, now: int) -> PackError:
    return PackError(
        f"file changed while packing: {listed} bytes when listed, {now if now <= listed else 'more'} now",
        url=path,
    )

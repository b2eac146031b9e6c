"""Existing tar shards (WebDataset's, GNU tar's, ours), repacked: one sample per key.

Members are grouped as ``webdataset`` groups them: consecutive members whose names
share the key (the name up to the first dot of its base name) form a sample. Folders
and other non-file members are skipped. ``.tar.gz`` and ``.tgz`` are read too.

Tars are read with shardstream's own bounded scanner, never with ``tarfile``: see
NOTE [ Bounded tar reading ] in ``shardstream.formats.tar.members``.
"""

from __future__ import annotations

import gzip
import lzma
import zlib
from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from typing import IO, Any, cast

from shardstream.errors import FormatError, PackError, shown
from shardstream.formats.base import Sample
from shardstream.formats.keys import key_problem, unsafe_key
from shardstream.formats.tar.header import KEY_FIELD_RE, MAX_USTAR_SIZE
from shardstream.formats.tar.members import TarMember, metadata_field, tar_members
from shardstream.pack.sources.base import (
    COMPRESSION_SUFFIXES,
    Entry,
    Source,
    folder_of,
    has_suffix,
    open_input,
    source_files,
)

_SUFFIXES = (".tar", ".tgz")


class TarSource(Source):
    """A tar file or a folder holding only tar files (``.tar``, ``.tar.gz``, ``.tgz``)."""

    name = "tar"

    @classmethod
    def detect(cls, url: str, storage_options: Mapping[str, Any], is_dir: bool) -> bool:
        if not is_dir:
            return has_suffix(url, _SUFFIXES)
        return folder_of(url, storage_options, _SUFFIXES)

    def scan(self, start: int = 0, stop: int | None = None) -> Iterator[Entry]:
        number = 0
        for path in source_files(self.url, self.storage_options, _SUFFIXES):
            for sample in _samples(path, self.storage_options):
                if stop is not None and number >= stop:
                    return
                if number >= start:
                    yield Entry(sample["__key__"], sample, None, path)
                number += 1


def _samples(path: str, storage_options: Mapping[str, Any]) -> Iterator[Sample]:
    """The samples of one tar file, in order."""
    sample: Sample | None = None
    for member in _members(path, storage_options):
        key, field = _key_and_field(member, path)
        if sample is not None and sample["__key__"] != key:
            yield sample
            sample = None
        if sample is None:
            sample = {"__key__": key}
        elif field in sample:
            raise PackError(
                f"sample {shown(key)} has two members for field {shown(field)}", url=path, offset=member.start
            )
        sample[field] = member.data
    if sample is not None:
        yield sample


def _key_and_field(member: TarMember, path: str) -> tuple[str, str]:
    """The sample key and field a member names; ``PackError`` if it names none, or an unsafe one."""
    name = member.name
    match = KEY_FIELD_RE.match(name)  # the rule ``index`` splits member names by
    if match is None:
        raise PackError(
            f"member {shown(name)} has no extension to name its field", url=path, offset=member.start
        )
    key, field = match.group(1), match.group(2)
    if field.startswith("_"):
        raise PackError(metadata_field(name, field), url=path, offset=member.start)
    problem = key_problem(key)
    if problem is not None:
        raise PackError(unsafe_key(key, problem), url=path, offset=member.start)
    return key, field


def _members(path: str, storage_options: Mapping[str, Any]) -> Iterator[TarMember]:
    name = path.rstrip("/").rsplit("/", 1)[-1].lower()
    gzipped = name.endswith(".tgz")  # fsspec infers .gz, .bz2, .xz, ... but not .tgz
    compressed = gzipped or name.endswith(COMPRESSION_SUFFIXES)
    with open_input(path, storage_options) as raw, _gunzip(raw) if gzipped else nullcontext(raw) as f:
        try:
            # members of 8 GiB or more are refused on their header, before their data fills memory
            yield from tar_members(f, path, sized=not compressed, max_size=MAX_USTAR_SIZE)
        except FormatError as error:
            raise PackError(error.message, url=path, offset=error.offset) from None
        except (OSError, EOFError, zlib.error, lzma.LZMAError) as error:  # a corrupt compressed stream
            raise PackError(f"cannot read tar file: {error}", url=path) from None


def _gunzip(raw: IO[bytes]) -> IO[bytes]:
    return cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb"))

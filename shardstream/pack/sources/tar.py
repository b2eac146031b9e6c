"""Existing tar shards (WebDataset's, GNU tar's, ours), repacked: one sample per key.

Members are grouped as ``webdataset`` groups them: consecutive members whose names
share the key (the name up to the first dot of its base name) form a sample. Folders
and other non-file members are skipped. ``.tar.gz`` and ``.tgz`` are read too.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator, Mapping
from typing import Any

from shardstream.errors import PackError
from shardstream.formats.base import Sample
from shardstream.pack.sources.base import Entry, Source, folder_of, has_suffix, open_file, source_files

__all__ = ["TarSource"]

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
        index = 0
        for path in source_files(self.url, self.storage_options, _SUFFIXES):
            for sample in _samples(path, self.storage_options):
                if stop is not None and index >= stop:
                    return
                if index >= start:
                    yield Entry(sample["__key__"], sample, None, path)
                index += 1


def _samples(path: str, storage_options: Mapping[str, Any]) -> Iterator[Sample]:
    """The samples of one tar file, in order."""
    with open_file(path, storage_options) as f:
        try:
            archive = tarfile.open(fileobj=f, mode="r|*")  # noqa: SIM115 (closed by the with below)
        except tarfile.TarError as error:
            raise PackError(f"not a readable tar file: {error}", url=path) from None
        sample: Sample | None = None
        with archive:
            for member, data in _members(archive, path):
                slash = member.name.rfind("/") + 1
                dot = member.name.find(".", slash)
                if dot <= slash:
                    raise PackError(
                        f"member {member.name!r} has no extension to name its field",
                        url=path,
                        offset=member.offset,
                    )
                key, field = member.name[:dot], member.name[dot + 1 :]
                if sample is not None and sample["__key__"] != key:
                    yield sample
                    sample = None
                if sample is None:
                    sample = {"__key__": key}
                elif field in sample:
                    raise PackError(
                        f"sample {key!r} has two members for field {field!r}", url=path, offset=member.offset
                    )
                sample[field] = data
        if sample is not None:
            yield sample


def _members(archive: tarfile.TarFile, path: str) -> Iterator[tuple[tarfile.TarInfo, bytes]]:
    try:
        for member in archive:
            if not member.isfile():
                continue
            reader = archive.extractfile(member)
            data = reader.read() if reader is not None else b""
            if len(data) != member.size:
                raise PackError(f"member {member.name!r} is truncated", url=path, offset=member.offset)
            yield member, data
    except (tarfile.TarError, EOFError, OSError) as error:
        raise PackError(f"corrupt tar file: {error}", url=path) from None

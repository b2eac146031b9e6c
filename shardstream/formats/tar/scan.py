"""Index a tar shard in one sequential pass over its headers (NOTE [ Bounded tar reading ]
in ``members``): members grouped into samples the way ``webdataset`` groups them."""

from __future__ import annotations

from typing import IO

from shardstream.errors import FormatError, shown
from shardstream.formats.tar.header import BLOCK
from shardstream.formats.tar.index import TarIndex
from shardstream.formats.tar.members import MemberReader, TarMember, metadata_field, read_members
from shardstream.formats.tar.write import KEY_FIELD_RE, webdataset_skips


class _Grouper:
    """Members to samples the way ``webdataset`` groups them: consecutive members sharing a key."""

    def __init__(self, reader: MemberReader) -> None:
        self.reader = reader
        self.keys: list[str] = []
        self.sample_start: list[int] = []
        self.member_first: list[int] = [0]
        self.member_field: list[int] = []
        self.member_offset: list[int] = []
        self.member_size: list[int] = []
        self.fields: list[str] = []
        self.field_ids: dict[str, int] = {}
        self.current: set[str] = set()

    def add(self, member: TarMember) -> None:
        name = member.name
        if webdataset_skips(name):
            return
        match = KEY_FIELD_RE.match(name)
        if match is None:
            return
        key, field = match.group(1), match.group(2)
        if field.startswith("_"):
            raise self.reader.error(metadata_field(name, field), member.start)
        if not self.keys or key != self.keys[-1]:
            if self.keys:
                self.member_first.append(len(self.member_offset))
            self.keys.append(key)
            self.sample_start.append(member.start)
            self.current = set()
        elif field in self.current:
            raise self.reader.error(f"sample {shown(key)} has field {shown(field)} twice", member.start)
        self.current.add(field)
        fid = self.field_ids.get(field)
        if fid is None:
            fid = self.field_ids[field] = len(self.fields)
            self.fields.append(field)
        self.member_field.append(fid)
        self.member_offset.append(member.data_offset)
        self.member_size.append(member.size)

    def index(self, archive_end: int) -> TarIndex:
        if self.keys:
            self.member_first.append(len(self.member_offset))
        return TarIndex.from_lists(
            name=self.reader.name,
            keys=self.keys,
            sample_start=self.sample_start,
            member_first=self.member_first,
            fields=self.fields,
            member_field=self.member_field,
            member_offset=self.member_offset,
            member_size=self.member_size,
            archive_end=archive_end,
        )


def check_fields(index: TarIndex) -> None:
    """``FormatError`` if a sidecar (one written before the index refused them) has a metadata field."""
    if not any(field.startswith("_") for field in index.field_names):  # the names alone: cheap, per load
        return
    for field in index.fields:  # those members use
        if field.startswith("_"):
            raise FormatError(
                f"tar sample index has field {shown(field)}: a field starting with '_' is sample metadata "
                "(such as __key__) and would replace it; index the shard again",
                shard=index.name,
            )


def scan_tar(fileobj: IO[bytes], name: str) -> TarIndex:
    """The index of the tar in ``fileobj``, read from its current position to its end marker."""
    reader = MemberReader(fileobj, name, True)
    grouper = _Grouper(reader)
    for member in read_members(reader, False):
        grouper.add(member)
    return grouper.index(reader.pos - BLOCK)

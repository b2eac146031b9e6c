"""CSV (or TSV): a header row naming the fields, then one sample per row.

A ``__key__`` column names the samples; without one a sample is named by its number
(``000000042``). Values are text; empty rows are skipped. A row whose number of cells
differs from the header's is an error naming its line.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Mapping
from typing import Any

from shardstream.errors import PackError
from shardstream.pack.sources.base import Entry, Source, has_suffix, open_input, sample_key

# Fields larger than csv's default limit (128 KiB) are ordinary in corpora of documents.
_FIELD_LIMIT = 2**31 - 1


class CsvSource(Source):
    """A CSV file (``.csv``; ``.tsv`` is tab-separated; compressed too), UTF-8."""

    name = "csv"

    @classmethod
    def detect(cls, url: str, storage_options: Mapping[str, Any], is_dir: bool) -> bool:
        return not is_dir and has_suffix(url, (".csv", ".tsv"))

    def _rows(self) -> Iterator[tuple[int, list[str], list[str]]]:
        """(line, header, row) of every non-empty row after the header."""
        csv.field_size_limit(_FIELD_LIMIT)
        delimiter = "\t" if has_suffix(self.url, (".tsv",)) else ","
        with open_input(self.url, self.storage_options) as raw:
            counted = _NewlineCounter(raw)
            text = io.TextIOWrapper(counted, encoding="utf-8-sig", newline="")
            reader = csv.reader(text, delimiter=delimiter, strict=True)
            try:
                header = self._header(reader)
                for row in reader:
                    if row:
                        yield reader.line_num, header, row
            except csv.Error as error:
                raise PackError(f"invalid CSV: {error}", url=self.url, line=reader.line_num) from None
            except UnicodeDecodeError as error:
                raise PackError(
                    f"not UTF-8 text: {error.reason}", url=self.url, line=counted.line_of(error)
                ) from None
            except OSError as error:
                raise PackError(f"cannot read source file: {error}", url=self.url) from None

    def _header(self, reader: Any) -> list[str]:
        header = next(reader, None)
        if not header:
            raise PackError("CSV file has no header row", url=self.url, line=1)
        seen = set()
        for name in header:
            if not name or name in seen:
                problem = "an empty column name" if not name else f"column {name!r} twice"
                raise PackError(f"CSV header has {problem}", url=self.url, line=1)
            seen.add(name)
        return header

    def scan(self, start: int = 0, stop: int | None = None) -> Iterator[Entry]:
        url = self.url
        for number, (line, header, row) in enumerate(self._rows()):
            if number < start:
                continue
            if stop is not None and number >= stop:
                break
            if len(row) != len(header):
                raise PackError(f"row has {len(row)} cells, the header has {len(header)}", url=url, line=line)
            sample: dict[str, Any] = dict(zip(header, row, strict=True))
            key = sample.pop("__key__", None) or sample_key(number)
            sample["__key__"] = key
            yield Entry(key, sample, None, url, line)

    def count(self) -> int:
        return sum(1 for _ in self._rows())


class _NewlineCounter(io.BufferedIOBase):
    """A binary stream that counts the newlines of the chunks read through it.

    The text layer decodes a chunk (8 KiB or more) at a time, ahead of the rows the
    reader has parsed, so the reader's line number is not where a decoding error is;
    the count of newlines before the failing byte is.
    """

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._last = b""  # the chunk read last: the one being decoded when decoding fails
        self._before = 0  # newlines in the chunks before it

    @property
    def name(self) -> Any:
        return getattr(self._raw, "name", "")

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1, /) -> bytes:
        data: bytes = self._raw.read(-1 if size is None else size)
        self._before += self._last.count(b"\n")
        self._last = data
        return data

    def read1(self, size: int = -1, /) -> bytes:
        return self.read(size)

    def line_of(self, error: UnicodeDecodeError) -> int:
        """The line (from 1) of the byte that did not decode, in the chunk read last.

        The decoder may hold a few bytes of an unfinished character from the chunk before
        (never a newline), ahead of this chunk in ``error.object``.
        """
        held = len(error.object) - len(self._last)
        return self._before + self._last[: max(error.start - held, 0)].count(b"\n") + 1

"""JSON Lines: one JSON object per line, one sample per object.

The object's ``__key__`` (a string) names the sample; without one the sample is named
by its number in the file (``000000042``). Blank lines are skipped. Other members are
the fields; for tar shards non-text values become JSON (see ``tar_ready``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

from shardstream.errors import PackError
from shardstream.pack.sources.base import Entry, Source, has_suffix, open_input, sample_key

_SUFFIXES = (".jsonl", ".ndjson", ".json")
_COUNTED = 64 * 2**20  # bytes of a file whose lines the progress bar's total counts (beyond: extrapolated)


class JsonlSource(Source):
    """A JSON Lines file (``.jsonl``, ``.ndjson``, ``.json``; compressed too)."""

    name = "jsonl"

    @classmethod
    def detect(cls, url: str, storage_options: Mapping[str, Any], is_dir: bool) -> bool:
        return not is_dir and has_suffix(url, _SUFFIXES)

    def _lines(self) -> Iterator[tuple[int, bytes]]:
        """(line number, line) of every non-blank line."""
        with open_input(self.url, self.storage_options) as f:
            try:
                for number, line in enumerate(f, 1):
                    if line.strip():
                        yield number, line
            except OSError as error:
                raise PackError(f"cannot read source file: {error}", url=self.url) from None

    def scan(self, start: int = 0, stop: int | None = None) -> Iterator[Entry]:
        url = self.url
        for number, (line_number, line) in enumerate(self._lines()):
            if number < start:
                continue
            if stop is not None and number >= stop:
                break
            try:
                sample = json.loads(line)
            except ValueError as error:
                raise PackError(f"invalid JSON: {_reason(error)}", url=url, line=line_number) from None
            except RecursionError:  # json's decoder recurses once per level of nesting
                raise PackError(
                    "JSON nested too deeply (arrays and objects hundreds of levels deep)",
                    url=url,
                    line=line_number,
                ) from None
            if type(sample) is not dict:
                raise PackError(
                    f"a line must hold a JSON object, not {type(sample).__name__}", url=url, line=line_number
                )
            key = sample.pop("__key__", None)
            if key is None:
                key = sample_key(number)
            elif type(key) is not str:
                raise PackError(f"__key__ must be a string, not {key!r}", url=url, line=line_number)
            sample["__key__"] = key
            yield Entry(key, sample, None, url, line_number)

    def count(self) -> int:
        return sum(1 for _ in self._lines())

    def estimate(self) -> int | None:
        """Lines of a local, uncompressed file, for the progress bar: counted where the file
        is small, else extrapolated from its first lines (no JSON is parsed either way)."""
        if not self.url.endswith(_SUFFIXES) or not os.path.isfile(self.url):
            return None
        size = os.path.getsize(self.url)
        with open(self.url, "rb") as f:
            head = f.read(_COUNTED)
        lines = head.count(b"\n") + (1 if head and not head.endswith(b"\n") else 0)
        if size <= len(head) or not lines:
            return lines
        return round(lines * size / len(head))


def _reason(error: ValueError) -> str:
    if isinstance(error, json.JSONDecodeError):
        return f"{error.msg} at column {error.colno}"
    return str(error)

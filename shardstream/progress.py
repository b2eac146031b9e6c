"""The command line's progress bar (tqdm): percent and time left where the size is known.

Drawn on stderr only when it is a terminal (and not ``--quiet``), a few times a second;
``summary()`` is the one line printed at the end either way. Log records of shardstream
(a warning of the pack) go through ``messages()`` above the bar, each on its own line,
never onto it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import TextIO

from tqdm import tqdm

_REDRAW_SECONDS = 0.2
_WITH_TOTAL = (
    "{desc}: {percentage:3.0f}%|{bar:24}| {n_fmt}/{total_fmt} samples{postfix} [{elapsed}<{remaining}]"
)
_WITHOUT_TOTAL = "{desc}: {n_fmt} samples{postfix} [{elapsed}]"


def human_bytes(n: float) -> str:
    """``1234567`` -> ``"1.2 MB"`` (SI units, as ``--shard-size`` reads them)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"  # unreachable; keeps type checkers content


def human_duration(seconds: float) -> str:
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def plural(count: int, word: str, many: str | None = None) -> str:
    """``plural(1, "shard")`` -> ``"1 shard"``, ``plural(3, "shard")`` -> ``"3 shards"``."""
    return f"{count:,} {word if count == 1 else many or word + 's'}"


class ProgressBar:
    """Counts samples and bytes; draws a tqdm bar when ``enabled`` (default: stderr is a TTY).

    The CLI's display of a ``PackProgress`` (``shardstream.pack.api``), the protocol
    ``pack`` reports progress to; ``reused`` is told how many shards a rerun kept.
    """

    def __init__(
        self,
        label: str = "pack",
        *,
        total: int | None = None,
        stream: TextIO | None = None,
        enabled: bool | None = None,
    ) -> None:
        self.label = label
        self.total = total
        self.samples = 0
        self.nbytes = 0
        self.shards_reused = 0
        self.shards = 0
        self._stream = stream if stream is not None else sys.stderr
        self.enabled = _is_tty(self._stream) if enabled is None else enabled
        self._start = time.monotonic()
        self._bar: tqdm | None = None

    def set_total(self, samples: int | None) -> None:
        self.total = samples
        if self._bar is not None:
            self._bar.total = samples
            self._bar.bar_format = _WITH_TOTAL if samples else _WITHOUT_TOTAL

    def update(self, samples: int, nbytes: int) -> None:
        self.samples += samples
        self.nbytes += nbytes
        if not self.enabled:
            return
        bar = self._drawn()
        elapsed = self.elapsed
        rate = self.nbytes / elapsed if elapsed > 0 else 0.0
        bar.set_postfix_str(f"{human_bytes(self.nbytes)}, {human_bytes(rate)}/s", refresh=False)
        bar.update(samples)
        if self.total is not None and self.samples >= self.total:
            bar.refresh()

    def reused(self, shards: int, of: int) -> None:
        """A rerun of a pack kept ``shards`` of its ``of`` shards from the run before."""
        self.shards_reused, self.shards = shards, of

    def _drawn(self) -> tqdm:
        if self._bar is None:
            self._bar = tqdm(
                total=self.total or None,
                desc=self.label,
                file=self._stream,
                mininterval=_REDRAW_SECONDS,
                leave=False,
                bar_format=_WITH_TOTAL if self.total else _WITHOUT_TOTAL,
                dynamic_ncols=True,
            )
        return self._bar

    def write(self, text: str) -> None:
        """A line above the bar (the bar is redrawn under it); plain text when none is drawn."""
        if self._bar is not None:
            self._bar.write(text, file=self._stream)
        else:
            print(text, file=self._stream, flush=True)

    @contextlib.contextmanager
    def messages(self, logger: str = "shardstream") -> Iterator[None]:
        """Within it, ``logger``'s records are written above the bar, one line each."""
        handler = _AboveTheBar(self)
        log = logging.getLogger(logger)
        log.addHandler(handler)
        try:
            yield
        finally:
            log.removeHandler(handler)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def close(self) -> None:
        """Clear the bar (the caller prints a summary)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def summary(self, what: str = "") -> str:
        """One line: what was done, how much, how fast, and what a rerun reused."""
        elapsed = self.elapsed
        rate = self.nbytes / elapsed if elapsed > 0 else 0.0
        per_second = self.samples / elapsed if elapsed > 0 else 0.0
        done = f"{self.label}: {plural(self.samples, 'sample')}, {human_bytes(self.nbytes)}"
        line = (
            f"{done}{' ' + what if what else ''} in {elapsed:.1f} s "
            f"({human_bytes(rate)}/s, {per_second:,.0f} samples/s)"
        )
        if self.shards_reused:
            line += (
                f"; resumed: {self.shards_reused:,} of {plural(self.shards, 'shard')} kept from the run "
                "before, checked, not written again"
            )
        return line


Progress = ProgressBar  # its earlier name; kept importable


class _AboveTheBar(logging.Handler):
    def __init__(self, bar: ProgressBar) -> None:
        super().__init__(logging.INFO)
        self._bar = bar

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._bar.write(record.getMessage())
        except Exception:
            self.handleError(record)


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False

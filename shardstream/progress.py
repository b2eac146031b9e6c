"""A tiny progress bar for the command line: samples, bytes, MB/s and ETA on one line.

Drawn on stderr only when it is a terminal (and not ``--quiet``), at most a few times
a second; ``summary()`` is the one line printed at the end either way.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress", "ProgressBar", "human_bytes", "human_duration"]

_REDRAW_SECONDS = 0.2
_BAR_WIDTH = 24


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


class ProgressBar:
    """Counts samples and bytes; draws a bar when ``enabled`` (default: stderr is a TTY).

    The CLI's display of a ``PackProgress`` (``shardstream.pack.api``), the protocol
    ``pack`` reports progress to.
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
        self._stream = stream if stream is not None else sys.stderr
        self.enabled = _is_tty(self._stream) if enabled is None else enabled
        self._start = time.monotonic()
        self._drawn = 0.0
        self._width = 0

    def set_total(self, samples: int | None) -> None:
        self.total = samples

    def update(self, samples: int, nbytes: int) -> None:
        self.samples += samples
        self.nbytes += nbytes
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._drawn >= _REDRAW_SECONDS or (self.total is not None and self.samples >= self.total):
            self._drawn = now
            self._draw(self.line(now - self._start))

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def line(self, elapsed: float) -> str:
        """The bar's text after ``elapsed`` seconds."""
        rate = self.nbytes / elapsed if elapsed > 0 else 0.0
        counts = f"{self.samples:,} samples, {human_bytes(self.nbytes)}, {human_bytes(rate)}/s"
        if not self.total:
            return f"{self.label}: {counts}, {human_duration(elapsed)}"
        fraction = min(1.0, self.samples / self.total)
        filled = int(fraction * _BAR_WIDTH)
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        eta = "?"
        if self.samples and elapsed > 0:
            eta = human_duration(elapsed * (self.total - self.samples) / self.samples)
        return f"{self.label} [{bar}] {fraction:4.0%} {counts}, ETA {eta}"

    def _draw(self, text: str) -> None:
        pad = " " * max(0, self._width - len(text))
        self._stream.write("\r" + text + pad)
        self._stream.flush()
        self._width = len(text)

    def close(self) -> None:
        """Clear the bar (the caller prints a summary)."""
        if self.enabled and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
            self._width = 0

    def summary(self, what: str = "") -> str:
        """One line: what was done, how much, how fast."""
        elapsed = self.elapsed
        rate = self.nbytes / elapsed if elapsed > 0 else 0.0
        per_second = self.samples / elapsed if elapsed > 0 else 0.0
        done = f"{self.label}: {self.samples:,} samples, {human_bytes(self.nbytes)}"
        return (
            f"{done}{' ' + what if what else ''} in {elapsed:.1f} s "
            f"({human_bytes(rate)}/s, {per_second:,.0f} samples/s)"
        )


Progress = ProgressBar  # the name before the naming pass of issue 8; kept importable


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False

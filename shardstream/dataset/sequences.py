"""Packed sequences from a token dataset: the plan's samples are sequences, the shards'
samples are documents.

NOTE [ Reading sequences ]
A token dataset read with ``seq_len`` is planned over per-shard sequence counts (the
"tokens" plan kind, plan/tokens.py): a worker's windows hold runs of sequences of a
shard. Each such window is read as a window of documents: a run of sequences needs the
documents that hold its tokens (``SequenceLayout.run``; with concat, best-fit blocks and
pad these are consecutive), the runs of a shard are joined where their documents touch,
and the document window goes through the ``WindowReader`` as any window does (ranged
reads, the read budget, prefetch, checks, the cache). It is a lazy window of the sequence
window's shards: laid out in its fetch, once the reader has loaded all those shards'
sidecars at once (its best-fit sidecars beside them), so a window's sidecars cost one
round trip, taken in a fetch thread (one sidecar after another in the caller's thread
left the wire idle that long). Its
documents in run order are one flat token array per joined run, cut from its read
(NOTE [ Tokens without documents ] in sequence_reads.py; runs read by a window before
are taken from it, NOTE [ A shard read once across windows ]), and its
sequences are built from those a block of rows at a time, in the sequence window's order
(NOTE [ Building sequences ] in tokens/build.py). The document window keeps its documents
in run order and is never cut in pieces, so every window read gives back one window of
sequences, in turn; an unshuffled window of concat or pad sequences is cut in pieces
before (NOTE [ Unshuffled windows in pieces ] in budget.py), as their documents lie
together. A document the format cannot read cannot be skipped: the sequences around it
would change, so it is an error whatever ``on_error`` says.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import itertools
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardstream.dataset.budget import in_pieces, piece_limit
from shardstream.dataset.mixture_reader import MixtureReader
from shardstream.dataset.reader import WindowReader
from shardstream.dataset.sequence_reads import (
    DocumentTokens,
    SharedShards,
    joined_runs,
    placed_runs,
    shared_shards,
)
from shardstream.dataset.sequence_reads import flat_tokens as _flat_tokens
from shardstream.dataset.sequence_windows import WindowSequences
from shardstream.errors import FormatError, StorageError, UsageError
from shardstream.folder import fit_sidecar_name
from shardstream.formats.tokens import doc_ends
from shardstream.manifest import Manifest, sequences_key
from shardstream.plan import Run, Window
from shardstream.tokens import (
    BestFit,
    Packing,
    SequenceLayout,
    SequenceRun,
    sequence_layout,
)
from shardstream.tokens.build import SEQ_FIELDS

__all__ = ["SequenceReader", "TokenShards", "check_token_dataset", "sequence_counts"]

_FIT_READS = 8  # best-fit sidecars read at once (the GETs of a window's shards)
# Shard layouts kept per reader (a window touches a few shards; best-fit layouts hold a
# table of the shard's pieces).
_LAYOUTS = 64


def check_token_dataset(manifest: Manifest, url: str) -> None:
    """``UsageError`` unless ``manifest`` is of a token dataset (``seq_len`` needs one)."""
    if manifest.format != "tokens" or manifest.tokens is None:
        raise UsageError(
            f"seq_len reads packed sequences of a token dataset; this one is {manifest.format!r} "
            "(pack it with `shardstream pack SRC DEST --format tokens --tokenizer T`)",
            url=url,
        )


def sequence_counts(packing: Packing, manifest: Manifest, layouts: Any) -> np.ndarray:
    """The sequences of every shard: recorded in the manifest (NOTE [ Recorded sequences ]),
    or concat's from its token counts; else from each shard's document ends (``layouts(packing)``
    gives ``(layout of shard, close)``, reading sidecars; made only where they are needed)."""
    shards = manifest.shards
    recorded = manifest.sequences.get(sequences_key(packing.mode, packing.seq_len, packing.long_docs))
    if recorded is not None:
        return np.array(recorded, dtype=np.int64)
    if packing.mode == "concat" and all(info.tokens is not None for info in shards):
        tokens = np.fromiter((info.tokens or 0 for info in shards), dtype=np.int64, count=len(shards))
        return tokens // packing.seq_len
    layout, close = layouts(packing)
    try:
        return np.array([layout(shard).count for shard in range(len(shards))], dtype=np.int64)
    finally:
        close()


@dataclass(frozen=True, slots=True)
class TokenShards:
    """The token shards a reader's windows number (one dataset's, or a mixture's streams'
    one after another): each one's path, the number of its first document among all of
    them, its stream (``None``: one dataset), and the id that pads a sequence (its
    stream's end-of-document id, else 0)."""

    paths: tuple[str, ...]
    doc_base: tuple[int, ...]
    streams: tuple[int, ...] | None
    pads: tuple[int, ...]
    fits: tuple[str | None, ...]  # each shard's best-fit sidecar where one was recorded

    @classmethod
    def of(cls, manifests: Sequence[Manifest], packing: Packing, *, mixture: bool = False) -> TokenShards:
        paths, counts, streams, pads, fits = [], [], [], [], []
        for number, manifest in enumerate(manifests):
            eos = manifest.tokens.eos_id if manifest.tokens is not None else None
            fitted = (
                packing.mode == "best_fit"
                and sequences_key("best_fit", packing.seq_len) in manifest.sequences
            )
            for info in manifest.shards:
                paths.append(info.path)
                counts.append(info.samples)
                streams.append(number)
                pads.append(0 if eos is None else int(eos))
                fits.append(fit_sidecar_name(info.path, packing.seq_len) if fitted else None)
        base = np.cumsum(counts, dtype=np.int64) - np.asarray(counts, dtype=np.int64)
        streamed = tuple(streams) if mixture else None
        return cls(tuple(paths), tuple(base.tolist()), streamed, tuple(pads), tuple(fits))


class SequenceReader:
    """Reads windows of sequences through ``reader`` (a ``WindowReader`` of the token
    shards' documents, or a ``MixtureReader`` of several datasets'); NOTE [ Reading
    sequences ]."""

    def __init__(
        self, reader: Any, packing: Packing, shards: TokenShards, *, fields: Sequence[str] = SEQ_FIELDS
    ) -> None:
        self.reader, self.packing, self.shards = reader, packing, shards
        self.fields = tuple(fields)  # the arrays a sequence carries (``TokenOptions.seq_fields``)
        self._layouts: collections.OrderedDict[int, SequenceLayout] = collections.OrderedDict()
        self._lock = threading.Lock()  # windows are laid out in the reader's fetch threads
        self._making: dict[int, concurrent.futures.Future[SequenceLayout]] = {}
        self._fits: dict[int, concurrent.futures.Future[bytes]] = {}  # read beside a fetch (read_fits)

    def layout(self, shard: int) -> SequenceLayout:
        """The sequences of ``shard`` (its sidecar read once, the layout kept a while; laid
        out once where several threads ask at the same time)."""
        with self._lock:
            found = self._layouts.get(shard)
            if found is not None:
                self._layouts.move_to_end(shard)
                return found
            making = self._making.get(shard)
            if making is None:
                making = self._making[shard] = concurrent.futures.Future()
                mine = True
            else:
                mine = False
        if not mine:
            return making.result()
        try:
            found = self._laid_out(shard)
        except BaseException as error:
            with self._lock:
                del self._making[shard]
            making.set_exception(error)
            raise
        with self._lock:
            self._layouts[shard] = found
            while len(self._layouts) > _LAYOUTS:
                self._layouts.popitem(last=False)
            del self._making[shard]
        making.set_result(found)
        return found

    def _laid_out(self, shard: int) -> SequenceLayout:
        name, fit_name = self.shards.paths[shard], self.shards.fits[shard]
        fit = None
        try:
            if fit_name is not None:
                with self._lock:
                    early = self._fits.pop(shard, None)
                data = early.result() if early is not None else self.reader.sidecar(shard, fit_name)
                fit = BestFit.from_bytes(data, name=fit_name)
            ends = doc_ends(self.reader.index(shard))
        except StorageError as error:  # a sidecar read alone, not a window's: name its shard
            if error.shard is not None:
                raise
            raise type(error)(error.message, url=error.url, shard=name, offset=error.offset) from error
        return sequence_layout(self.packing, ends, fit=fit, shard=name)

    def _fit_sidecars(self, shards: Sequence[int]) -> None:
        """Lay out those of ``shards`` whose best-fit sidecars are to be read, their GETs at
        once (the reader loads a window's sample indexes at once, not its other sidecars)."""
        with self._lock:
            fitted = [shard for shard in shards if self.shards.fits[shard] is not None]
            missing = [shard for shard in fitted if shard not in self._layouts][:_LAYOUTS]
        if len(missing) > 1:
            with concurrent.futures.ThreadPoolExecutor(min(len(missing), _FIT_READS)) as pool:
                list(pool.map(self.layout, missing))

    def read_fits(self, shards: Sequence[int]) -> None:
        """Read the best-fit sidecars of ``shards`` that are not laid out, their GETs at once;
        a window's fetch runs this beside its reader's loads of the same shards' sample
        indexes, so that its layouts wait for one round trip, not two (NOTE [ Reading
        sequences ]). Their layouts take the bytes, or the error."""
        with self._lock:
            busy = self._layouts.keys() | self._making.keys() | self._fits.keys()
            names = {shard: self.shards.fits[shard] for shard in dict.fromkeys(shards) if shard not in busy}
            wanted = [(shard, name) for shard, name in names.items() if name is not None][:_LAYOUTS]
            futures = {shard: concurrent.futures.Future[bytes]() for shard, _ in wanted}
            self._fits.update(futures)

        def read(shard: int, name: str) -> None:
            try:
                futures[shard].set_result(self.reader.sidecar(shard, name))
            except BaseException as error:  # the layout raises it
                futures[shard].set_exception(error)

        if wanted:
            with concurrent.futures.ThreadPoolExecutor(min(len(wanted), _FIT_READS)) as pool:
                list(pool.map(read, *zip(*wanted, strict=True)))

    def stream(self, windows: Iterator[Window]) -> Iterator[tuple[Window, WindowSequences, bool]]:
        """``(window, sequences, False)`` for each window of sequences, in yield order."""
        pending: collections.deque[tuple[Window, Window, dict[str, Any]]] = collections.deque()

        def documents() -> Iterator[Window]:
            for window, shared in shared_shards(self._in_pieces(windows), *self._sharing()):
                made: dict[str, Any] = {}
                laid = Window.lazy(window.shards, functools.partial(self._documents, window, shared, made))
                pending.append((window, laid, made))
                yield laid

        # one dataset's windows as their runs' tokens (NOTE [ Tokens without documents ])
        tokens = isinstance(self.reader, (WindowReader, MixtureReader))
        early = self.read_fits if any(fit is not None for fit in self.shards.fits) else None
        read = (
            DocumentTokens(self.reader, self.shards.streams, early).stream if tokens else self.reader.stream
        )
        lent: dict[Run, np.ndarray] = {}  # the tokens of the document runs kept for the next window
        for _, docs, holes in read(documents()):
            window, laid, made = pending.popleft()
            if holes:
                raise FormatError(
                    "a document of a token shard could not be read: its sequences cannot be built"
                )
            joined = list(laid.runs)  # laid out by its fetch
            flats = docs if tokens else _flat_tokens(joined, docs)
            del docs
            borrowed = made["borrowed"]
            flats = [*flats, *(lent[run] for run in borrowed)]
            keeps = made["shared"].keeps
            every = [*joined, *borrowed]
            lent = {run: flat for run, flat in zip(every, flats, strict=True) if run.shard in keeps}
            sequences = WindowSequences(self, window.order, made["placed"], every, flats)
            yield window, sequences, False

    def _sharing(self) -> tuple[Any, Any]:
        """What ``shared_shards`` takes (NOTE [ A shard read once across windows ]): best-fit
        windows lend, concat's and pad's where they are shuffled (an unshuffled window's
        next piece goes on where it ends); a best-fit shard no larger than an unshuffled
        piece is lent on along the consecutive windows after that hold it, up to
        ``CHAIN_WINDOWS`` in all (one dataset read). A
        stream's first window of concat or pad lends nothing: its samples wait for all its
        reads, and those of the next window would only hold up the first sample."""
        if self.packing.mode != "best_fit":
            given = itertools.count()
            return (lambda window: next(given) > 0 and not window.in_run_order), None
        reader = self.reader
        if not isinstance(reader, WindowReader):
            return True, None
        limit = piece_limit(reader.read_budget, cached=reader.storage.cached)
        small = frozenset(n for n, info in enumerate(reader.manifest.shards) if info.bytes <= limit)
        return True, small.__contains__

    def _in_pieces(self, windows: Iterator[Window]) -> Iterator[Window]:
        """``windows``, those in run order in pieces as the reader's budget takes them (NOTE
        [ Unshuffled windows in pieces ] in budget.py), where the documents of a piece of
        sequences lie together (concat, pad: not best-fit bins) and one dataset is read."""
        reader = self.reader
        if self.packing.mode == "best_fit" or not isinstance(reader, WindowReader) or reader.budget is None:
            return windows
        tokens = reader.manifest.tokens
        step = self.packing.seq_len * np.dtype(tokens.dtype if tokens is not None else "uint16").itemsize
        # a sequence's bytes, as in_pieces counts them: its shard's bytes per "sample"
        shards = [
            dataclasses.replace(info, samples=max(1, info.bytes // step)) for info in reader.manifest.shards
        ]
        limit = piece_limit(reader.budget.limit, cached=reader.storage.cached)
        return in_pieces(windows, shards, limit, head=reader.short_head)

    def _documents(
        self, window: Window, shared: SharedShards, made: dict[str, Any]
    ) -> tuple[tuple[Run, ...], np.ndarray]:
        """The document runs that ``window`` reads, in run order: those of its sequence runs
        of the shards it shares with no other window, and those of all the sequences of the
        windows it lends a shard to (NOTE [ A shard read once across windows ]).
        ``made["borrowed"]``: the document runs a window before read for it;
        ``made["placed"]``: where each of its sequence runs is among its runs and those."""
        self._fit_sidecars(window.shards)
        made["shared"] = shared

        def laid(runs: Iterable[Run]) -> list[tuple[int, SequenceRun]]:
            return [(run.shard, self.layout(run.shard).run(run.start, run.stop)) for run in runs]

        own = laid(window.runs)
        borrows, shared_ones = shared.borrows, shared.borrows | shared.lends
        read = [run for run in own if run[0] not in shared_ones]
        joined = joined_runs(read + laid(shared.of(shared.lends)))
        made["borrowed"] = joined_runs(laid(shared.of(borrows)))
        made["placed"] = placed_runs(own, [*joined, *made["borrowed"]])
        return tuple(joined), np.arange(sum(len(r) for r in joined), dtype=np.int64)

    def close(self) -> None:
        self.reader.close()

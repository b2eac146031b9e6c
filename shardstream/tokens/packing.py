"""How documents become sequences of ``seq_len`` tokens: the ``Packing`` a dataset is given."""

from __future__ import annotations

from dataclasses import dataclass

from shardstream.counts import check_int
from shardstream.errors import UsageError, shown

MODES = ("concat", "best_fit", "pad")
LONG_DOCS = ("split", "truncate")
# A sequence's positions and cu_seqlens are int32 where attention kernels take them.
MAX_SEQ_LEN = 2**31 - 2


@dataclass(frozen=True, slots=True)
class Packing:
    """Documents into sequences of ``seq_len`` tokens (NOTE [ Packed sequences ] in layout.py).

    - ``concat``: the shard's documents end to end, cut every ``seq_len`` tokens; the tail
      under ``seq_len`` is dropped (and counted).
    - ``best_fit``: whole documents into sequences by best-fit-decreasing, padded; a document
      longer than ``seq_len`` is split into pieces of ``seq_len`` tokens, never dropped.
    - ``pad``: one document per sequence, padded; a longer one is split into several
      sequences (``long_docs="split"``) or cut to its first ``seq_len`` tokens (``"truncate"``).
    """

    seq_len: int
    mode: str = "concat"
    long_docs: str = "split"

    def __post_init__(self) -> None:
        check_int(self.seq_len, "seq_len", minimum=1, maximum=MAX_SEQ_LEN)
        object.__setattr__(self, "seq_len", int(self.seq_len))
        if self.mode not in MODES:
            raise UsageError(f"packing must be one of {', '.join(MODES)}, not {shown(self.mode, 40)}")
        if self.long_docs not in LONG_DOCS:
            raise UsageError(
                f"long_docs must be one of {', '.join(LONG_DOCS)}, not {shown(self.long_docs, 40)}"
            )
        if self.long_docs == "truncate" and self.mode != "pad":
            raise UsageError(
                f"long_docs='truncate' applies to packing='pad' only ({self.mode} never drops a token "
                "of a long document)"
            )

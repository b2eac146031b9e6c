"""Tokenizing while packing: ``pack(..., tokenizer=T)`` turns each sample's text into a
document of token ids, in the processes that write the shards.

# NOTE [ Tokenizing in the pack's workers ]
# The text of a shard is tokenized by the process that writes that shard, a batch at a
# time (``Tokenizer.encode_batch``: one call into Rust per batch, not one per document),
# so tokenizing runs in parallel over ``workers`` like the rest of a pack, and the parent
# that cuts the shards never tokenizes. Where a shard is cut cannot then depend on its
# token count, which is known only once it is written: a byte budget (``shard_size``)
# is met from an estimate of the text's tokens (``TokensFormat.sample_size``), and the
# cut stays a function of the source alone, so the shards are byte-identical for any
# number of workers, and a rerun of an interrupted pack re-tokenizes a shard into the
# same bytes and keeps the copy already stored (NOTE [ Restartable shards ]). A worker
# loads the tokenizer once, from the JSON the parent read (no download in a worker; the
# fingerprint is of those bytes). Documents are encoded with the tokenizer's own special
# tokens (a template that adds a BOS adds it), then an EOS is appended when asked.
# The encoder runs its own threads (Rust's rayon, one per core by default): a pack that
# writes in N worker processes gives each cores / N of them (``RAYON_NUM_THREADS``, unless
# the user set it), so that N workers do not run N times the cores in threads that spin
# waiting for each other; one worker (this process) keeps the encoder's default.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardstream.errors import PackError, UsageError, shown
from shardstream.formats.base import Sample, ShardFormat
from shardstream.formats.tokens import token_dtype_for
from shardstream.manifest import TokensInfo

DEFAULT_TEXT_FIELDS = ("text", "txt")  # without --text-field: "text", or a folder's ".txt" files
_BATCH = 1024  # documents per encode_batch call, at most
_BATCH_CHARS = 16 << 20  # and characters: a batch of long documents is encoded sooner
# Special tokens that end a document, by the names tokenizers give them, where the
# tokenizer has no tokenizer_config.json beside it to say which.
_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]")
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "[BOS]")


@dataclass(frozen=True, slots=True)
class Tokenizing:
    """How a pack tokenizes: the tokenizer (its JSON and what it is), the text field, EOS."""

    source: str  # what the user named: a tokenizer.json path, or a name
    tokenizer_json: str
    fingerprint: str
    vocab_size: int
    eos_id: int | None
    bos_id: int | None
    text_field: str | None  # None: the first of DEFAULT_TEXT_FIELDS a sample has
    append_eos: bool

    @property
    def dtype(self) -> str:
        return token_dtype_for(self.vocab_size)

    def info(self) -> TokensInfo:
        """The manifest's record of the ids this pack writes."""
        return TokensInfo(
            dtype=self.dtype,
            vocab_size=self.vocab_size,
            eos_id=self.eos_id,
            bos_id=self.bos_id,
            tokenizer=self.fingerprint,
        )

    def identity(self) -> dict[str, Any]:
        """What decides the tokens, for the record of a pack in progress."""
        return {"tokenizer": self.fingerprint, "text_field": self.text_field, "append_eos": self.append_eos}

    def __repr__(self) -> str:  # not the whole tokenizer JSON
        return f"Tokenizing({self.source!r}, {self.fingerprint}, text_field={self.text_field!r})"


def load_tokenizing(
    tokenizer: str | os.PathLike[str], *, text_field: str | None = None, append_eos: bool | None = None
) -> Tokenizing:
    """Load ``tokenizer`` (a ``tokenizer.json``, a folder holding one, or a name that
    ``tokenizers`` or ``transformers`` can load) once, in the parent; ``UsageError`` naming
    it where it cannot be. ``append_eos`` defaults to whether the tokenizer has an EOS."""
    source = os.fspath(tokenizer)
    text, fingerprint, config = _tokenizer_json(source)
    tok = _from_json(text)
    vocab_size = int(tok.get_vocab_size(with_added_tokens=True))
    eos_id = _special(tok, config.get("eos_token"), _EOS_NAMES)
    bos_id = _special(tok, config.get("bos_token"), _BOS_NAMES)
    if append_eos is None:
        append_eos = eos_id is not None
    elif append_eos and eos_id is None:
        raise UsageError(
            f"tokenizer {source!r} has no end-of-document token to append (none of {', '.join(_EOS_NAMES)}); "
            "pack with --no-append-eos"
        )
    if text_field is not None and (not isinstance(text_field, str) or not text_field):
        raise UsageError(f"text_field must be a field name, not {shown(text_field)}")
    token_dtype_for(vocab_size)  # a vocabulary past uint32 is refused here
    return Tokenizing(source, text, fingerprint, vocab_size, eos_id, bos_id, text_field, bool(append_eos))


def _tokenizer_json(source: str) -> tuple[str, str, dict[str, Any]]:
    """(tokenizer JSON, fingerprint, tokenizer_config.json's content or {}) of ``source``."""
    path = os.path.join(source, "tokenizer.json") if os.path.isdir(source) else source
    if os.path.isfile(path):
        try:
            with open(path, "rb") as f:
                raw = f.read()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise UsageError(f"cannot read tokenizer {source!r}: {error}") from None
        return text, "sha256:" + hashlib.sha256(raw).hexdigest(), _config_beside(path)
    text, config = _by_name(source)
    return text, f"{source}@sha256:" + hashlib.sha256(text.encode()).hexdigest(), config


def _config_beside(path: str) -> dict[str, Any]:
    config = os.path.join(os.path.dirname(path), "tokenizer_config.json")
    try:
        with open(config, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _by_name(name: str) -> tuple[str, dict[str, Any]]:
    """The JSON of the tokenizer called ``name`` (Hugging Face Hub or cache), by
    ``tokenizers`` first, else by ``transformers``'s fast tokenizer when it is installed."""
    errors = []
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError(
            "tokenizing needs the tokenizers package: pip install 'shardstream[tokens]'"
        ) from None
    try:
        return Tokenizer.from_pretrained(name).to_str(), {}
    except Exception as error:  # tokenizers raises plain Exceptions for a missing name or network
        errors.append(f"tokenizers: {error}")
    try:
        from transformers import AutoTokenizer  # type: ignore[import-not-found]

        loaded = AutoTokenizer.from_pretrained(name)
        backend = getattr(loaded, "backend_tokenizer", None)
        if backend is None:
            raise ValueError("it has no fast (tokenizers) version")
        names = {key: getattr(loaded, key, None) for key in ("eos_token", "bos_token")}
        return backend.to_str(), {k: v for k, v in names.items() if isinstance(v, str)}
    except ImportError:
        errors.append("transformers: not installed")
    except Exception as error:
        errors.append(f"transformers: {error}")
    raise UsageError(
        f"cannot load tokenizer {name!r}: not a file, and no library could load it by name ({'; '.join(errors)})"
    )


@functools.lru_cache(maxsize=4)
def _from_json(text: str) -> Any:
    """A ``tokenizers.Tokenizer`` from its JSON, made once per process."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError(
            "tokenizing needs the tokenizers package: pip install 'shardstream[tokens]'"
        ) from None
    try:
        tok = Tokenizer.from_str(text)
    except Exception as error:
        raise UsageError(f"not a tokenizers tokenizer.json: {error}") from None
    # a tokenizer.json saved for a model may truncate or pad what it encodes: a document is
    # stored whole and unpadded (packing cuts and pads sequences later)
    tok.no_truncation()
    tok.no_padding()
    return tok


def _special(tok: Any, configured: object, names: tuple[str, ...]) -> int | None:
    """The id of the special token ``configured`` names (a string, or a dict with ``content``),
    else of the first of ``names`` the tokenizer has."""
    if isinstance(configured, dict):
        configured = configured.get("content")
    for name in ((configured,) if isinstance(configured, str) else ()) + names:
        found = tok.token_to_id(name)
        if found is not None:
            return int(found)
    return None


def text_of(sample: Sample, field: str | None) -> str:
    """The text to tokenize of ``sample``; ``PackError`` naming the field where it has none."""
    fields = (field,) if field is not None else DEFAULT_TEXT_FIELDS
    for name in fields:
        if name in sample:
            value = sample[name]
            break
    else:
        have = ", ".join(sorted(k for k in sample if k != "__key__")) or "none"
        raise PackError(f"sample has no text field {' or '.join(map(repr, fields))} (its fields: {have})")
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as error:
            raise PackError(f"text field {name!r} is not UTF-8: {error}") from None
    if not isinstance(value, str):
        raise PackError(f"text field {name!r} is a {type(value).__name__}, not a string: {shown(value, 60)}")
    return value


class DocumentWriter:
    """Takes samples, writes documents: each sample's text tokenized in batches, written
    as ``{"__key__", field: ids}`` (``field`` is the format's ``token_field``)."""

    def __init__(self, write: Callable[[Sample], None], tokenizing: Tokenizing, fmt: ShardFormat) -> None:
        if fmt.token_field is None:
            raise UsageError(
                f"{fmt.name} shards hold no token ids: pack with a tokenizer to tokens or parquet"
            )
        self._write = write
        self._tokenizing = tokenizing
        self._field = fmt.token_field
        self._lists = fmt.token_lists
        self._keys: list[str] = []
        self._texts: list[str] = []
        self._chars = 0  # in the texts queued
        self.tokens = 0  # written so far

    def add(self, sample: Sample) -> None:
        """Queue ``sample``'s text; errors of the sample itself are raised here, at it."""
        text = text_of(sample, self._tokenizing.text_field)
        self._texts.append(text)
        self._keys.append(sample["__key__"])
        self._chars += len(text)
        if len(self._texts) >= _BATCH or self._chars >= _BATCH_CHARS:
            self.flush()

    def flush(self) -> None:
        """Tokenize and write what is queued."""
        if not self._texts:
            return
        keys, texts = self._keys, self._texts
        self._keys, self._texts, self._chars = [], [], 0
        for key, ids in zip(keys, encode(self._tokenizing, texts), strict=True):
            self.tokens += len(ids)
            self._write({"__key__": key, self._field: ids.tolist() if self._lists else ids})


def encode(tokenizing: Tokenizing, texts: list[str]) -> list[np.ndarray]:
    """The token ids of each text (the pack's own encoder, also what the bench times)."""
    tok = _from_json(tokenizing.tokenizer_json)
    batch = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets where it can
    dtype = np.dtype(tokenizing.dtype)
    eos = [tokenizing.eos_id] if tokenizing.append_eos and tokenizing.eos_id is not None else []
    return [np.array(e.ids + eos, dtype=dtype) for e in batch(texts)]

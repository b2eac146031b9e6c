"""Field decoders: from the bytes of a tar member (or a Parquet binary column) to a value.

A field is decoded by its extension, the part of its name after the last dot, lowercased
(``txt``, ``seg.png`` -> ``png``). The built-ins cover text, JSON, integers, numpy
``.npy``/``.npz``, images (with Pillow, to numpy arrays) and ``.pt`` (``torch.load`` with
``weights_only=True``). Fields with an unknown extension, and Parquet values that are not
bytes (the column type already decoded them), pass through unchanged.

Pickle (``pkl``, ``pickle``, ``pyd``) runs code, so it is refused unless the user passes
``allow_pickle=True``; a user decoder for such an extension is the user's explicit choice
and is used as given.

The registry is a dict plus :func:`register_decoder`, exposed read-only by
:func:`decoders`, as fsspec's ``registry.py``. A dataset snapshots it when it is built, so
its workers (fork, spawn, forkserver) decode the same way; decoders must be importable
top-level functions for spawn and forkserver.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from operator import itemgetter
from types import MappingProxyType
from typing import Any

from shardstream.errors import FormatError, MissingDependencyError, ShardstreamError, UsageError
from shardstream.formats.base import sample_builder

try:
    import orjson as _orjson
except ImportError:  # an optional speed-up: json alone gives the same values
    _orjson = None  # type: ignore[assignment]

__all__ = [
    "PICKLE_EXTENSIONS",
    "Decoder",
    "FieldDecoders",
    "PickleRefusedError",
    "SampleDecoder",
    "decoders",
    "failed",
    "field_extension",
    "refused",
    "register_decoder",
]

Decoder = Callable[[Any], Any]  # bytes (or a memoryview of them) -> value
PICKLE_EXTENSIONS = frozenset({"pkl", "pickle", "pyd"})
_BYTES = (bytes, bytearray, memoryview)
BYTES_TYPES = _BYTES  # what a decoder is given; any other value (typed, None) passes through


class PickleRefusedError(UsageError, FormatError):
    """A pickled field met without ``allow_pickle=True``: decoding it could run code.

    It is the user's choice (a ``UsageError``) about one sample's data (a ``FormatError``),
    so ``on_error="skip"`` skips that sample as it skips one a decoder cannot read.
    """


def field_extension(name: str) -> str:
    """The extension a field is decoded by: ``"seg.PNG"`` -> ``"png"``."""
    return name.rsplit(".", 1)[-1].lower()


def _text(data: bytes) -> str:
    return bytes(data).decode("utf-8")


def _json(data: bytes) -> Any:
    return json.loads(bytes(data))


def _integer(data: bytes) -> int:
    return int(bytes(data))


_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # json.loads without its Python frames
_first = itemgetter(0)
_end = itemgetter(1)

# NOTE [ JSON by orjson ]
# ``orjson.loads`` parses JSON several times faster than ``json.loads`` and gives the same
# objects (same types, same floats, the last of duplicate keys at the first one's place)
# for every document both accept, but one: an integer beyond 64 bits, which orjson turns
# into a float. Every such integer has at least ``_LONG`` digits in a row, so orjson's
# value is taken only for bytes without such a run. Where orjson refuses a document (NaN
# and Infinity, lone surrogates, a byte-order mark or another encoding than UTF-8, numbers
# json reads as infinite, deep nesting), ``json.loads`` decides: the value or the error is
# always its own. Without orjson installed, JSON is parsed by json's C scanner alone.
_LONG = 19
_DIGITS = bytes.maketrans(b"0123456789", b"0" * 10)
_DIGIT_RUN = b"0" * _LONG


def _short_numbers(data: bytes) -> bool:
    """Whether ``data`` has no run of ``_LONG`` digits (NOTE [ JSON by orjson ])."""
    return _DIGIT_RUN not in data.translate(_DIGITS)


def _json_value(data: bytes) -> Any:
    """``_json(data)``, by orjson where it gives the same (NOTE [ JSON by orjson ]), else by
    one C scanner call where ``data`` is ASCII without a NUL (then ``json.loads`` reads it
    as UTF-8 too) and the value ends where it does; else ``_json``."""
    if type(data) is not bytes:
        data = bytes(data)
    if _orjson is not None and _short_numbers(data):
        try:
            return _orjson.loads(data)
        except Exception:  # refused: json.loads decides, value or error
            return _json(data)
    if data.isascii() and b"\0" not in data:
        try:
            value, end = _scan(data.decode("ascii"), 0)
        except (StopIteration, ValueError, RecursionError):
            return _json(data)
        if end == len(data):
            return value
    return _json(data)


def _json_column(values: list[bytes]) -> list[Any]:
    """``[_json(v) for v in values]``, the same values and errors, at a column's speed
    (NOTE [ Bulk decode ] in bulk.py)."""
    joined = b"".join(values)
    if _orjson is not None and _short_numbers(joined):  # NOTE [ JSON by orjson ]
        try:
            return list(map(_orjson.loads, values))
        except Exception:  # one refused: each value by orjson or, where refused, json.loads
            return list(map(_json_value, values))
    if joined.isascii() and b"\0" not in joined:  # then json.loads would read it as UTF-8 too
        text = joined.decode("ascii")
        ends = list(accumulate(map(len, values)))
        try:
            parsed = list(map(_scan, repeat(text), [0, *ends[:-1]]))
        except (ValueError, RecursionError):
            parsed = []
        if list(map(_end, parsed)) == ends:  # a StopIteration ends the map early: no match
            return list(map(_first, parsed))
    return list(map(_json, values))


# The built-ins' column forms: the same values and exceptions (NOTE [ Bulk decode ] in bulk.py).
_COLUMN_FORMS: dict[Decoder, Callable[[list[bytes]], list[Any]]] = {
    _text: lambda values: list(map(bytes.decode, values)),
    _integer: lambda values: list(map(int, values)),
    _json: _json_column,
}


def column_form(decoder: Decoder) -> Callable[[list[bytes]], list[Any]] | None:
    """``values -> [decoder(v) for v in values]`` for a built-in decoder, in one C-level
    pass where it can (the same values, the same exception type); None for the others."""
    return _COLUMN_FORMS.get(decoder)


# NOTE [ Typed values passed through ]
# A Parquet shard keeps text and integer fields in typed columns (NOTE [ Typed columns ] in
# formats/parquet/typed.py) and gives them back as the bytes they were made from, which
# the built-in text and integer decoders then turn into what the column held already. So
# a reader whose field has that built-in decoder asks the format for the column's values
# as they are (``typed_values``): the same ``str`` or ``int``, with no bytes made and
# parsed; any other decoder (the user's, JSON's) gets the bytes, as from a tar shard.
_VALUE_KINDS: dict[Decoder, str] = {_text: "text", _integer: "integer"}


def typed_values(decoder: SampleDecoder, fields: tuple[str, ...]) -> dict[str, str]:
    """``{field: "text" | "integer"}`` for the ``fields`` whose decoder is the built-in text
    or integer one: a typed column of that kind may give them decoded (NOTE [ Typed values
    passed through ])."""
    kinds = {name: _VALUE_KINDS.get(decoder.lookup(name)) for name in fields}  # type: ignore[arg-type]
    return {name: kind for name, kind in kinds.items() if kind is not None}


def is_pickle(decoder: Decoder) -> bool:
    """Whether ``decoder`` is the built-in pickle decoder (refused without ``allow_pickle``)."""
    return decoder is _pickle


def _npy(data: bytes) -> Any:
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def _npz(data: bytes) -> dict[str, Any]:
    import numpy as np

    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def _image(data: bytes) -> Any:
    import numpy as np

    try:
        from PIL import Image
    except ImportError as error:
        raise MissingDependencyError(
            f"decoding an image needs Pillow ({error}): pip install 'shardstream[image]',"
            " or pass decode=False for the raw bytes"
        ) from None
    with Image.open(io.BytesIO(data)) as opened:
        opened.load()
        image: Image.Image = opened
        if image.mode == "P":  # palette indices mean nothing without the palette
            image = image.convert("RGBA" if "transparency" in image.info else "RGB")
        elif image.mode == "1":
            image = image.convert("L")
        # a writable array (np.asarray's is read-only, which torch.from_numpy warns about)
        return np.array(image)


def _torch(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def _pickle(data: bytes) -> Any:
    return pickle.loads(data)  # only reached with allow_pickle=True


_REGISTRY: dict[str, Decoder] = {}


def register_decoder(extension: str, decoder: Decoder) -> None:
    """Decode fields ending in ``.extension`` with ``decoder(bytes) -> value`` in every
    dataset built from now on (a dataset snapshots the registry when it is made)."""
    ext = extension.lstrip(".").lower()
    if not ext or "." in ext:
        raise UsageError(f"bad decoder extension {extension!r}: give one name such as 'jpg'")
    if not callable(decoder):
        raise UsageError(f"decoder for {extension!r} is not callable")
    _REGISTRY[ext] = decoder


def decoders() -> Mapping[str, Decoder]:
    """The registered decoders by extension (a read-only view)."""
    return MappingProxyType(_REGISTRY)


def _register_builtins() -> None:
    groups: list[tuple[Iterable[str], Decoder]] = [
        (("txt", "text", "transcript", "caption", "md"), _text),
        (("json", "jsn"), _json),
        (("cls", "cls2", "class", "count", "index", "inx", "id", "label"), _integer),
        (("npy",), _npy),
        (("npz",), _npz),
        (("jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "bmp", "gif", "tif", "tiff", "webp"), _image),
        (("pt", "pth"), _torch),
        (sorted(PICKLE_EXTENSIONS), _pickle),
    ]
    for extensions, decoder in groups:
        for ext in extensions:
            register_decoder(ext, decoder)


_register_builtins()


def refused(name: str, key: object, *, url: str | None, shard: str | None) -> PickleRefusedError:
    """The error for a pickled field ``name`` of sample ``key`` met without ``allow_pickle``."""
    return PickleRefusedError(
        f"field {name!r} of sample {key!r} is a pickle, which can run code "
        "when loaded; pass allow_pickle=True if you trust this dataset",
        url=url,
        shard=shard,
    )


def failed(name: str, key: object, error: Exception, *, url: str | None, shard: str | None) -> FormatError:
    """The error for a decoder that raised ``error`` on field ``name`` of sample ``key``."""
    return FormatError(f"cannot decode field {name!r} of sample {key!r}: {error!r}", url=url, shard=shard)


# NOTE [ Single-sample decode ]
# ``MapDataset[i]`` decodes one sample per call, so what ``SampleDecoder.__call__`` does
# per sample (a dict of raw values, a lookup per field name, a dict built key by key) and
# the Python frames of ``json.loads`` (encoding sniffing, whitespace matching) are most of
# a small sample's decode. ``SampleDecoder.for_fields`` looks a shard's field names up
# once; its ``FieldDecoders`` then decode the values in field order and build the sample
# with the compiled builder (NOTE [ Fast tar decode ]). The built-ins run in their column
# forms (NOTE [ Bulk decode ]): text ``bytes.decode``, integers ``int``, JSON orjson or one
# C scanner call; a value one of those cannot read is redone by the built-in itself, so its value or
# its error is the built-in's. A user decoder is called once per value, and its errors are
# those ``__call__`` raises.
_FAST: dict[Decoder, Decoder] = {_text: bytes.decode, _integer: int, _json: _json_value}


@dataclass(frozen=True, slots=True)
class FieldDecoders:
    """Decodes the ``bytes`` values of samples whose fields are ``fields`` (in that order)
    into a sample dict, as ``SampleDecoder.__call__`` would (NOTE [ Single-sample decode ])."""

    fields: tuple[str, ...]
    fast: tuple[Decoder | None, ...]  # per field: None keeps the value
    real: tuple[Decoder | None, ...]
    build: Callable[..., dict[str, Any]]

    def __call__(
        self, key: str, values: list[bytes], *, url: str | None = None, shard: str | None = None
    ) -> dict[str, Any]:
        out: list[Any] = []
        for name, fast, value, real in zip(self.fields, self.fast, values, self.real, strict=True):
            if fast is None:
                out.append(value)
                continue
            try:
                out.append(fast(value))
            except ShardstreamError:
                raise
            except Exception as error:
                if fast is real:
                    raise failed(name, key, error, url=url, shard=shard) from error
                out.append(_by_builtin(name, real, value, key, url, shard))
        return self.build(key, *out)


def _by_builtin(name: str, real: Any, value: bytes, key: str, url: str | None, shard: str | None) -> Any:
    try:
        return real(value)
    except Exception as error:
        raise failed(name, key, error, url=url, shard=shard) from error


_UNKNOWN: Any = object()  # a field name not looked up yet
_NAMES = 1024


@dataclass(frozen=True, slots=True)
class SampleDecoder:
    """Decodes the fields of one sample; picklable (it travels to DataLoader workers).

    ``table`` is the registry snapshot with the user's overrides applied; ``allow_pickle``
    lets the built-in pickle decoder run.
    """

    table: tuple[tuple[str, Decoder], ...]
    allow_pickle: bool = False
    _lookup: dict[str, Decoder] = field(init=False, repr=False, compare=False)
    # field name -> its decoder (or None), for the first _NAMES names met: a sample's few
    # names are looked up once, not parsed for their extension in every sample
    _by_name: dict[str, Decoder | None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_lookup", dict(self.table))
        object.__setattr__(self, "_by_name", {})

    def lookup(self, name: str) -> Decoder | None:
        """The decoder of field ``name`` (None for ``__*__`` entries and unknown extensions)."""
        found = self._by_name.get(name, _UNKNOWN)
        if found is _UNKNOWN:
            found = None if name.startswith("__") else self._lookup.get(field_extension(name))
            if len(self._by_name) < _NAMES:
                self._by_name[name] = found
        return found

    def for_fields(self, fields: tuple[str, ...]) -> FieldDecoders | None:
        """The decoders of samples with ``fields`` (NOTE [ Single-sample decode ]); None where
        a field is a pickle refused without ``allow_pickle`` (``__call__`` raises for it)."""
        real = tuple(self.lookup(name) for name in fields)
        if not self.allow_pickle and _pickle in real:
            return None
        fast = tuple(next((f for b, f in _FAST.items() if b is function), function) for function in real)
        return FieldDecoders(fields, fast, real, sample_builder(fields))

    @classmethod
    def build(
        cls, overrides: Mapping[str, Decoder] | None = None, *, allow_pickle: bool = False
    ) -> SampleDecoder:
        """Snapshot the registry, then apply ``overrides`` (extension -> decoder)."""
        table = dict(_REGISTRY)
        for extension, decoder in (overrides or {}).items():
            if not callable(decoder):
                raise UsageError(f"decoder for {extension!r} is not callable")
            table[extension.lstrip(".").lower()] = decoder
        return cls(table=tuple(sorted(table.items())), allow_pickle=allow_pickle)

    def __call__(
        self, sample: dict[str, Any], *, url: str | None = None, shard: str | None = None
    ) -> dict[str, Any]:
        """A new dict with every field decoded; ``__key__`` and other ``__*__`` entries kept.

        Raises :class:`PickleRefusedError` for a pickle without ``allow_pickle``, and
        ``FormatError`` naming the field, key, URL and shard when a decoder fails.
        """
        out: dict[str, Any] = {}
        by_name = self._by_name
        for name, value in sample.items():
            decoder = by_name.get(name, _UNKNOWN)
            if decoder is _UNKNOWN:
                decoder = self.lookup(name)
            if decoder is None or not isinstance(value, _BYTES):
                out[name] = bytes(value) if isinstance(value, memoryview) else value
                continue
            if decoder is _pickle and not self.allow_pickle:
                raise refused(name, sample.get("__key__"), url=url, shard=shard)
            try:
                out[name] = decoder(value)
            except ShardstreamError:
                raise
            except Exception as error:
                raise failed(name, sample.get("__key__"), error, url=url, shard=shard) from error
        return out

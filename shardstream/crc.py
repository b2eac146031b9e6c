"""CRC-32 as zlib computes it (the same values), by ISA-L where it loads: several times
faster than zlib.

Below every layer: the read checks of the formats (NOTE [ Checksummed reads ] in
``formats/checks.py``) and the cache fills of the storage (NOTE [ Filling the cache ] in
``storage/cached.py``) both take it.
"""

from __future__ import annotations

import zlib

__all__ = ["crc32"]

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal has wheels for the usual platforms
    crc32 = zlib.crc32

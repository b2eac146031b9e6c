"""A pack's lease on its destination; it moved to ``shardstream.lock``, below ``pack``,
since ``shardstream index`` holds it too (NOTE [ One pack per destination ] is there).
These names stay importable from here."""

from __future__ import annotations

from shardstream.lock import (
    DEFAULT_LEASE,
    LEASE_ENV,
    Claim,
    PackLease,
    host_id,
    lease_seconds,
    write_unsynced,
)

__all__ = ["DEFAULT_LEASE", "LEASE_ENV", "Claim", "PackLease", "host_id", "lease_seconds", "write_unsynced"]

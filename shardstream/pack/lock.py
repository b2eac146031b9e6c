"""A pack's lease on its destination; it moved to ``shardstream.lock``, below ``pack``,
since ``shardstream index`` holds it too (NOTE [ One pack per destination ] is there).
These names stay importable from here."""

from __future__ import annotations

from shardstream.lock import (
    DEFAULT_LEASE as DEFAULT_LEASE,
)
from shardstream.lock import (
    LEASE_ENV as LEASE_ENV,
)
from shardstream.lock import (
    Claim as Claim,
)
from shardstream.lock import (
    PackLease as PackLease,
)
from shardstream.lock import (
    host_id as host_id,
)
from shardstream.lock import (
    lease_seconds as lease_seconds,
)
from shardstream.lock import (
    write_unsynced as write_unsynced,
)

"""A pack's lease on its destination: one pack (or one pack per part) writes a folder at a time.

``pack`` holds it, and so does ``shardstream index`` (which deletes nothing but writes the
manifest), so it lives here, below both (``shardstream.pack.lock`` re-exports it).

The protocol is NOTE [ One pack per destination ] and NOTE [ Lease renewal and fencing ],
above ``Claim``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass, replace
from functools import cache

from shardstream.errors import ShardstreamError, StorageError, UsageError
from shardstream.folder import CLAIM_RE, claim_name
from shardstream.storage import Storage

LEASE_ENV = "SHARDSTREAM_PACK_LEASE"
DEFAULT_LEASE = 60.0
_log = logging.getLogger("shardstream.pack")


def lease_seconds() -> float:
    """The lease of a pack's claim, from ``SHARDSTREAM_PACK_LEASE`` (seconds)."""
    text = os.environ.get(LEASE_ENV, "").strip()
    if not text:
        return DEFAULT_LEASE
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0.1 <= seconds <= 86400:  # also refuses nan
        raise UsageError(f"{LEASE_ENV}={text!r}: give the lease in seconds, from 0.1 to 86400")
    return seconds


def write_unsynced(storage: Storage, path: str, data: bytes) -> None:
    """Write a claim or a record atomically but without an fsync.

    Neither needs to outlive a power cut: a lost claim only frees the scope (its pack
    died with the machine), and a lost record only makes a rerun refuse the shards left,
    naming ``--overwrite``, the safe side. So neither costs a disk flush, and the pack's
    only synchronous fsync stays the manifest's (NOTE [ Durable before the manifest ]).
    """
    storage.write(path, data, durable=False)


@cache
def host_id() -> str:
    """This machine (and pid namespace): where a claim's pid means this process table."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as f:
        parts.append(f.read().strip())
    with contextlib.suppress(OSError):
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    return "/".join(parts)


def _alive(pid: int) -> bool:
    if os.name != "posix":
        return True  # no cheap check: wait for the lease to run out
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError), open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] != "Z"  # a zombie is gone
    return True


@dataclass(frozen=True, slots=True)
# NOTE [ One pack per destination ]
# Two packs into one folder at once would each delete what the other wrote and both
# write a manifest: one dataset is lost and both exit 0. So a pack holds a lease on its
# destination from before it touches anything until after its manifest (or part record)
# is written. It must work on any object store with plain PUT, GET, LIST and DELETE:
# conditional writes (``If-None-Match: *``) are not served by every S3-compatible
# server, and a single lock object written with a plain PUT cannot tell two writers
# apart (the last PUT wins, silently). Instead every pack writes its OWN claim object,
# ``.shardstream-lock[-part-IIIII].<run id>.json``, then lists the claims of its scope:
#   - before writing its claim, a live claim of another pack refuses at once;
#   - after writing it, any other claim not already known to be stale means another
#     pack is starting at the same moment: this one deletes its claim and refuses.
# Of two packs that start together, the one that lists last sees both claims, so at
# least one refuses; both may refuse (each then says so), but both never go on. This
# needs only that a LIST made after a PUT returned shows the object (S3's strong
# read-after-write consistency, and that of local folders, MinIO and SeaweedFS).
# Scopes: ``--part I/N`` packs write disjoint names, so each part has its own scope and
# N machines can pack N parts into one folder at once; two packs of the same part
# exclude each other. The whole-dataset scope ``""`` (a pack without ``--part``, and
# ``shardstream index``) conflicts with every scope: it deletes or joins what parts
# write, so it treats every claim as a rival, and every part treats its claims as
# rivals. The lease is ``SHARDSTREAM_PACK_LEASE`` seconds (default 60).


# NOTE [ Lease renewal and fencing ]
# A claim is renewed every quarter of its lease by a daemon thread; it is stale when
# its lease ran out since its last renewal (by the reader's clock: clocks of machines
# that share a bucket must agree to well within a lease), or at once when it names this
# machine and a process that is gone (a SIGKILLed pack rerun on the same machine does
# not wait). A stale claim is deleted, with a warning, and its pack's work is taken over
# (NOTE [ Packs in progress ] in ``pack.dest``). Before writing the manifest the pack checks
# that its claim is still there and alone: a pack paused for longer than its lease (and
# so taken over) fails instead of writing a manifest over another's dataset.
# Fencing: ``check`` lists the claims (I/O) and runs before the manifest; ``ensure``
# costs no I/O and runs before each shard is stored or reused and before each
# deletion: once the last stored renewal is older than half the lease, the pack stops
# (another pack may take it over once the whole lease ran out, by its clock). The
# renewing thread's storage gives up retrying after a quarter of the lease (its
# ``RetryPolicy.timeout``), so one slow renewal does not outlast the next; a renewal
# that still hangs only lets ``ensure`` stop the pack, the safe side.
# A claim that cannot be parsed, or whose values are impossible (not finite, a lease
# outside 0.1 s to 1 day, renewed further in the future than its lease), is taken over
# at once with a warning naming it: claims are written atomically (a temp file renamed,
# or one PUT), so no live pack's claim reads like that, and a claim that can never run
# out must not block a destination forever.
class Claim:
    """One pack's claim object, as read back."""

    name: str
    run: str
    host: str
    pid: int
    lease: float
    renewed: float

    @classmethod
    def parse(cls, name: str, data: bytes) -> Claim | None:
        try:
            doc = json.loads(data)
            claim = cls(
                name,
                str(doc["run"]),
                str(doc["host"]),
                int(doc["pid"]),
                float(doc["lease"]),
                float(doc["renewed"]),
            )
        except (ValueError, TypeError, KeyError, RecursionError, OverflowError):
            return None
        lease, renewed = claim.lease, claim.renewed
        if not (math.isfinite(renewed) and 0.1 <= lease <= 86400) or renewed > time.time() + lease:
            return None  # could never run out: see NOTE [ One pack per destination ]
        return claim

    def stale(self, now: float) -> str | None:
        """Why the claim's pack is gone, or None while it may still be running."""
        if self.host == host_id() and not _alive(self.pid):
            return f"its process {self.pid} on this machine is gone"
        if now > self.renewed + self.lease:
            return f"its lease of {self.lease:g} s ran out {now - self.renewed - self.lease:.0f} s ago"
        return None

    def describe(self, now: float) -> str:
        return (
            f"pid {self.pid} on {self.host.split('/')[0]}, renewed {max(0.0, now - self.renewed):.0f} s ago, "
            f"lease {self.lease:g} s"
        )


class PackLease:
    """This pack's claim on ``storage`` (scope ``part``): ``acquire``, ``check``, ``release``."""

    def __init__(self, storage: Storage, scope: str = "", *, seconds: float | None = None) -> None:
        self.storage = storage
        self.scope = scope  # "" or "-part-00003"
        self.seconds = lease_seconds() if seconds is None else seconds
        self.run = secrets.token_hex(8)
        self.name = claim_name(scope, self.run)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renewed = 0.0  # time.monotonic() of the last renewal that was stored
        self._held = False

    def acquire(self) -> None:
        """Write this pack's claim, or refuse if another pack holds (or takes) the scope."""
        now = time.time()
        stale: dict[str, str] = {}
        for claim in self._claims():
            why = claim.stale(now) if isinstance(claim, Claim) else "its claim is unreadable"
            name = claim.name if isinstance(claim, Claim) else claim
            if why is None and isinstance(claim, Claim):
                raise self._held_by(claim, now)
            stale[name] = why or ""
        self._write()
        self._held = True
        rivals = [name for name in self._names() if name != self.name and name not in stale]
        if rivals:
            self.release()
            raise UsageError(
                f"another pack started writing here at the same moment (its lock {rivals[0]}); "
                "run one pack per destination (or per --part) at a time",
                url=self.storage.url,
            )
        for name, why in stale.items():
            _log.warning(
                "shardstream pack: taking over %s from a pack that stopped (%s)",
                self.storage.full_url(name),
                why,
            )
            self.storage.delete(name)
        # its own Storage: the renewing thread never shares a client with the pack's thread
        retry = self.storage.retry
        bound = self.seconds / 4 if retry.timeout is None else min(retry.timeout, self.seconds / 4)
        renewing = Storage(
            self.storage.url, self.storage.storage_options, retry=replace(retry, timeout=bound)
        )
        self._thread = threading.Thread(
            target=self._renew, args=(renewing,), name="shardstream-lease", daemon=True
        )
        self._thread.start()

    def check(self) -> None:
        """Raise unless this pack still holds its scope alone (called before the manifest)."""
        if not self._held:
            return
        self.ensure()
        others = [c for c in self._claims() if not isinstance(c, Claim) or c.run != self.run]
        if self.name not in self._names() or others:
            raise self._lost("another pack may have taken over")

    def ensure(self) -> None:
        """Raise, with no I/O, once the last stored renewal is older than half the lease."""
        if self._held and time.monotonic() - self._renewed > self.seconds / 2:
            raise self._lost(f"its claim was last renewed {time.monotonic() - self._renewed:.0f} s ago")

    def _lost(self, why: str) -> UsageError:
        return UsageError(
            f"this pack lost its lock {self.name} (paused or cut off for longer than half its lease of "
            f"{self.seconds:g} s: {why}); it stopped, and no manifest was written",
            url=self.storage.url,
        )

    def release(self, *, cleanup: bool = False) -> None:
        """Stop renewing and delete the claim (safe to call twice).

        ``cleanup``: on the way out of an error, a claim that cannot be deleted is logged,
        not raised, so it neither hides that error nor stops the rest of the cleanup
        (the claim then runs out with its lease).
        """
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join()
        if self._held:
            self._held = False
            try:
                self.storage.delete(self.name)
            except StorageError as error:
                if not cleanup:
                    raise
                _log.warning(
                    "shardstream pack: cannot delete its lock %s (%s); it runs out in %g s",
                    self.storage.full_url(self.name),
                    error,
                    self.seconds,
                )

    def is_stale_claim(self, name: str) -> bool:
        """Whether ``name`` is a claim of this scope but not this pack's (it held the scope before)."""
        match = CLAIM_RE.match(name)
        return match is not None and (match.group(1) or "") == self.scope and name != self.name

    def _write(self, storage: Storage | None = None) -> None:
        doc = {
            "run": self.run,
            "host": host_id(),
            "pid": os.getpid(),
            "lease": self.seconds,
            "renewed": time.time(),
            "writer": "shardstream pack",
        }
        started = time.monotonic()
        write_unsynced(storage or self.storage, self.name, json.dumps(doc).encode())
        self._renewed = started

    def _renew(self, storage: Storage) -> None:
        try:
            while not self._stop.wait(self.seconds / 4):
                with contextlib.suppress(Exception):  # a failed renewal shows in ``check``
                    self._write(storage)
        finally:
            storage.close()

    def _names(self) -> list[str]:
        """The claims that conflict with this scope: all for the whole dataset, else its own and the whole's."""
        return [
            p
            for p in self.storage.list_files()
            if (m := CLAIM_RE.match(p)) and (not self.scope or (m.group(1) or "") in ("", self.scope))
        ]

    def _claims(self) -> list[Claim | str]:
        """Every claim of the scope but this pack's own: parsed, or its name if unreadable."""
        found: list[Claim | str] = []
        for name in self._names():
            if name == self.name:
                continue
            try:
                data = self.storage.read(name)
            except ShardstreamError:
                if not self.storage.exists(name):
                    continue  # released between the listing and the read
                raise
            claim = Claim.parse(name, data)
            found.append(claim if claim is not None else name)
        return found

    def _held_by(self, claim: Claim, now: float) -> UsageError:
        return UsageError(
            f"another pack is writing this destination: its lock {claim.name} is held "
            f"({claim.describe(now)}); wait for it to finish (a pack that was killed on another machine "
            f"is taken over once its lease runs out), or pack into another folder",
            url=self.storage.url,
        )

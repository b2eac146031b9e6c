"""The claim of an engine's write job (Spark, Ray) on its destination.

A ``pack`` holds its lease from one process (``shardstream.lock``). A Spark job has
no such process: Spark plans the write, runs its tasks and commits it in Python
workers that come and go. So the job's claim is the same object a pack writes
(``.shardstream-lock.<run>.json``, the whole-dataset scope: every pack and ``index``
there is refused while it is live), but renewed by whoever works for the job: the
driver when it starts the job and commits it, each task while it writes. It names no
process (``host`` is the job, never this machine's id), so it is stale only once its
lease ran out since the last renewal: a job stalled for longer than that may be taken
over, and its commit then fails ``check`` instead of writing a manifest over another's
dataset (NOTE [ One pack per destination ] in ``shardstream.lock``).
"""

from __future__ import annotations

import json
import logging
import time

from shardstream.errors import ShardstreamError, UsageError
from shardstream.folder import CLAIM_RE, claim_name
from shardstream.lock import Claim, write_unsynced
from shardstream.storage import Storage

_log = logging.getLogger("shardstream.pack")


class JobLease:
    """Job ``run``'s claim on ``storage``: ``acquire`` (driver), ``renew`` (tasks), ``check``, ``release``."""

    def __init__(self, storage: Storage, run: str, seconds: float) -> None:
        self.storage = storage
        self.run = run
        self.seconds = seconds
        self.name = claim_name("", run)

    def acquire(self) -> None:
        """Write the claim, or refuse where another pack or job holds (or takes) the destination."""
        now = time.time()
        stale = []
        for claim in self._others():
            why = claim.stale(now) if isinstance(claim, Claim) else "its claim is unreadable"
            if why is None and isinstance(claim, Claim):
                raise UsageError(
                    f"another pack is writing this destination: its lock {claim.name} is held "
                    f"({claim.describe(now)}); wait for it to finish, or write another folder",
                    url=self.storage.url,
                )
            stale.append((claim.name if isinstance(claim, Claim) else claim, why))
        self.renew()
        rivals = [c for c in self._names() if c != self.name and c not in {name for name, _ in stale}]
        if rivals:
            self.release()
            raise UsageError(
                f"another pack started writing here at the same moment (its lock {rivals[0]}); "
                "run one pack or job per destination at a time",
                url=self.storage.url,
            )
        for name, why in stale:
            _log.warning("shardstream: taking over %s from a pack that stopped (%s)", name, why)
            self.storage.delete(name)

    def renew(self) -> None:
        doc = {
            "run": self.run,
            "host": f"job:{self.run}",  # no process to look for: stale by its lease alone
            "pid": 0,
            "lease": self.seconds,
            "renewed": time.time(),
            "writer": "shardstream job",
        }
        write_unsynced(self.storage, self.name, json.dumps(doc).encode())

    def held(self) -> bool:
        """Whether the claim is still there (a task asks after each shard it stores)."""
        return self.storage.exists(self.name)

    def alone(self) -> bool:
        """Whether the job still holds the destination, and no other pack claims it."""
        return self.held() and not self._others()

    def check(self) -> None:
        """Raise unless the job still holds the destination alone (before its manifest)."""
        if not self.alone():
            raise UsageError(
                f"this job lost its lock {self.name} (stalled for longer than its lease of "
                f"{self.seconds:g} s, and another pack took over); no manifest was written",
                url=self.storage.url,
            )

    def release(self) -> None:
        self.storage.delete(self.name)

    def _names(self) -> list[str]:
        return [p for p in self.storage.list_files() if CLAIM_RE.match(p)]

    def _others(self) -> list[Claim | str]:
        found: list[Claim | str] = []
        for name in self._names():
            if name == self.name:
                continue
            try:
                claim = Claim.parse(name, self.storage.read(name))
            except ShardstreamError:
                continue  # released between the listing and the read
            found.append(claim if claim is not None else name)
        return found

"""A pack's worker processes: how many are worth starting, and that they die with the pack.

# NOTE [ Workers die with their pack ]
# A pack's workers wait for tasks on a pipe that every one of them also holds open (they
# are forked or spawned with it), so when the pack's process is killed (SIGKILL, the OOM
# killer) no worker ever reads an end of file: they would wait forever, holding memory
# and half-written shards. So each worker asks the kernel to kill it when its parent
# dies (Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``), and checks once that the parent is
# still the one that started it, since the parent may have died before that. Where there
# is no ``prctl`` a daemon thread polls ``os.getppid()`` instead (a dead parent's children
# are handed to another process, so the id changes). Linux sends the signal when the
# *thread* that started the worker ends: the pool's workers are started by the thread
# that runs ``pack``, which shuts the pool down before it returns.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time

_log = logging.getLogger("shardstream.pack")

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_POLL_SECONDS = 0.5  # how often the fallback thread looks at its parent


_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def usable_cores() -> int:
    """The number of cores this process may run on: its CPU affinity, capped by a cgroup
    CPU quota (a container given 2 CPUs of a 64-core machine sees 64 in its affinity)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cores, quota)) if quota is not None else cores


def cgroup_cpu_quota(path: str | None = None) -> int | None:
    """The CPUs a cgroup v2 quota allows (``quota period`` in ``cpu.max``, rounded up), or None."""
    try:
        with open(path or _CPU_MAX) as f:
            fields = f.read().split()
        quota, period = int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):  # no cgroup v2, or "max": no quota
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def cap_workers(asked: int, samples: int | None = None) -> int:
    """The processes worth starting for ``asked`` workers, and a logged note if fewer.

    At most twice the usable cores (a process waiting on storage leaves its core to
    another, so a few more than the cores can still be used; thousands only cost memory
    and start-up), and no more than ``samples`` when the number of samples is known (a
    shard holds one at least).
    """
    cores = usable_cores()
    most = 2 * cores
    why = f"twice the {cores} cores this process may run on"
    if samples is not None and samples < most:
        most, why = max(samples, 1), f"one per sample: {samples} to pack"
    if asked <= most:
        return asked
    shown = f"{asked:,}" if asked.bit_length() < 64 else "more than 2**63"
    _log.warning("pack: %s workers asked for, %d used (at most %s)", shown, most, why)
    return most


def die_with_parent(parent: int) -> None:
    """Make this worker process end when ``parent`` (the pack's process) dies.

    See NOTE [ Workers die with their pack ].
    """
    if not _death_signal():
        threading.Thread(target=_watch, args=(parent,), name="shardstream-pack-lifeline", daemon=True).start()
    if os.getppid() != parent:  # it died before the signal was asked for
        os._exit(1)


def _death_signal() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0)
    except (OSError, AttributeError):  # no libc to load, or one without prctl
        return False


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_POLL_SECONDS)
    os._exit(1)  # no cleanup: the parent that would use this worker's results is gone

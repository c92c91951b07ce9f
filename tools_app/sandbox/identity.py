"""Sandbox identities: which unprivileged uid one running sandbox has (ARCHITECTURE §7).

Every running sandbox (a `shell_exec` command, a stdio MCP server) gets a uid of its own from the
operator's range `XAGENT_SANDBOX_UIDS` (gid = uid), held for as long as it runs. Why a uid each:

- RLIMIT_NPROC counts every process of a uid on the host. With one shared uid, one Session that
  holds its processes starves every other tenant's sandbox (seen: 58 held processes made the next
  sandbox fail to create its namespaces). With a uid each, a sandbox's process limit is its own.
- A sandbox never sees or signals another's processes, and files it leaves with its uid are
  not its neighbours' (workspaces are 0700 and handed back to the worker after each run).

Why not a cgroup each: measured on this machine type (kernel 6.18, cgroup v1 hierarchy plus an
empty v2 mount), root can create a v1 `pids` cgroup and set `pids.max`, but hosts differ (pure
v2 with systemd delegation, containers without a writable cgroupfs, gVisor), and bwrap has no
cgroup placement of its own. A uid per sandbox needs nothing but root, which the uid drop
already needs; a cgroup with a total memory limit would be an addition, not a replacement.

**Who holds a uid**: an exclusive `flock` on `<XAGENT_SANDBOX_LOCK_DIR>/<uid>`, taken by the
process that runs the sandbox and released when it ends. Locks are shared by every process of
the host (web, workers, test runners) and vanish with a dead process, so a crash never leaks a
uid. A worker that is not root has no uid to give: every sandbox then runs as the worker's own
uid, without this isolation (README: run workers as root in production).
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings

from ..base import ToolError

logger = logging.getLogger(__name__)

LOCK_DIR_MODE = 0o700
# A uid handed back while some process of it still lives (only possible for a run without the
# pid namespace: the operator's rlimits-only fallback) is swept this many times.
SWEEP_ROUNDS = 5


@dataclass
class SandboxIdentity:
    """The uid/gid one sandbox runs as, while `release` has not been called."""

    uid: int
    gid: int
    _lock_fd: int | None = field(default=None, repr=False)
    _released: bool = field(default=False, repr=False)

    @property
    def isolated(self) -> bool:
        """True for a uid of the range (root worker); False when the worker's own uid is used."""
        return self._lock_fd is not None

    def release(self, *, sweep: bool = False) -> None:
        """Hand the uid back. With `sweep`, first kill whatever process of it is still alive."""
        if self._released:
            return
        self._released = True
        if self._lock_fd is None:
            return
        try:
            if sweep:
                kill_processes_of(self.uid)
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> SandboxIdentity:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def uid_range() -> range:
    first, last = settings.XAGENT_SANDBOX_UIDS
    return range(first, last + 1)


_lock_dir_ready = threading.Lock()


def _lock_dir() -> str:
    path = str(settings.XAGENT_SANDBOX_LOCK_DIR)
    with _lock_dir_ready:
        os.makedirs(path, mode=LOCK_DIR_MODE, exist_ok=True)
    return path


def acquire() -> SandboxIdentity:
    """A uid no other running sandbox on this host holds (the worker's own when not root).

    Raises ToolError `sandbox_unavailable` when every uid of the range is in use."""
    if os.geteuid() != 0:
        return SandboxIdentity(uid=os.getuid(), gid=os.getgid())
    uids = uid_range()
    directory = _lock_dir()
    # Start anywhere: processes starting at once mostly try different uids first.
    start = random.randrange(len(uids))
    for index in range(len(uids)):
        uid = uids[(start + index) % len(uids)]
        fd = os.open(os.path.join(directory, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        # A run's processes die with its pid namespace, but the kernel may still be tearing a
        # big one down when the uid is handed back (seen under load after a bounded fork flood):
        # they would count against this sandbox's process limit. Sweep them; skip the uid if any
        # survive the sweep.
        if processes_of(uid):
            kill_processes_of(uid)
            if processes_of(uid):
                os.close(fd)
                continue
        return SandboxIdentity(uid=uid, gid=uid, _lock_fd=fd)
    logger.error("all %d sandbox uids (%s-%s) are in use", len(uids), uids[0], uids[-1])
    raise ToolError(
        f"the process sandbox is unavailable: all {len(uids)} sandbox identities of this host are in "
        "use; try again shortly (an operator can widen XAGENT_SANDBOX_UIDS)",
        code="sandbox_unavailable",
        stage="runtime",
    )


def processes_of(uid: int) -> list[int]:
    """Host pids owned by `uid` (a /proc entry belongs to its process's effective uid, which the
    uid drop sets together with the real one)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def _alive(pid: int) -> bool:
    """Not yet dead: a zombie (or a process gone since it was listed) needs no signal."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def kill_processes_of(uid: int) -> int:
    """SIGKILL every live process of `uid` (a few rounds: one may fork while we look). Returns
    how many were signalled; zombies are left to their reaper."""
    killed = 0
    for _ in range(SWEEP_ROUNDS):
        pids = [pid for pid in processes_of(uid) if _alive(pid)]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    if killed:
        logger.info("killed %d leftover process(es) of sandbox uid %d", killed, uid)
    return killed

"""ProcessSandbox: run one shell command against a Session workspace, confined and bounded.

`run_sandboxed` is the API for one command (ARCHITECTURE §7); long-running servers (stdio MCP
servers) are started in the same sandbox by `sandbox.server`, which shares `bwrap_options`, the
uid drop and the limits of this module. The process chain, when the worker runs as root (the
deployed case; UID is the run's own uid from XAGENT_SANDBOX_UIDS, `sandbox.identity`, gid = uid), is

    setpriv --reuid=UID --regid=GID --clear-groups --no-new-privs ... \\
      prlimit --cpu --as --nproc --fsize --core --nofile \\
        bwrap --args FD  /bin/sh -c PROLOGUE sh COMMAND

- The uid drop comes first: root ignores RLIMIT_NPROC, so the process limit only binds once the
  chain runs as the sandbox uid. Every running sandbox has a uid of its own (`sandbox.identity`),
  so one sandbox's processes neither count against nor appear beside another's. A worker that is
  not root runs the chain as itself (no uid switch, no chown); its RLIMIT_NPROC then also counts
  the worker's own processes and threads.
- bwrap gets fresh user, mount, pid, ipc, uts, cgroup and net namespaces (a tenant's "network"
  is egress through the outbound guard from that namespace, `sandbox.egress`; only an operator's
  `host_network` shares the host's); a new session (no TIOCSTI into a terminal); no capabilities; no nested user
  namespaces; and it dies with its parent (this worker).
- The mount namespace holds read-only /usr (and the /bin, /lib... symlinks or binds the host
  has), a minimal read-only /etc (`_etc_args`: ld.so.cache, alternatives, localtime, and a
  generated passwd/group naming only root and the sandbox user; resolv.conf, hosts,
  nsswitch.conf, gai.conf, host.conf, ssl and ca-certificates only with network), a private
  /proc, /dev and /tmp, and the workspace at /workspace (read-write or read-only per policy).
  The root itself is remounted read-only, so only /workspace and /tmp are writable.
- The workspace is bound from a directory fd this process opened (`--bind-fd`; bwrap closes it
  before the command runs). bwrap still resolves that fd to its path as the sandbox uid, so
  **the workspace's parent directories must be searchable by the sandbox uid** (o+x, as the default
  var/workspaces tree is); a workspace under a root-only directory is refused with a clear
  `sandbox_unavailable` error whatever the fallback (a deployment fix, not a reason to run
  unconfined).
- Every bwrap option goes through a memfd (`--args`), so values given in `env` (secrets) never
  appear on a host command line. The chain's own environment is a fixed minimal one.

**How the workspace is writable by the sandbox uid**: before each run the workspace tree is
chowned to the run's uid:gid (`_snapshot(..., chown_to=...)`), walking by directory fds and never
following a symlink, so a link the sandbox planted cannot turn the chown onto a host file; after
the run the same walk hands it back to the worker, and the workspace directory is 0700: at rest
no sandbox uid owns or can enter any workspace.
Chown rather than an ACL: it needs no filesystem ACL support or setfacl, files created 0600 by
the root-run file tools become readable too, and the worker (root) is unaffected. The same walk
records (size, mtime_ns) per entry; a second walk after the run yields `changed_files`.

**Was the command sandboxed?** The sandbox's pid 1 is a shell running a one-line prologue that
prints a random nonce to stdout (stripped from the output) and then runs `sh -c COMMAND`. A run
whose stdout does not start with the nonce never reached the command (bwrap is missing, or could
not build its namespaces or mounts), so it is safe to refuse, or, when an operator's policy says
`rlimits_only`, to run the command without bwrap. The command can never cause that fallback, and
a tenant's policy never has it (`SandboxPolicy.effective_fallback`).

**Nothing outlives a run.** That pid-1 shell reaps orphans while the command runs, and bwrap
(`--as-pid-1`) waits for it; when it dies the kernel kills and reaps the whole pid namespace
before bwrap can exit. A timeout, cancel or output flood SIGKILLs that pid 1 (its host pid
comes from `--info-fd`), with the process group SIGKILLed as a backstop.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import selectors
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from config import sandbox_reach

from ..base import ToolError
from . import egress, identity
from .identity import SandboxIdentity
from .policy import SandboxLimits
from .quota import QuotaReport, QuotaWatch, WorkspaceQuota
from .quota import walk as quota_walk

logger = logging.getLogger(__name__)

BWRAP = "/usr/bin/bwrap"
SETPRIV = "/usr/bin/setpriv"
PRLIMIT = "/usr/bin/prlimit"
SHELL = "/bin/sh"

SANDBOX_WORKDIR = "/workspace"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The chain before bwrap sees only this; the sandboxed command gets `_command_env`.
CHAIN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

# A run that produces more than this many times max_output_bytes (stdout + stderr) is stopped.
OUTPUT_FLOOD_FACTOR = 50
MAX_OPEN_FILES = 1024
# Entries the before/after walks look at; past this, changed_files is incomplete (flagged).
SNAPSHOT_MAX_ENTRIES = 100_000

POLL_SECONDS = 0.05
# After killing the sandbox's pid 1, how long bwrap gets to reap the namespace before the
# whole process group is SIGKILLed.
KILL_GRACE_SECONDS = 2.0
# After the main process exits, how long stray holders of the output pipes may keep them open
# (only possible without bwrap, where a process may leave the process group).
DRAIN_SECONDS = 1.0
# How long a finished run waits for the sandbox's pid namespace to be gone before returning.
TEARDOWN_SECONDS = 2.0

READ_CHUNK = 65_536

TRUNCATION_MARKER = "\n…[{stream} truncated: {dropped:,} bytes omitted here; showing the first {head:,} and last {tail:,} bytes]…\n"
FLOOD_NOTE = "\n…[{stream}: the command was stopped for producing over {flood:,} bytes of output]"

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Top-level host paths mirrored into the sandbox read-only (as the symlink they are on
# merged-/usr systems, or as a bind where they are real directories).
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
# /etc entries every sandbox gets: the dynamic linker cache, the alternatives symlink farm
# (awk, editor, ...), and the timezone.
_ETC_ALWAYS = ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime")
# Only with network: name resolution and TLS trust.
_ETC_NETWORK = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
)

# Through the egress proxy names are resolved by the proxy: only TLS trust is needed inside.
_ETC_TLS = ("/etc/ssl", "/etc/ca-certificates")

# What network a sandbox has (`bwrap_options`): none (its own empty namespace), egress (that
# namespace plus the proxy through the outbound guard, `sandbox.egress`), host (the operator's
# host_network: bwrap's --share-net).
NETWORK_NONE, NETWORK_EGRESS, NETWORK_HOST = "none", "egress", "host"

_KILL_REASONS_BY_SIGNAL = {signal.SIGXCPU: "cpu_limit", signal.SIGXFSZ: "file_size_limit"}


@dataclass
class SandboxRun:
    exit_code: int  # shell convention: 128+N when the command died of signal N
    stdout: str
    stderr: str
    duration_ms: int
    timed_out: bool = False
    # None, or why the run ended early: "timeout", "cancelled", "output_limit" (stopped by the
    # sandbox), "cpu_limit", "file_size_limit" (a kernel limit's signal), "signal:SIGxxx",
    # "quota_exceeded" (the workspace went over its quota while the command ran: `quota`).
    killed_reason: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    changed_files: list[tuple[str, str]] = field(default_factory=list)
    changed_files_complete: bool = True
    sandboxed: bool = True
    uid: int | None = None  # the uid the command ran as
    # With a quota given to run_sandboxed: what its check found and removed (`sandbox.quota`).
    quota: QuotaReport | None = None

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated


# --- workspace walk ------------------------------------------------------------------------


def _snapshot(root_fd: int, chown_to: tuple[int, int] | None) -> tuple[dict[str, tuple[int, int]], bool]:
    """Map every non-directory entry under the workspace to (size, mtime_ns).

    Walks by directory fds (`quota.walk`: each subdirectory opened O_NOFOLLOW relative to its
    parent, only the current path held open) and never follows a symlink (a symlink is itself an
    entry). With `chown_to` every entry (and the root) not already owned by that uid:gid is
    lchowned to it. Returns the map and whether the walk was complete (False past
    SNAPSHOT_MAX_ENTRIES, or below a directory it could not read or too deep to walk).
    """
    entries: dict[str, tuple[int, int]] = {}
    if chown_to is not None:
        _chown_fd(root_fd, chown_to)

    def visit(dir_fd: int, name: str, rel: str, st: os.stat_result) -> bool:
        if chown_to is not None and (st.st_uid, st.st_gid) != chown_to:
            try:
                os.chown(name, *chown_to, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                pass  # the run then meets a permission error it can report
        if not stat.S_ISDIR(st.st_mode):
            entries[rel] = (st.st_size, st.st_mtime_ns)
        return False

    complete = quota_walk(root_fd, visit, max_entries=SNAPSHOT_MAX_ENTRIES)
    return entries, complete


def _chown_fd(fd: int, owner: tuple[int, int]) -> None:
    try:
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != owner:
            os.fchown(fd, *owner)
    except OSError:
        pass


def _diff(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[tuple[str, str]]:
    changes = []
    for path in sorted(before.keys() | after.keys()):
        if path not in after:
            changes.append((path, "deleted"))
        elif path not in before:
            changes.append((path, "created"))
        elif before[path] != after[path]:
            changes.append((path, "modified"))
    return changes


# --- building the command line -------------------------------------------------------------


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)  # close-on-exec here; Popen(pass_fds=) hands it to bwrap only
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _passwd_files(uid: int, gid: int, home: str = SANDBOX_WORKDIR) -> tuple[bytes, bytes]:
    """A minimal /etc/passwd and /etc/group naming only root and the sandbox user (the
    host's user list stays outside)."""
    passwd = f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{uid}:{gid}:sandbox:{home}:/bin/sh\n"
    groups = f"root:x:0:\nsandbox:x:{gid}:\n"
    return passwd.encode(), groups.encode()


def _system_args() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _etc_args(network: str) -> list[str]:
    args = ["--dir", "/etc"]
    extra = {NETWORK_HOST: _ETC_NETWORK, NETWORK_EGRESS: _ETC_TLS}.get(network, ())
    for path in _ETC_ALWAYS + extra:
        if os.path.islink(path) and os.readlink(path).startswith("/usr/"):
            args += ["--symlink", os.readlink(path), path]  # e.g. localtime -> /usr/share/zoneinfo/...
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _command_env(env: dict[str, str] | None, home: str) -> dict[str, str]:
    result = {"PATH": SANDBOX_PATH, "HOME": home, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
    for name, value in (env or {}).items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ToolError(f"invalid environment variable name {name!r}", code="invalid_env")
        if not isinstance(value, str) or "\x00" in value:
            raise ToolError(f"environment variable {name} must be a string without NUL", code="invalid_env")
        result[name] = value
    return result


def bwrap_options(
    *,
    network: str,
    workdir: str,
    workdir_bind: list[str],
    passwd_fd: int,
    group_fd: int,
    env: dict[str, str] | None,
    tmp_size_mb: int,
    read_paths: tuple[str, ...] = (),
    info_fd: int | None = None,
) -> list[str]:
    """bwrap's options for one sandbox (module docstring), shared by `run_sandboxed` and the
    long-running servers of `sandbox.server`: fresh namespaces (the host's network only when
    `network` is NETWORK_HOST; NETWORK_EGRESS keeps the sandbox's own and the caller binds the
    proxy in), read-only system paths and minimal /etc, private /proc, /dev and /tmp, the one
    working directory (`workdir_bind` mounts it at `workdir`, which is also cwd and HOME), the
    extra host paths of `read_paths` read-only at their own path, and the command's environment.

    These go to bwrap through a memfd (`--args`), never on a command line: `env` holds secrets.
    """
    options = [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        *(["--share-net"] if network == NETWORK_HOST else []),
        "--unshare-pid",
        "--as-pid-1",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        *_system_args(),
        *_etc_args(network),
        "--ro-bind-data",
        str(passwd_fd),
        "/etc/passwd",
        "--ro-bind-data",
        str(group_fd),
        "/etc/group",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        # /tmp is memory: bounded like the rest of the sandbox's memory, or a loop of files
        # (each under the file-size limit) would fill the host's RAM.
        "--size",
        str(tmp_size_mb * 1024 * 1024),
        "--tmpfs",
        "/tmp",
        *workdir_bind,
    ]
    for path in read_paths:
        options += ["--ro-bind", path, path]
    options += [
        "--chdir",
        workdir,
        *(["--info-fd", str(info_fd)] if info_fd is not None else []),
        # Everything but the working directory (per its bind) and /tmp is read-only, /etc included.
        "--remount-ro",
        "/",
        "--clearenv",
    ]
    for name, value in _command_env(env, workdir).items():
        options += ["--setenv", name, value]
    return options


def _prlimit_args(limits: SandboxLimits) -> list[str]:
    mem = limits.memory_mb * 1024 * 1024
    fsize = limits.max_file_size_mb * 1024 * 1024
    return [
        PRLIMIT,
        # Soft limit first (SIGXCPU, a clear "cpu_limit"), the hard one a second later (SIGKILL).
        f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}",
        f"--as={mem}",
        f"--nproc={limits.max_processes}",
        f"--fsize={fsize}",
        "--core=0",
        f"--nofile={MAX_OPEN_FILES}",
    ]


def _drop_args(identity: SandboxIdentity) -> list[str]:
    """The drop to the run's own uid, when this process may (root); otherwise only no_new_privs."""
    if os.geteuid() == 0:
        return [
            SETPRIV,
            f"--reuid={identity.uid}",
            f"--regid={identity.gid}",
            "--clear-groups",
            "--no-new-privs",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ]
    if os.access(SETPRIV, os.X_OK):
        return [SETPRIV, "--no-new-privs"]
    return []


def _unsearchable_parent(path: str) -> str | None:
    """The first directory above `path` that others cannot search, or None (the rule is
    `config.sandbox_reach`'s: every sandbox uid is an "other" to the directories above it)."""
    blocked = sandbox_reach.unsearchable_parent(path)
    return None if blocked is None else str(blocked)


def _check_tools() -> None:
    needed = [PRLIMIT] + ([SETPRIV] if os.geteuid() == 0 else [])
    missing = [tool for tool in needed if not os.access(tool, os.X_OK)]
    if missing:
        # Without these there is no uid drop or no limits at all: never run, whatever the policy.
        raise ToolError(
            f"the process sandbox cannot run: {', '.join(missing)} is missing (util-linux)",
            code="sandbox_unavailable",
            stage="runtime",
        )


# --- supervising one process ---------------------------------------------------------------


class _Capture:
    """Keeps the first half and the last half of `cap` bytes of a stream, counting the rest.

    With `expect_prefix`, the stream must start with those bytes (the sandbox's nonce); they
    are stripped, and `prefix_seen` tells whether they came.
    """

    def __init__(self, cap: int, expect_prefix: bytes = b""):
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.prefix = expect_prefix
        self.pending = b""
        self.prefix_seen = False

    def add(self, data: bytes) -> None:
        if self.prefix:
            self.pending += data
            if len(self.pending) < len(self.prefix) and self.prefix.startswith(self.pending):
                return
            self.prefix_seen = self.pending.startswith(self.prefix)
            data = self.pending[len(self.prefix) :] if self.prefix_seen else self.pending
            self.prefix, self.pending = b"", b""
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_cap:  # trim now and then, not on every chunk
                del self.tail[: len(self.tail) - self.tail_cap]

    def finish(self) -> None:
        if self.prefix:  # the stream ended inside (or without) the expected prefix
            data, self.prefix, self.pending = self.pending, b"", b""
            self.add(data)

    @property
    def truncated(self) -> bool:
        return self.total > self.head_cap + self.tail_cap

    def text(self, stream: str, flooded: bool, flood: int) -> str:
        if len(self.tail) > self.tail_cap:
            del self.tail[: len(self.tail) - self.tail_cap]
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if not self.truncated:
            text = (self.head + self.tail).decode("utf-8", errors="replace")
        else:
            dropped = self.total - len(self.head) - len(self.tail)
            marker = TRUNCATION_MARKER.format(
                stream=stream, dropped=dropped, head=len(self.head), tail=len(self.tail)
            )
            text = head + marker + tail
        if flooded and self.truncated:
            text += FLOOD_NOTE.format(stream=stream, flood=flood)
        return text


@dataclass
class _Outcome:
    returncode: int
    stdout: _Capture
    stderr: _Capture
    killed_reason: str | None
    ready: bool
    duration_ms: int


def _await_teardown(init_pid: int) -> None:
    """Wait (bounded) until the sandbox's pid 1 has died. bwrap may exit first (killed as a
    group, its init then dies by its parent-death signal): until that init is dead, processes of
    the namespace may still be running; once it is, the kernel has killed and reaped them all."""
    deadline = time.monotonic() + TEARDOWN_SECONDS
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{init_pid}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[-1].split()[0]
        except (OSError, IndexError):
            return  # gone (reaped)
        if state in (b"Z", b"X"):
            return  # dead, waiting to be reaped
        time.sleep(POLL_SECONDS / 5)


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it (its pid and process group stay
    reserved, so signalling the group afterwards cannot hit a recycled pid)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _signal(pid: int, sig: int, *, group: bool) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _supervise(
    argv: list[str],
    *,
    cwd: str | None,
    pass_fds: tuple[int, ...],
    close_after_start: list[int],
    ready_nonce: bytes,
    info_fd: int | None,
    limits: SandboxLimits,
    cancel: threading.Event | None,
    env: dict[str, str] = CHAIN_ENV,
    quota_check: Callable[[], bool] | None = None,
) -> _Outcome:
    started = time.monotonic()
    deadline = started + limits.wall_seconds
    flood = limits.max_output_bytes * OUTPUT_FLOOD_FACTOR
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            pass_fds=pass_fds,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        for fd in close_after_start:
            os.close(fd)

    out = _Capture(limits.max_output_bytes, expect_prefix=ready_nonce)
    err = _Capture(limits.max_output_bytes)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    info = bytearray()
    if info_fd is not None:
        sel.register(info_fd, selectors.EVENT_READ, "info")

    child_pid: int | None = None
    killed_reason: str | None = None
    kill_at: float | None = None
    exited_at: float | None = None
    group_swept = False

    def kill(reason: str) -> None:
        nonlocal killed_reason, kill_at
        killed_reason, kill_at = reason, time.monotonic()
        if child_pid is not None:
            # The sandbox's pid 1: its death takes the whole pid namespace down, and bwrap
            # (still alive) reaps it and exits, so nothing is left behind or unreaped.
            _signal(child_pid, signal.SIGKILL, group=False)
        elif info_fd is None or info_fd not in sel.get_map():
            _signal(proc.pid, signal.SIGKILL, group=True)
        # else: bwrap reports the pid within moments of starting; the info handler below then
        # kills it, and the KILL_GRACE_SECONDS backstop covers a bwrap that never does.

    try:
        while True:
            now = time.monotonic()
            if exited_at is None and _exited(proc.pid):
                exited_at = now
            if exited_at is not None and not group_swept:
                # Sweep the process group before reaping: without bwrap, background
                # processes of the command would otherwise outlive it.
                _signal(proc.pid, signal.SIGKILL, group=True)
                group_swept = True
            streams_open = any(key.data in (out, err) for key in sel.get_map().values())
            if exited_at is not None and (not streams_open or now - exited_at > DRAIN_SECONDS):
                break
            if killed_reason is None and exited_at is None:
                if cancel is not None and cancel.is_set():
                    kill("cancelled")
                elif now >= deadline:
                    kill("timeout")
                elif out.total + err.total > flood:
                    kill("output_limit")
                elif quota_check is not None and quota_check():
                    kill("quota_exceeded")  # a bounded workspace walk, when one is due (sandbox.quota)
            if kill_at is not None and exited_at is None and now - kill_at > KILL_GRACE_SECONDS:
                _signal(proc.pid, signal.SIGKILL, group=True)
                kill_at = now

            for key, _ in sel.select(timeout=POLL_SECONDS):
                fd = key.fd
                try:
                    data = os.read(fd, READ_CHUNK)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(fd)
                    if key.data == "info" and child_pid is None and killed_reason and exited_at is None:
                        _signal(proc.pid, signal.SIGKILL, group=True)  # no pid will come now
                    continue
                if key.data == "info":
                    info += data
                    match = re.search(rb'"child-pid"\s*:\s*(\d+)', info)
                    if match and child_pid is None and exited_at is None:
                        child_pid = int(match.group(1))
                        if killed_reason is not None:
                            kill(killed_reason)  # killed before the pid was known: finish the job
                else:
                    key.data.add(data)
        returncode = proc.wait()
        if child_pid is not None:
            _await_teardown(child_pid)
    finally:
        sel.close()
        for stream in (proc.stdout, proc.stderr):
            stream.close()
        if info_fd is not None:
            os.close(info_fd)
        if proc.returncode is None:  # an exception on the way: never leave the group running
            _signal(proc.pid, signal.SIGKILL, group=True)
            proc.wait()

    out.finish()
    if returncode < 0:
        returncode = 128 - returncode
    return _Outcome(
        returncode=returncode,
        stdout=out,
        stderr=err,
        killed_reason=killed_reason,
        ready=out.prefix_seen,
        duration_ms=int((time.monotonic() - started) * 1000),
    )


def network_mode(limits: SandboxLimits) -> str:
    if limits.host_network:
        return NETWORK_HOST
    return NETWORK_EGRESS if limits.network else NETWORK_NONE


def _run_bwrap(
    command: str,
    root_fd: int,
    limits: SandboxLimits,
    env: dict[str, str],
    cancel,
    who: SandboxIdentity,
    proxy: egress.EgressProxy | None,
    quota_check: Callable[[], bool] | None = None,
) -> _Outcome:
    passwd, group = _passwd_files(who.uid, who.gid)
    fds: list[int] = []
    try:
        ws_fd = os.open(".", os.O_PATH | os.O_DIRECTORY, dir_fd=root_fd)
        fds.append(ws_fd)
        passwd_fd = _memfd("passwd", passwd)
        fds.append(passwd_fd)
        group_fd = _memfd("group", group)
        fds.append(group_fd)
        info_r, info_w = os.pipe()
        fds.append(info_w)

        bind = "--bind-fd" if limits.filesystem == "workspace_write" else "--ro-bind-fd"
        workdir_bind = [bind, str(ws_fd), SANDBOX_WORKDIR]
        start_egress = ""
        if proxy is not None:
            # The worker's proxy socket (read-only: the sandbox may connect, never replace it) and
            # the forwarder that serves 127.0.0.1:3128 inside the sandbox's namespace.
            forwarder_fd = _memfd("egress-forwarder", egress.FORWARDER.encode())
            fds.append(forwarder_fd)
            workdir_bind += [
                "--ro-bind",
                proxy.directory,
                os.path.dirname(egress.SANDBOX_SOCKET),
                "--ro-bind-data",
                str(forwarder_fd),
                egress.SANDBOX_FORWARDER,
            ]
            env = {**egress.PROXY_ENV, **env}
            start_egress = (
                f"{egress.PYTHON} -I -S {egress.SANDBOX_FORWARDER} || "
                "echo 'xagent: the egress proxy did not start; this command has no network' >&2; "
            )
        options = bwrap_options(
            network=network_mode(limits),
            workdir=SANDBOX_WORKDIR,
            workdir_bind=workdir_bind,
            passwd_fd=passwd_fd,
            group_fd=group_fd,
            env=env,
            tmp_size_mb=limits.memory_mb,
            info_fd=info_w,
        )
        args_fd = _memfd("bwrap-args", b"".join(arg.encode() + b"\0" for arg in options))
        fds.append(args_fd)
        # The prologue proves the command was reached (see the module docstring).
        nonce = secrets.token_hex(16)
        # The shell that prints it stays as the namespace's pid 1: it reaps orphans while the
        # command runs, and bwrap waits for it, so when bwrap exits the whole pid namespace is
        # gone and reaped (bwrap's own init lets bwrap exit first, leaving an unreaped init).
        # `; exit $?` keeps dash from exec'ing the command in its place.
        prologue = f'printf %s {nonce} || exit 125; {start_egress}{SHELL} -c "$1"; exit $?'
        argv = [
            *_drop_args(who),
            *_prlimit_args(limits),
            BWRAP,
            "--args",
            str(args_fd),
            SHELL,
            "-c",
            prologue,
            "sh",
            command,
        ]
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return _supervise(
        argv,
        cwd=None,
        pass_fds=tuple(fds),
        close_after_start=fds,
        ready_nonce=nonce.encode(),
        info_fd=info_r,
        limits=limits,
        cancel=cancel,
        quota_check=quota_check,
    )


def _run_rlimits_only(
    command: str,
    workspace: Path,
    limits: SandboxLimits,
    env: dict[str, str],
    cancel,
    who: SandboxIdentity,
    quota_check: Callable[[], bool] | None = None,
):
    # The environment goes through Popen, not a command line, so env values stay out of `ps`.
    argv = [*_drop_args(who), *_prlimit_args(limits), SHELL, "-c", command]
    return _supervise(
        argv,
        cwd=str(workspace),
        pass_fds=(),
        close_after_start=[],
        ready_nonce=b"",
        info_fd=None,
        limits=limits,
        cancel=cancel,
        env=_command_env(env, str(workspace)),
        quota_check=quota_check,
    )


def _why_unavailable(outcome: _Outcome) -> str:
    detail = bytes(outcome.stderr.head).decode("utf-8", errors="replace").strip().splitlines()
    first = detail[0] if detail else f"exit status {outcome.returncode}"
    return f"bubblewrap could not start the sandbox: {first[:300]}"


def run_sandboxed(
    command: str,
    workspace: Path,
    limits: SandboxLimits,
    env: dict[str, str] | None = None,
    cancel: threading.Event | None = None,
    quota: WorkspaceQuota | None = None,
) -> SandboxRun:
    """Run `sh -c command` with the workspace as its working directory, inside the sandbox
    `limits` describes, and report what happened. Refusals (sandbox unavailable and the policy
    refuses, bad env) raise ToolError; everything the command does is a result. With `quota`,
    what the command writes counts against it (`sandbox.quota`: stopped while running once
    over, and files it created removed at the end until the workspace is back within)."""
    if not isinstance(command, str) or not command.strip():
        raise ToolError("command must be a non-empty string", code="invalid_command")
    if "\x00" in command:
        raise ToolError("command must not contain NUL bytes", code="invalid_command")
    env = dict(env or {})
    _command_env(env, SANDBOX_WORKDIR)  # validate before touching anything
    _check_tools()

    real = os.path.realpath(workspace)
    if os.geteuid() == 0 and os.path.isdir(real) and (blocked := _unsearchable_parent(real)):
        logger.error("sandbox uids cannot search %s, a parent of workspace %s", blocked, real)
        raise ToolError(
            "the process sandbox cannot reach this workspace: one of its parent directories is not "
            "searchable by the sandbox users (XAGENT_SANDBOX_UIDS); the workspaces root and its parents "
            "must be searchable by others (chmod o+x)",
            code="sandbox_unavailable",
            stage="runtime",
        )
    if limits.network and not limits.host_network:
        try:
            egress.check_available()
        except egress.EgressUnavailable as exc:
            raise ToolError(
                f"the process sandbox is unavailable: {exc}", code="sandbox_unavailable", stage="runtime"
            ) from None
    try:
        root_fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise ToolError("the session workspace does not exist", code="workspace_missing") from exc
    try:
        who = identity.acquire()
    except BaseException:
        os.close(root_fd)
        raise
    sandboxed = True
    proxy: egress.EgressProxy | None = None
    try:
        owner = (who.uid, who.gid) if who.isolated else None
        before, complete = _snapshot(root_fd, chown_to=owner)
        os.fchmod(root_fd, 0o700)  # at rest and while running: nobody else's
        # Only a writable workspace can grow; what the run writes is its own uid's (when isolated).
        watch = None
        if quota is not None and limits.filesystem == "workspace_write":
            watch = QuotaWatch(root_fd, quota, owner_uid=who.uid if who.isolated else None)

        outcome: _Outcome | None = None
        why: str | None = None
        if not os.access(BWRAP, os.X_OK):
            why = f"bubblewrap is not installed ({BWRAP} is missing)"
        else:
            if limits.network and not limits.host_network:
                proxy = egress.EgressProxy(who.uid, who.gid, label=os.path.basename(real))
            outcome = _run_bwrap(command, root_fd, limits, env, cancel, who, proxy, quota_check=watch)
            if not outcome.ready and outcome.killed_reason is None:
                why = _why_unavailable(outcome)

        sandboxed = True
        if why is not None:
            if limits.fallback != "rlimits_only":  # a tenant's policy always refuses
                raise ToolError(
                    f"the process sandbox is unavailable: {why}. The sandbox policy refuses to run "
                    "commands without it (fallback 'refuse').",
                    code="sandbox_unavailable",
                    stage="runtime",
                )
            logger.warning(
                "process sandbox unavailable (%s); running with rlimits only, as the operator's policy "
                "allows",
                why,
            )
            sandboxed = False
            outcome = _run_rlimits_only(command, Path(real), limits, env, cancel, who, quota_check=watch)

        # Before the after-walk (and while the run's files are still its uid's), so that
        # changed_files describe what the quota check left.
        quota_report = watch.finish() if watch is not None else None
        # Back to the worker: at rest no sandbox uid owns anything of the workspace.
        worker = (os.getuid(), os.getgid()) if who.isolated else None
        after, complete_after = _snapshot(root_fd, chown_to=worker)
    finally:
        if proxy is not None:
            proxy.close()
        # The uid was this run's alone, so whatever process of it is still alive is the run's: a
        # pid namespace the kernel is still tearing down (TEARDOWN_SECONDS is a bound, not a
        # promise, on a loaded host), or, without the namespace (the operator's fallback), a
        # process that left the group. Killed before anyone else gets the uid.
        who.release(sweep=True)
        os.close(root_fd)

    assert outcome is not None
    killed_reason = outcome.killed_reason
    if killed_reason is None and outcome.returncode > 128:
        signum = outcome.returncode - 128
        try:
            sig = signal.Signals(signum)
        except ValueError:
            sig = None
        if sig is not None:
            killed_reason = _KILL_REASONS_BY_SIGNAL.get(sig, f"signal:{sig.name}")
    flooded = outcome.killed_reason == "output_limit"
    flood = limits.max_output_bytes * OUTPUT_FLOOD_FACTOR
    return SandboxRun(
        exit_code=outcome.returncode,
        stdout=outcome.stdout.text("stdout", flooded, flood),
        stderr=outcome.stderr.text("stderr", flooded, flood),
        duration_ms=outcome.duration_ms,
        timed_out=outcome.killed_reason == "timeout",
        killed_reason=killed_reason,
        stdout_truncated=outcome.stdout.truncated,
        stderr_truncated=outcome.stderr.truncated,
        changed_files=_diff(before, after),
        changed_files_complete=complete and complete_after,
        sandboxed=sandboxed,
        uid=who.uid,
        quota=quota_report,
    )

"""Long-running sandboxed servers (stdio MCP servers): how one is started inside the ProcessSandbox.

`run_sandboxed` supervises one command to its end. A server lives as long as its client keeps
the connection, and the client (the MCP SDK) spawns it and owns its pipes, so this module only
prepares the launch (`prepare_server` -> `ServerLaunch`: what to spawn, with which environment)
and the SDK runs it. The sandbox is the same as `shell_exec`'s (`process.bwrap_options`): the
uid drop, prlimit, fresh namespaces, read-only system paths, a minimal /etc, private /proc,
/dev and /tmp. What differs:

- **Its own directory** (`ServerSandbox.directory`, one per server) is bound read-write at
  `/server`, its working directory and HOME: the only writable place besides /tmp. Host paths
  the operator listed (`read_paths`) are bound read-only at their own path.
- **Network** only if the operator enabled it for this server (`network`: the host's network,
  as the operator is trusted with it), never from the tenant's SandboxPolicy.
- **Its own uid** (`sandbox.identity`), held from the preflight until the client closes the
  connection (`ServerLaunch.identity`: the caller releases it). At each start the server's
  directory is handed to that uid (a recursive chown that never follows links).
- **Limits**: the tenant's SandboxPolicy's CPU, memory, process, file-size and open-file limits.
  A server has no wall-clock limit of its own (it is meant to keep running); each operation on
  it is bounded by the MCP server's timeout instead, and the process is stopped when its
  client closes. RLIMIT_CPU counts the server's whole life: a server that used up its CPU
  seconds is killed by the kernel (SIGXCPU, then SIGKILL) and the next connection starts a
  fresh one.
- **How bwrap gets its options**: the SDK cannot pass descriptors to the process it spawns,
  so it spawns `launcher.py`, which recreates the memfds (`--args`, /etc/passwd, /etc/group)
  at fixed numbers and execs the chain; see that module.
- **Was it sandboxed?** Before each launch a preflight runs the same sandbox (same mounts,
  same limits) with a one-line script that prints a nonce and looks the command up
  (`command -v`). No nonce: bwrap cannot build this sandbox here, and the policy's fallback
  decides (refuse, or rlimits only — logged) exactly as for `shell_exec`. Nonce but no command:
  a clear "not found in the sandbox" instead of a server that dies at once.
- **Nothing outlives the client.** The sandbox's pid 1 is a shell that runs the server and
  reaps orphans; bwrap runs with `--die-with-parent` and a pid namespace, so when the SDK
  stops the server (closing stdin, then SIGTERM/SIGKILL to bwrap's process group) or the
  worker dies, the kernel kills every process of the sandbox. The parent-death signal is tied
  to the thread that spawned bwrap: a caller must spawn servers from a thread that lives as
  long as the connection (the SDK's event-loop thread does).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..base import ToolError
from . import identity, process
from .identity import SandboxIdentity
from .launcher import LAUNCH_VARIABLE
from .policy import SandboxLimits

logger = logging.getLogger(__name__)

SERVER_WORKDIR = "/server"
LAUNCHER = str(Path(__file__).with_name("launcher.py"))
# The descriptors the launcher recreates, as bwrap's options name them.
ARGS_FD, PASSWD_FD, GROUP_FD = 3, 4, 5
# The sandbox's pid 1: runs the server as its child and reaps orphans until it exits.
# `; exit $?` keeps dash from exec'ing the server in its place.
SERVER_PROLOGUE = '"$@"; exit $?'
# A preflight (a shell line, no server) never needs long.
PREFLIGHT_WALL_SECONDS = 20
COMMAND_NOT_FOUND = 127


@dataclass(frozen=True)
class ServerSandbox:
    """Where and how one server runs: its own host directory (bound at /server), whether it
    has the network, which host paths it may read, and the tenant's limits."""

    directory: str
    limits: SandboxLimits
    network: bool = False
    read_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServerLaunch:
    """What to spawn (`command args`, with exactly `env`, in `cwd`) to start the server."""

    command: str
    args: tuple[str, ...]
    env: dict[str, str] = field(repr=False)
    cwd: str
    sandboxed: bool
    # The uid the server runs as: held until the caller releases it, after the server is gone.
    identity: SandboxIdentity | None = field(default=None, repr=False, compare=False)


class CommandNotFound(ToolError):
    """The server's command does not exist (or is not executable) inside its sandbox."""


def prepare_server(
    command: str, args: Sequence[str], env: dict[str, str] | None, sandbox: ServerSandbox
) -> ServerLaunch:
    """Check that `command args` can start inside `sandbox` and say how to spawn it.

    Raises ToolError (code `sandbox_unavailable`, `invalid_command`, `invalid_env`,
    `command_not_found`) with a sentence fit for an admin; never returns an unconfined launch
    unless an operator's policy falls back to `rlimits_only` (then `sandboxed=False`, logged).
    The returned launch holds a uid: the caller must `launch.identity.release(sweep=True)` once
    the server has stopped (or was never spawned).
    """
    if not isinstance(command, str) or not command.strip() or "\x00" in command:
        raise ToolError("the server command must be a non-empty string without NUL", code="invalid_command")
    args = tuple(args)
    if not all(isinstance(a, str) and "\x00" not in a for a in args):
        raise ToolError("the server arguments must be strings without NUL", code="invalid_command")
    env = dict(env or {})
    process._command_env(env, SERVER_WORKDIR)  # validate before touching anything
    process._check_tools()
    for path in sandbox.read_paths:
        _check_read_path(path)
    who = identity.acquire()
    try:
        launch = _prepare(command, args, env, sandbox, who)
    except BaseException:
        who.release(sweep=True)
        raise
    return dataclasses.replace(launch, identity=who)


def _prepare(
    command: str, args: tuple[str, ...], env: dict[str, str], sandbox: ServerSandbox, who: SandboxIdentity
) -> ServerLaunch:
    directory = _prepare_directory(sandbox.directory, who)
    why: str | None = None
    if not os.access(process.BWRAP, os.X_OK):
        why = f"bubblewrap is not installed ({process.BWRAP} is missing)"
    else:
        why = _preflight(command, env, directory, sandbox, who)
    if why is None:
        return _bwrap_launch(command, args, env, directory, sandbox, who)
    if sandbox.limits.fallback != "rlimits_only":  # a tenant's policy always refuses
        raise ToolError(
            f"the process sandbox is unavailable: {why}. The sandbox policy refuses to run "
            "commands without it (fallback 'refuse').",
            code="sandbox_unavailable",
            stage="runtime",
        )
    logger.warning(
        "process sandbox unavailable (%s); starting a server with rlimits only, as the policy allows", why
    )
    return _rlimits_only_launch(command, args, env, directory, sandbox.limits, who)


def _prepare_directory(path: str, who: SandboxIdentity) -> str:
    """The server's directory, existing and (with what it holds) owned by this start's uid when
    this is root, whose parents that uid can search (bwrap resolves the path as that uid)."""
    real = os.path.realpath(path)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ToolError("the server's own directory does not exist", code="sandbox_unavailable") from exc
    try:
        if os.geteuid() == 0:
            if process._unsearchable_parent(real):
                raise ToolError(
                    "the process sandbox cannot reach the server's directory: one of its parent "
                    "directories is not searchable by the sandbox users (XAGENT_SANDBOX_UIDS); "
                    "the MCP servers root and its parents must be searchable by others (chmod o+x)",
                    code="sandbox_unavailable",
                    stage="runtime",
                )
            # What an earlier start (another uid) left there becomes this start's.
            process._snapshot(fd, chown_to=(who.uid, who.gid))
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return real


def _check_read_path(path: str) -> None:
    if not os.path.isabs(path) or not os.path.exists(path):
        raise ToolError(
            f"the read-only path {path} given for this server does not exist on this host",
            code="sandbox_unavailable",
            stage="runtime",
        )
    if os.geteuid() == 0 and process._unsearchable_parent(path):
        raise ToolError(
            f"the read-only path {path} given for this server is not reachable by the sandbox users "
            "(XAGENT_SANDBOX_UIDS): its parent directories must be searchable by others",
            code="sandbox_unavailable",
            stage="runtime",
        )


def _options(env: dict[str, str], directory: str, sandbox: ServerSandbox, passwd_fd: int, group_fd: int):
    return process.bwrap_options(
        network=process.NETWORK_HOST if sandbox.network else process.NETWORK_NONE,
        workdir=SERVER_WORKDIR,
        workdir_bind=["--bind", directory, SERVER_WORKDIR],
        passwd_fd=passwd_fd,
        group_fd=group_fd,
        env=env,
        tmp_size_mb=sandbox.limits.memory_mb,
        read_paths=sandbox.read_paths,
    )


def _nul_joined(options: list[str]) -> bytes:
    return b"".join(arg.encode() + b"\0" for arg in options)


def _preflight(
    command: str, env: dict[str, str], directory: str, sandbox: ServerSandbox, who: SandboxIdentity
) -> str | None:
    """Run the server's sandbox with a shell line instead of the server. None when it works;
    otherwise why bwrap could not build it. Raises CommandNotFound when only the command is missing."""
    passwd, group = process._passwd_files(who.uid, who.gid, home=SERVER_WORKDIR)
    limits = dataclasses.replace(
        sandbox.limits, wall_seconds=min(sandbox.limits.wall_seconds, PREFLIGHT_WALL_SECONDS)
    )
    # Only PATH matters to the lookup: the secret values stay out of the preflight.
    lookup_env = {"PATH": env["PATH"]} if "PATH" in env else {}
    nonce = secrets.token_hex(16)
    script = f'printf %s {nonce} || exit 125; command -v "$1" >/dev/null 2>&1 || exit {COMMAND_NOT_FOUND}'
    fds: list[int] = []
    try:
        passwd_fd = process._memfd("passwd", passwd)
        fds.append(passwd_fd)
        group_fd = process._memfd("group", group)
        fds.append(group_fd)
        options = _options(lookup_env, directory, sandbox, passwd_fd, group_fd)
        args_fd = process._memfd("bwrap-args", _nul_joined(options))
        fds.append(args_fd)
        argv = [
            *process._drop_args(who),
            *process._prlimit_args(limits),
            process.BWRAP,
            "--args",
            str(args_fd),
            process.SHELL,
            "-c",
            script,
            "sh",
            command,
        ]
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    outcome = process._supervise(
        argv,
        cwd=None,
        pass_fds=tuple(fds),
        close_after_start=fds,
        ready_nonce=nonce.encode(),
        info_fd=None,
        limits=limits,
        cancel=None,
    )
    if not outcome.ready:
        return process._why_unavailable(outcome)
    if outcome.returncode == COMMAND_NOT_FOUND:
        raise CommandNotFound(
            f"the command {command!r} was not found in the server's sandbox (it sees the host's /usr "
            "and the server's read-only paths only)",
            code="command_not_found",
            stage="runtime",
        )
    return None


def _launch(argv: list[str], spec: dict, sandboxed: bool) -> ServerLaunch:
    return ServerLaunch(
        command=sys.executable,
        args=("-I", "-S", LAUNCHER, *argv),
        env={LAUNCH_VARIABLE: json.dumps(spec)},
        cwd="/",
        sandboxed=sandboxed,
    )


def _bwrap_launch(
    command: str,
    args: tuple[str, ...],
    env: dict[str, str],
    directory: str,
    sandbox: ServerSandbox,
    who: SandboxIdentity,
) -> ServerLaunch:
    passwd, group = process._passwd_files(who.uid, who.gid, home=SERVER_WORKDIR)
    options = _options(env, directory, sandbox, PASSWD_FD, GROUP_FD)
    payload = {ARGS_FD: _nul_joined(options), PASSWD_FD: passwd, GROUP_FD: group}
    argv = [
        *process._drop_args(who),
        *process._prlimit_args(sandbox.limits),
        process.BWRAP,
        "--args",
        str(ARGS_FD),
        process.SHELL,
        "-c",
        SERVER_PROLOGUE,
        "sh",
        command,
        *args,
    ]
    spec = {
        "fds": {str(n): base64.b64encode(data).decode() for n, data in payload.items()},
        "env": process.CHAIN_ENV,
    }
    return _launch(argv, spec, sandboxed=True)


def _rlimits_only_launch(
    command: str,
    args: tuple[str, ...],
    env: dict[str, str],
    directory: str,
    limits: SandboxLimits,
    who: SandboxIdentity,
) -> ServerLaunch:
    # The uid drop and the limits, without namespaces: the server runs in its directory on the host.
    argv = [*process._drop_args(who), *process._prlimit_args(limits), command, *args]
    spec = {"fds": {}, "env": process._command_env(env, directory), "cwd": directory}
    return _launch(argv, spec, sandboxed=False)

"""A hostile stdio MCP server for the sandbox tests: each tool attempts something a server must
not be able to do (or may only do when the operator allowed it) and reports what happened as JSON.

    python -m tests.support.hostile_mcp_server

A separate process speaking only MCP (no Django). Every attempt is bounded (processes, memory,
connect timeouts), so a sandbox that fails cannot take the test machine down.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess

from mcp.server.mcpserver import MCPServer

MAX_PROCESSES = 500
MAX_ALLOC_MB = 4096
CONNECT_TIMEOUT = 3.0

server = MCPServer("xagent-hostile", log_level="WARNING")


def _report(**facts) -> str:
    return json.dumps(facts)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"


@server.tool(description="Who and where this server is.", structured_output=False)
def whoami() -> str:
    return _report(uid=os.getuid(), gid=os.getgid(), cwd=os.getcwd(), home=os.environ.get("HOME"))


@server.tool(description="Read up to 200 bytes of a file.", structured_output=False)
def read_file(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return _report(ok=True, data=fh.read(200).decode("utf-8", "replace"))
    except OSError as exc:
        return _report(ok=False, error=_error(exc))


@server.tool(description="List a directory.", structured_output=False)
def list_dir(path: str) -> str:
    try:
        return _report(ok=True, entries=sorted(os.listdir(path)))
    except OSError as exc:
        return _report(ok=False, error=_error(exc))


@server.tool(description="Write a file.", structured_output=False)
def write_file(path: str, text: str = "hostile") -> str:
    try:
        with open(path, "w") as fh:
            fh.write(text)
        return _report(ok=True)
    except OSError as exc:
        return _report(ok=False, error=_error(exc))


@server.tool(description="Open a TCP connection.", structured_output=False)
def connect(host: str, port: int) -> str:
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
        return _report(ok=True)
    except OSError as exc:
        return _report(ok=False, error=_error(exc))


@server.tool(
    description="Start up to n sleeping processes, count them, then stop them all.", structured_output=False
)
def fork_many(n: int, marker: str) -> str:
    started, refused, errors = [], 0, set()
    for _ in range(max(0, min(n, MAX_PROCESSES))):
        try:
            # `marker` names the processes on the host's process list, so a test can look for survivors.
            started.append(subprocess.Popen(["/bin/sh", "-c", "sleep 60", marker]))
        except OSError as exc:
            refused += 1
            errors.add(_error(exc))
    for proc in started:
        proc.kill()
    for proc in started:
        proc.wait()
    return _report(started=len(started), refused=refused, errors=sorted(errors))


@server.tool(
    description="Start a sleeping process that outlives this call (a stray child).", structured_output=False
)
def leave_child(marker: str) -> str:
    subprocess.Popen(["/bin/sh", "-c", "sleep 60", marker], start_new_session=True)
    return _report(ok=True)


@server.tool(description="Allocate and touch `mb` megabytes.", structured_output=False)
def alloc(mb: int) -> str:
    try:
        block = bytearray(max(0, min(mb, MAX_ALLOC_MB)) * 1024 * 1024)
        block[::4096] = b"x" * len(block[::4096])
        return _report(ok=True, mb=len(block) // (1024 * 1024))
    except MemoryError:
        return _report(ok=False, error="MemoryError")


@server.tool(description="The value of an environment variable.", structured_output=False)
def env(name: str) -> str:
    return _report(value=os.environ.get(name))


if __name__ == "__main__":
    server.run("stdio")

"""Sandbox egress: the network a tenant's policy may switch on, through the outbound guard.

A sandbox with `network` on keeps its own network namespace — no route anywhere, not even to
the host's loopback — and gets one way out: an HTTP proxy at 127.0.0.1:3128 *inside* that
namespace (`PROXY_URL`, in the command's HTTP(S)_PROXY variables). That address is a small
forwarder (`FORWARDER`, Debian's python3, started by the sandbox's prologue) that relays each
connection to a Unix socket bound into the sandbox read-only; behind the socket, in the worker,
`EgressProxy` speaks HTTP CONNECT and absolute-form HTTP and opens the upstream connection only
after the outbound guard (`tools_app.net.checked_addresses`) has approved every address the host
resolves to, pinned to the address it checked. So a command reaches public hosts on the ports
the operator allows (`XAGENT_SANDBOX_EGRESS_PORTS`) and the hosts the operator allow-lists
(`XAGENT_OUTBOUND_ALLOWED_HOSTS`), and never the host's own services (PostgreSQL, Redis, the
app), private networks or the metadata address: a direct socket has no route, and the proxy
refuses them with a 403 whose body says why.

Each run has its own proxy and socket (a 0711 directory with an unguessable name, the socket
owned by the run's sandbox uid), closed with the run: one sandbox cannot use another's.

`host_network` (operator-only) is the other thing: bwrap's `--share-net`, no proxy.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import selectors
import shutil
import socket
import tempfile
import threading

from django.conf import settings

from ..net import OutboundRefused, checked_addresses, is_allow_listed

logger = logging.getLogger(__name__)

SANDBOX_DIR = "/run/xagent"
SANDBOX_SOCKET = f"{SANDBOX_DIR}/egress/proxy.sock"
SANDBOX_FORWARDER = f"{SANDBOX_DIR}/forward.py"
PROXY_PORT = 3128
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
PYTHON = "/usr/bin/python3"
SOCKET_NAME = "proxy.sock"
SOCKET_ROOT = "/tmp"

MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT_SECONDS = 30
CONNECT_TIMEOUT_SECONDS = 10
IDLE_TIMEOUT_SECONDS = 300
MAX_CONNECTIONS = 64
CHUNK = 65_536

# What the sandboxed command sees: the proxy for every common client (curl, wget, pip, requests,
# urllib, git over https). NO_PROXY is empty so nothing tries a direct route that cannot exist.
PROXY_ENV = {
    "HTTP_PROXY": PROXY_URL,
    "HTTPS_PROXY": PROXY_URL,
    "http_proxy": PROXY_URL,
    "https_proxy": PROXY_URL,
    "ALL_PROXY": PROXY_URL,
    "NO_PROXY": "",
    "no_proxy": "",
}

# Runs inside the sandbox (python3 -I -S, stdlib only): listen on 127.0.0.1:3128 of the sandbox's
# namespace, then fork into the background (the prologue continues with the command only once
# the port is open), and relay every connection to the bound Unix socket. One process, no
# threads: it counts once against the sandbox's process limit.
FORWARDER = rf"""
import asyncio, os, socket, sys
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", {PROXY_PORT}))
listener.listen(128)
if os.fork():
    os._exit(0)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)

async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read({CHUNK})
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except Exception:
        writer.close()

async def handle(client_reader, client_writer):
    try:
        reader, writer = await asyncio.open_unix_connection({SANDBOX_SOCKET!r})
    except OSError:
        client_writer.close()
        return
    try:
        await asyncio.gather(pipe(client_reader, writer), pipe(reader, client_writer))
    finally:
        writer.close()
        client_writer.close()

async def main():
    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""


class EgressUnavailable(Exception):
    pass


def check_available() -> None:
    if not os.access(PYTHON, os.X_OK):
        raise EgressUnavailable(
            f"network egress needs {PYTHON} inside the sandbox (apt-get install python3-minimal)"
        )


def _response(status: str, reason: str) -> bytes:
    body = f"xAgent sandbox egress: {reason}\n".encode()
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nX-XAgent-Egress: refused\r\n\r\n"
    ).encode() + body


class _Refused(Exception):
    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def _split_authority(authority: str, default_port: int) -> tuple[str, int]:
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port_text = rest.removeprefix(":")
    elif authority.count(":") == 1:
        host, port_text = authority.split(":")
    else:
        host, port_text = authority, ""
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise _Refused("400 Bad Request", f"bad port in {authority!r}") from None
    if not host or not 0 < port < 65536:
        raise _Refused("400 Bad Request", f"bad address {authority!r}")
    return host, port


def authorize(host: str, port: int) -> list[str]:
    """The addresses a sandbox may connect to for host:port, or _Refused saying why.

    The port is judged before a name is resolved (no lookup for what is refused anyway); an
    address literal is judged by the guard first, so a refused loopback address is named as such
    rather than as a closed port."""
    if _is_address(host):
        addresses = _guarded(host, port)
        _check_port(host, port)
        return addresses
    _check_port(host, port)
    return _guarded(host, port)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _guarded(host: str, port: int) -> list[str]:
    try:
        return checked_addresses(host, port)
    except OutboundRefused as exc:
        raise _Refused("403 Forbidden", str(exc)) from None


def _check_port(host: str, port: int) -> None:
    if port not in settings.XAGENT_SANDBOX_EGRESS_PORTS and not is_allow_listed(host, port):
        allowed = ", ".join(str(p) for p in settings.XAGENT_SANDBOX_EGRESS_PORTS) or "none"
        raise _Refused(
            "403 Forbidden",
            f"port {port} is not open for sandbox egress (open ports: {allowed}; an operator may "
            "allow-list host:port in XAGENT_OUTBOUND_ALLOWED_HOSTS)",
        )


def _connect(addresses: list[str], port: int) -> socket.socket:
    last: OSError | None = None
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_SECONDS)
        except OSError as exc:
            last = exc
    raise _Refused("502 Bad Gateway", f"could not connect: {last}")


def _read_head(conn: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD_BYTES:
            raise _Refused("431 Request Header Fields Too Large", "request head too large")
        chunk = conn.recv(CHUNK)
        if not chunk:
            raise ConnectionError("closed before the request head ended")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _origin_request(head: bytes) -> tuple[str, int, bytes]:
    """(host, port, the head rewritten for the origin server) of an absolute-form request."""
    lines = head.decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ", 2)
    if not target.lower().startswith("http://"):
        raise _Refused("400 Bad Request", "send an absolute http:// URL, or CONNECT for https")
    authority, slash, path = target[len("http://") :].partition("/")
    host, port = _split_authority(authority.rpartition("@")[2], 80)
    headers = [
        line
        for line in lines[1:]
        if line and not line.lower().startswith(("proxy-", "connection:", "keep-alive:"))
    ]
    rewritten = "\r\n".join([f"{method} {slash or '/'}{path} {version}", *headers, "Connection: close"])
    return host, port, rewritten.encode("latin-1") + b"\r\n\r\n"


class EgressProxy:
    """The worker side of one sandbox's egress (module docstring). `directory` is bound into the
    sandbox at `SANDBOX_DIR/egress`; `close()` ends every connection of it."""

    def __init__(self, uid: int, gid: int, label: str = ""):
        self.label = label
        # /tmp, not $TMPDIR: bwrap resolves the path as the sandbox uid, and a private TMPDIR
        # (under /root, say) would be out of its reach.
        self.directory = tempfile.mkdtemp(prefix="xagent-egress-", dir=SOCKET_ROOT)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.connections = 0
        self.refused = 0
        try:
            os.chmod(self.directory, 0o711)  # the sandbox uid resolves the path; nobody lists it
            path = os.path.join(self.directory, SOCKET_NAME)
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(path)
            if os.geteuid() == 0:
                os.chown(path, uid, gid)
            os.chmod(path, 0o600)
            self._listener.listen(MAX_CONNECTIONS)
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        self._thread = threading.Thread(target=self._serve, name="sandbox-egress", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            for sock in list(self._open):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._thread.join(timeout=2)
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> EgressProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- serving -------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                busy = len(self._open) >= MAX_CONNECTIONS * 2  # two sockets per connection
                if not busy:
                    self._open.add(conn)
            if busy:
                conn.sendall(_response("503 Service Unavailable", "too many connections at once"))
                conn.close()
                continue
            threading.Thread(
                target=self._handle, args=(conn,), name="sandbox-egress-conn", daemon=True
            ).start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.add(sock)

    def _forget(self, *socks: socket.socket | None) -> None:
        with self._lock:
            for sock in socks:
                if sock is not None:
                    self._open.discard(sock)
                    sock.close()

    def _handle(self, conn: socket.socket) -> None:
        upstream: socket.socket | None = None
        target = "?"
        try:
            conn.settimeout(HEAD_TIMEOUT_SECONDS)
            head, rest = _read_head(conn)
            first = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = first.split(" ")
            if len(parts) != 3:
                raise _Refused("400 Bad Request", "malformed request line")
            if parts[0].upper() == "CONNECT":
                host, port = _split_authority(parts[1], 443)
                target = f"{host}:{port}"
                upstream = _connect(authorize(host, port), port)
                self._track(upstream)
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                first_bytes = rest
            else:
                host, port, rewritten = _origin_request(head)
                target = f"{host}:{port}"
                upstream = _connect(authorize(host, port), port)
                self._track(upstream)
                first_bytes = rewritten + rest
            self.connections += 1
            logger.info("sandbox egress %s: allowed %s", self.label, target)
            if first_bytes:
                upstream.sendall(first_bytes)
            self._relay(conn, upstream)
        except _Refused as refusal:
            self.refused += 1
            logger.info("sandbox egress %s: refused %s (%s)", self.label, target, refusal.reason)
            try:
                conn.sendall(_response(refusal.status, refusal.reason))
            except OSError:
                pass
        except (OSError, ValueError, ConnectionError):
            pass
        finally:
            self._forget(conn, upstream)

    def _relay(self, a: socket.socket, b: socket.socket) -> None:
        a.settimeout(None)
        b.settimeout(None)
        peers = {a: b, b: a}
        sel = selectors.DefaultSelector()
        for sock in peers:
            sel.register(sock, selectors.EVENT_READ)
        open_ends = 2
        try:
            while open_ends and not self._closed.is_set():
                ready = sel.select(timeout=IDLE_TIMEOUT_SECONDS)
                if not ready:
                    return  # idle too long
                for key, _ in ready:
                    sock = key.fileobj
                    try:
                        data = sock.recv(CHUNK)
                    except OSError:
                        data = b""
                    if data:
                        peers[sock].sendall(data)
                        continue
                    sel.unregister(sock)
                    open_ends -= 1
                    try:
                        peers[sock].shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
        finally:
            sel.close()

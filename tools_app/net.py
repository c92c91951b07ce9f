"""The outbound network guard: where the product may connect on a tenant's behalf (ARCHITECTURE §7).

Tenant admins configure endpoints the product then connects to (Streamable HTTP MCP servers,
model base URLs). Without a guard they could point it at the host's loopback services, the
private network or the cloud metadata endpoint. This module owns the rule:

- the URL is http(s) with a host;
- every address the host resolves to is public: loopback, link-local, private, shared (CGNAT),
  multicast, unspecified, reserved and metadata addresses are refused, unless the host (or
  host:port) is listed in `settings.XAGENT_OUTBOUND_ALLOWED_HOSTS`;
- the check runs at every connect, inside the HTTP transport, and the connection goes to the
  address that was checked (pinned), so a second DNS answer (rebinding) cannot differ.

Endpoints set by operators (superusers, manage.py, the OPENAI_BASE_URL default) are not
guarded; callers decide that and use `guarded_transport` / `async_guarded_transport` only for
tenant endpoints. Refusals name the rule, never anything the target said.

`resolve_host` is looked up at call time, so tests (or a deployment) can replace it.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from typing import TypeVar
from urllib.parse import urlsplit

import httpcore2
import httpx2
from django.conf import settings
from httpcore2._backends.auto import AutoBackend
from httpcore2._backends.sync import SyncBackend

E = TypeVar("E", bound=BaseException)

METADATA_ADDRESSES = frozenset(
    {
        ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure, OpenStack, ...
        ipaddress.ip_address("fd00:ec2::254"),  # AWS over IPv6
        ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
    }
)
SHARED_ADDRESS_SPACE = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT, RFC 6598

Resolver = Callable[[str, int], list[str]]


class OutboundRefused(Exception):
    """A connection the guard refused. `str(error)` names the rule, fit for an admin or a model."""

    def __init__(self, message: str, *, rule: str):
        super().__init__(message)
        self.rule = rule


def resolve_host(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (IP literals resolve to themselves)."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    return list(dict.fromkeys(info[4][0] for info in infos))


def _resolver() -> Resolver:
    return resolve_host  # looked up at call time: replaceable


def address_rule(address: str) -> str | None:
    """The name of the rule `address` breaks, or None for a public address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        # ::ffff:127.0.0.1 and friends reach the IPv4 address: judge that one.
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is not None:
            return address_rule(str(embedded))
    if ip in METADATA_ADDRESSES:
        return "metadata"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, ipaddress.IPv4Address) and ip in SHARED_ADDRESS_SPACE:
        return "private"
    if ip.is_private:
        return "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "reserved"
    return None


def _normal_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def is_allow_listed(host: str, port: int | None) -> bool:
    """True if the operator listed `host` or `host:port` in XAGENT_OUTBOUND_ALLOWED_HOSTS."""
    host = _normal_host(host)
    for entry in settings.XAGENT_OUTBOUND_ALLOWED_HOSTS:
        entry = str(entry).strip().lower()
        if not entry:
            continue
        if entry.startswith("["):  # [v6]:port or [v6]
            listed_host, _, rest = entry[1:].partition("]")
            listed_port = rest.removeprefix(":") or None
        elif entry.count(":") == 1:
            listed_host, listed_port = entry.split(":")
        else:  # a name, an IPv4 address, or a bare IPv6 address
            listed_host, listed_port = entry, None
        if _normal_host(listed_host) != host:
            continue
        if listed_port is None or (port is not None and listed_port == str(port)):
            return True
    return False


def split_url(url: str) -> tuple[str, int]:
    """(host, port) of an http(s) URL; OutboundRefused for any other scheme or no host."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise OutboundRefused(f"The URL {url!r} is not a valid URL.", rule="scheme") from None
    if parts.scheme not in ("http", "https"):
        raise OutboundRefused(
            "Outbound guard: only http:// and https:// URLs are allowed for tenant endpoints.",
            rule="scheme",
        )
    if not parts.hostname:
        raise OutboundRefused("Outbound guard: the URL has no host.", rule="scheme")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def checked_addresses(host: str, port: int, resolver: Resolver | None = None) -> list[str]:
    """Resolve `host` and return its addresses if every one is allowed; else OutboundRefused.

    An allow-listed host is resolved but not checked.
    """
    addresses = (resolver or _resolver())(_normal_host(host), port)
    if not addresses:
        raise OutboundRefused(
            f"Outbound guard: the host {host!r} does not resolve to any address.", rule="unresolvable"
        )
    if is_allow_listed(host, port):
        return addresses
    for address in addresses:
        rule = address_rule(address)
        if rule is not None:
            raise OutboundRefused(
                f"Outbound guard: {host!r} resolves to a {rule} address; tenant endpoints must be "
                "public unless an operator lists the host in XAGENT_OUTBOUND_ALLOWED_HOSTS.",
                rule=rule,
            )
    return addresses


def check_url(url: str, resolver: Resolver | None = None) -> list[str]:
    """The save-time check of a tenant URL (the connect-time one runs again in the transport)."""
    host, port = split_url(url)
    return checked_addresses(host, port, resolver)


# --- transports -----------------------------------------------------------------------------


def _guarded_addresses(host: str, port: int, resolver: Resolver | None, trusted: str) -> list[str]:
    """The addresses a guarded client may connect to: `trusted` ("host:port", from `origin_of`)
    is one endpoint an operator chose, reached unchecked; every other host is checked as a
    tenant endpoint."""
    if trusted and f"{_normal_host(host)}:{port}" == trusted:
        return (resolver or _resolver())(_normal_host(host), port)
    return checked_addresses(host, port, resolver)


class GuardedBackend(SyncBackend):
    """httpcore's socket backend, connecting only to checked addresses (`trusted`: as below)."""

    def __init__(self, resolver: Resolver | None = None, refusals: list | None = None, trusted: str = ""):
        self.resolver = resolver
        self.refusals = refusals if refusals is not None else []
        self.trusted = trusted

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        try:
            addresses = _guarded_addresses(host, port, self.resolver, self.trusted)
        except OutboundRefused as exc:
            self.refusals.append(exc)
            raise
        return _first_connecting(
            addresses,
            lambda address: super(GuardedBackend, self).connect_tcp(
                address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
            ),
        )


class AsyncGuardedBackend(AutoBackend):
    """The async counterpart (anyio, as the MCP SDK runs it).

    `trusted` ("host:port", from `origin_of`) is one endpoint an operator chose, reached
    unchecked; every other host this client is sent to (say, the OAuth endpoints that server's
    metadata names) is checked as a tenant endpoint.
    """

    def __init__(self, resolver: Resolver | None = None, refusals: list | None = None, trusted: str = ""):
        self.resolver = resolver
        self.refusals = refusals if refusals is not None else []
        self.trusted = trusted

    def _addresses(self, host: str, port: int) -> list[str]:
        return _guarded_addresses(host, port, self.resolver, self.trusted)

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        import anyio.to_thread

        try:
            addresses = await anyio.to_thread.run_sync(self._addresses, host, port)
        except OutboundRefused as exc:
            self.refusals.append(exc)
            raise
        last_error: Exception | None = None
        for address in addresses:
            try:
                return await super().connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except httpcore2.ConnectError as exc:
                last_error = exc
        raise last_error or httpcore2.ConnectError("no address to connect to")


def _first_connecting(addresses: Iterable[str], connect):
    last_error: Exception | None = None
    for address in addresses:
        try:
            return connect(address)
        except httpcore2.ConnectError as exc:
            last_error = exc
    raise last_error or httpcore2.ConnectError("no address to connect to")


def _install(transport, backend):
    # httpx exposes no network-backend option; its pool creates connections lazily with this one.
    pool = transport._pool
    if not hasattr(pool, "_network_backend"):  # pragma: no cover - a changed httpx2 fails loudly
        raise RuntimeError(
            "httpx2's connection pool has no _network_backend: the outbound guard cannot attach"
        )
    pool._network_backend = backend
    transport.refusals = backend.refusals
    return transport


def guarded_transport(resolver: Resolver | None = None, trusted: str = "", **kwargs) -> httpx2.HTTPTransport:
    """An httpx2 transport for tenant endpoints. It ignores proxy variables of the environment
    (an explicit transport does), so the guard sees the real destination."""
    return _install(httpx2.HTTPTransport(**kwargs), GuardedBackend(resolver, trusted=trusted))


def async_guarded_transport(
    resolver: Resolver | None = None, trusted: str = "", **kwargs
) -> httpx2.AsyncHTTPTransport:
    return _install(httpx2.AsyncHTTPTransport(**kwargs), AsyncGuardedBackend(resolver, trusted=trusted))


def origin_of(url: str) -> str:
    """ "host:port" of an http(s) URL, as `AsyncGuardedBackend(trusted=...)` compares it."""
    host, port = split_url(url)
    return f"{_normal_host(host)}:{port}"


def exception_in(exc: BaseException | None, kind: type[E]) -> E | None:
    """The `kind` exception behind `exc` (through causes, contexts and exception groups), if any."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kind):
            return current
        if isinstance(current, BaseExceptionGroup):
            stack.extend(current.exceptions)
        stack.extend([current.__cause__, current.__context__])
    return None


def refusal_in(exc: BaseException | None) -> OutboundRefused | None:
    """The OutboundRefused behind `exc`, if any."""
    return exception_in(exc, OutboundRefused)

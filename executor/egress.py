"""Where ``http_request`` may connect: public addresses, and what the operator allows.

A model chooses the URL, and a model can be talked into anything by the text
it reads (prompt injection), so ``http_request`` is a server-side request
forgery tool unless it refuses internal targets: loopback, private networks,
link-local addresses and the cloud metadata services (169.254.169.254 hands
out the host's credentials on AWS, GCP and Azure). The check runs in an httpx
transport, so it holds for every hop of a redirect, and it runs on the
resolved address, then connects to that same address (the host name stays in
the Host header and TLS SNI): a name that resolves to a public address when
checked and to 127.0.0.1 when connecting (DNS rebinding) cannot slip through.

IPv6 addresses that carry an IPv4 address inside them are judged by what
they carry: a NAT64 gateway turns ``64:ff9b::a9fe:a9fe`` into 169.254.169.254,
a 6to4 relay ``2002:a9fe:a9fe::`` likewise, and a host's own stack treats
``::127.0.0.1`` (IPv4-compatible) and ``::ffff:0:7f00:1`` (IPv4-translated) as
the IPv4 address. The translation prefixes are refused as such too, unless the
operator allows them, since whatever sits behind the translator is reached.

``TOOLEXEC_HTTP_ALLOW`` lists what is reachable nonetheless: host names
(``internal.example``, ``*.svc.cluster.local``), addresses and networks
(``127.0.0.1``, ``10.0.0.0/8``, ``fd00::/8``). A listed *name* never reaches a
link-local or metadata address: whoever controls the name's DNS record could
point it at 169.254.169.254, so such an address is reached only when it is
listed as an address or network itself.

Python's ``ipaddress`` tables lag the IANA special-purpose registry; the
ranges it still calls global though they are not ordinary Internet hosts are
refused here by name (:data:`SPECIAL_V6`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from toolexec.errors import ConfigurationError, ForbiddenError

__all__ = [
    "AsyncGuardedTransport",
    "EgressPolicy",
    "GuardedTransport",
    "embedded_ipv4",
    "forbidden_reason",
    "link_local_or_metadata",
    "resolve",
    "resolve_async",
]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]
AsyncResolver = Callable[[str, int], Awaitable[list[str]]]

#: Instance metadata services: AWS, GCP, Azure, OpenStack (169.254.169.254), AWS over
#: IPv6, ECS task metadata, Alibaba Cloud.
METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "fd00:ec2::254", "169.254.170.2", "100.100.100.200")
)


#: IPv6 ranges that are not public hosts though ``ipaddress`` (Python 3.11) calls them
#: global: site-local, deprecated by RFC 3879 but still routed inside some networks;
#: the documentation prefix of RFC 9637; SRv6 segment identifiers (RFC 9602), which
#: steer a packet through a provider's internal nodes.
SPECIAL_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (ipaddress.IPv6Network("fec0::/10"), "a deprecated site-local address"),
    (ipaddress.IPv6Network("3fff::/20"), "a documentation address"),
    (ipaddress.IPv6Network("5f00::/16"), "an SRv6 segment identifier"),
)

_LOW32 = 0xFFFFFFFF

#: IPv6 prefixes whose addresses stand for an IPv4 one: (network, its name with an
#: article, the bit shift of the IPv4 address inside; None when the prefix length
#: varies, so it cannot be decoded).
_TRANSLATIONS: tuple[tuple[ipaddress.IPv6Network, str, int | None], ...] = (
    (ipaddress.IPv6Network("64:ff9b::/96"), "a NAT64", 0),  # RFC 6052 well-known prefix
    (ipaddress.IPv6Network("64:ff9b:1::/48"), "a local-use NAT64", None),  # RFC 8215
    (ipaddress.IPv6Network("2002::/16"), "a 6to4", 80),  # RFC 3056: bits 16-47
    (ipaddress.IPv6Network("::ffff:0:0:0/96"), "an IPv4-translated", 0),  # RFC 2765 (SIIT)
    (ipaddress.IPv6Network("::/96"), "an IPv4-compatible", 0),  # RFC 4291, deprecated
)


def embedded_ipv4(address: Address) -> tuple[str, ipaddress.IPv4Address | None] | None:
    """The kind of translation address ``address`` is and the IPv4 address inside it.

    None for an ordinary address (IPv4, IPv4-mapped, or plain IPv6); ``::`` and
    ``::1`` are the unspecified and loopback addresses, not IPv4-compatible ones.
    """
    if not isinstance(address, ipaddress.IPv6Address) or int(address) <= 1:
        return None
    for network, kind, shift in _TRANSLATIONS:
        if address in network:
            inner = None if shift is None else (int(address) >> shift) & _LOW32
            return kind, None if inner is None else ipaddress.IPv4Address(inner)
    return None


def forbidden_reason(address: Address) -> str | None:
    """Why ``address`` is not public (None when it is): the words a refusal uses."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    translated = embedded_ipv4(address)
    if translated is not None:
        kind, inner = translated
        inner_reason = None if inner is None else forbidden_reason(inner)
        if inner_reason is not None:
            return f"{inner_reason} ({inner}) embedded in {kind} address"
        return f"{kind} address, which reaches whatever the translator forwards it to"
    special = next((why for net, why in SPECIAL_V6 if address in net), None)
    checks = (
        (address in METADATA, "a cloud metadata service"),
        (address.is_loopback, "a loopback address"),
        (address.is_link_local, "a link-local address"),
        (special is not None, special or ""),
        (address.is_private, "a private address"),
        (address.is_multicast, "a multicast address"),
        (not address.is_global, "not a public address"),
    )
    return next((why for bad, why in checks if bad), None)


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, in the resolver's order of preference."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class EgressPolicy:
    """The operator's exceptions to "public addresses only"."""

    networks: tuple[Network, ...] = ()
    hosts: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> EgressPolicy:
        """From ``TOOLEXEC_HTTP_ALLOW`` entries: host names, ``*.suffix``, IPs or CIDRs."""
        networks: list[Network] = []
        hosts: set[str] = set()
        suffixes: list[str] = []
        for raw in entries:
            entry = raw.strip().lower()
            if not entry:
                continue
            if entry.startswith("*."):
                suffixes.append(entry[1:])
            elif _looks_numeric(entry):
                networks.append(_network(entry))
            else:
                hosts.add(entry.rstrip("."))
        return cls(tuple(networks), frozenset(hosts), tuple(suffixes))

    def allows_host(self, host: str) -> bool:
        name = host.lower().rstrip(".")
        return name in self.hosts or name.endswith(self.suffixes)

    def allows(self, address: Address) -> bool:
        """Public, or listed; a listed translation prefix still has its IPv4 address judged."""
        if forbidden_reason(address) is None:
            return True
        if not any(address in n for n in self.networks):
            return False
        translated = embedded_ipv4(address)
        return translated is None or translated[1] is None or self.allows(translated[1])

    def listed(self, address: Address) -> bool:
        """Whether an address or network entry names ``address`` itself."""
        return any(address in n for n in self.networks)

    def pick(self, url: str, host: str, addresses: list[str]) -> str:
        """The first address ``host`` may be reached at; ``forbidden`` when there is none.

        A listed name may reach internal addresses, but not a link-local or
        metadata one that is not listed as an address: see the module doc.
        """
        parsed = [ipaddress.ip_address(a.split("%", 1)[0]) for a in addresses]
        by_name = self.allows_host(host)
        for raw, address in zip(addresses, parsed, strict=True):
            if by_name and (not link_local_or_metadata(address) or self.listed(address)):
                return raw
            if self.allows(address):
                return raw
        raise _refusal(url, host, parsed[0])


def link_local_or_metadata(address: Address) -> bool:
    """Whether ``address``, or the IPv4 address it carries, is link-local or a metadata service.

    These hand out a host's credentials; the allowance of a name never covers them.
    """
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    translated = embedded_ipv4(address)
    if translated is not None and translated[1] is not None:
        return link_local_or_metadata(translated[1])
    return address in METADATA or address.is_link_local


def _looks_numeric(entry: str) -> bool:
    return ":" in entry or entry.replace(".", "").replace("/", "").isdigit()


def _network(entry: str) -> Network:
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError as exc:
        raise ConfigurationError(
            f"TOOLEXEC_HTTP_ALLOW: {entry!r} is not an address or network ({exc}); "
            "use e.g. 127.0.0.1, 10.0.0.0/8 or a host name"
        ) from exc


def _refusal(url: str, host: str, address: Address) -> ForbiddenError:
    reason = forbidden_reason(address) or "not allowed"
    where = host if host == str(address) else f"{host} ({address})"
    return ForbiddenError(
        f"http_request refused {url}: {where} is {reason}, which tools may not reach unless "
        "the operator allows it in TOOLEXEC_HTTP_ALLOW",
        suggestion="Use a public http(s) URL; internal and cloud-metadata addresses are not "
        "reachable from this tool. Do not retry this URL.",
        details={"url": url, "host": host, "address": str(address), "reason": reason},
    )


def _target(request: httpx.Request) -> tuple[str, int]:
    """The host and port a request goes to; a scheme other than http(s) is refused here
    too, so no transport below ever sees one (and the refusal is permanent)."""
    url = request.url
    if url.scheme not in ("http", "https"):
        raise httpx.UnsupportedProtocol(
            f"http_request reaches only http and https URLs, not {url.scheme!r}", request=request
        )
    return url.host, url.port or (443 if url.scheme == "https" else 80)


def _pinned(request: httpx.Request, address: str) -> httpx.Request:
    """``request`` sent to ``address``, with the name kept in Host and TLS SNI."""
    url = request.url
    extensions: dict[str, Any] = dict(request.extensions)
    if url.scheme == "https":
        extensions["sni_hostname"] = url.host  # certificate checked against the name
    return httpx.Request(
        request.method,
        url.copy_with(host=address),
        headers=request.headers,  # keeps Host: the name, not the address
        stream=request.stream,
        extensions=extensions,
    )


class GuardedTransport(httpx.BaseTransport):
    """Checks each request's resolved address, then connects to exactly that address."""

    def __init__(
        self,
        policy: EgressPolicy,
        transport: httpx.BaseTransport | None = None,
        resolver: Resolver = resolve,
    ) -> None:
        self.policy = policy
        self.transport = transport or httpx.HTTPTransport()
        self.resolver = resolver

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        host, port = _target(request)
        try:
            addresses = self.resolver(host, port)
        except OSError as exc:
            raise httpx.ConnectError(f"cannot resolve {host}: {exc}", request=request) from exc
        address = self.policy.pick(str(request.url), host, addresses)
        return self.transport.handle_request(_pinned(request, address))

    def close(self) -> None:
        self.transport.close()


async def resolve_async(host: str, port: int) -> list[str]:
    """:func:`resolve` on the event loop's resolver threads: cancelling waits for nothing."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class AsyncGuardedTransport(httpx.AsyncBaseTransport):
    """:class:`GuardedTransport` for ``httpx.AsyncClient``: the same check, the same pinning.

    ``http_request`` runs on an event loop so that its time limit cancels the
    download itself (a thread can only be abandoned, and goes on reading).
    """

    def __init__(
        self,
        policy: EgressPolicy,
        transport: httpx.AsyncBaseTransport | None = None,
        resolver: AsyncResolver = resolve_async,
    ) -> None:
        self.policy = policy
        self.transport = transport or httpx.AsyncHTTPTransport()
        self.resolver = resolver

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host, port = _target(request)
        try:
            addresses = await self.resolver(host, port)
        except OSError as exc:
            raise httpx.ConnectError(f"cannot resolve {host}: {exc}", request=request) from exc
        address = self.policy.pick(str(request.url), host, addresses)
        return await self.transport.handle_async_request(_pinned(request, address))

    async def aclose(self) -> None:
        await self.transport.aclose()

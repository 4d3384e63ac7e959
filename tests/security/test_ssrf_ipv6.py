"""Issue 18, item 6: SSRF through IPv6 forms that carry an IPv4 address.

A NAT64 gateway, a 6to4 relay or the host's own stack turns each of these into
the IPv4 address inside it, so each must be judged by that address, and the
translation prefixes refused as such unless the operator lists them. The
transport is given a resolver that answers the attack address, so nothing is
contacted and no DNS is asked; a refusal is a ``forbidden`` before connecting.
"""

from __future__ import annotations

import contextlib
import ipaddress

import httpx
import pytest

from toolexec.egress import EgressPolicy, GuardedTransport, embedded_ipv4, forbidden_reason
from toolexec.errors import ErrorType, ForbiddenError

ATTACKS = {
    "64:ff9b::a9fe:a9fe": ("a cloud metadata service", "169.254.169.254"),
    "64:ff9b::7f00:1": ("a loopback address", "127.0.0.1"),
    "2002:a9fe:a9fe::": ("a cloud metadata service", "169.254.169.254"),
    "::127.0.0.1": ("a loopback address", "127.0.0.1"),
    "::ffff:0:7f00:1": ("a loopback address", "127.0.0.1"),
    "64:ff9b::a00:1": ("a private address", "10.0.0.1"),
    "2002:c0a8:101::1": ("a private address", "192.168.1.1"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_an_embedded_internal_ipv4_address_is_refused_for_what_it_carries(attack: str) -> None:
    reason, inner = ATTACKS[attack]

    why = forbidden_reason(ipaddress.ip_address(attack))

    assert why is not None and why.startswith(reason)
    assert inner in why


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_the_transport_refuses_before_connecting(attack: str) -> None:
    """Given a name that resolves to the attack address, the request never leaves."""
    connected: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        connected.append(request)
        return httpx.Response(200)

    transport = GuardedTransport(
        EgressPolicy(),
        transport=httpx.MockTransport(record),
        resolver=lambda host, port: [attack],
    )
    with (
        httpx.Client(transport=transport, trust_env=False) as client,
        pytest.raises(ForbiddenError) as caught,
    ):
        client.get("http://innocent.example/latest/meta-data/")

    assert caught.value.error_type is ErrorType.FORBIDDEN
    assert connected == []


@pytest.mark.parametrize("address", ["64:ff9b::808:808", "2002:808:808::1", "64:ff9b:1::1"])
def test_translation_prefixes_are_refused_even_to_public_addresses(address: str) -> None:
    why = forbidden_reason(ipaddress.ip_address(address))

    assert why is not None and "translator" in why


def test_an_allowed_translation_prefix_still_judges_the_address_inside() -> None:
    """An operator who runs NAT64 may list its prefix; loopback behind it stays refused."""
    policy = EgressPolicy.parse(["64:ff9b::/96"])

    assert policy.allows(ipaddress.ip_address("64:ff9b::808:808"))
    assert not policy.allows(ipaddress.ip_address("64:ff9b::7f00:1"))
    assert not policy.allows(ipaddress.ip_address("64:ff9b::a9fe:a9fe"))


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("::1", None),
        ("::", None),
        ("::ffff:127.0.0.1", None),  # mapped: judged as IPv4 already
        ("2606:4700:4700::1111", None),
        ("64:ff9b::a9fe:a9fe", ("a NAT64", "169.254.169.254")),
        ("2002:a9fe:a9fe::", ("a 6to4", "169.254.169.254")),
    ],
)
def test_embedded_addresses_are_decoded(address: str, expected: tuple[str, str] | None) -> None:
    found = embedded_ipv4(ipaddress.ip_address(address))

    assert (None if found is None else (found[0], str(found[1]))) == expected


def test_ordinary_addresses_keep_their_verdicts() -> None:
    assert forbidden_reason(ipaddress.ip_address("::1")) == "a loopback address"
    assert forbidden_reason(ipaddress.ip_address("2606:4700:4700::1111")) is None
    assert forbidden_reason(ipaddress.ip_address("::ffff:8.8.8.8")) is None


# Issue 22, item 11: IPv6 ranges Python 3.11's tables still call global, and an allow-listed
# name pointed at the metadata service. Before: all allowed (the request was sent).

SPECIAL = {
    "fec0::1": "a deprecated site-local address",
    "fec0:0:0:1::a9fe:a9fe": "a deprecated site-local address",
    "3fff::1": "a documentation address",
    "3fff:fff:ffff::1": "a documentation address",
    "5f00::1": "an SRv6 segment identifier",
}


def _sent_through(policy: EgressPolicy, answer: str, url: str) -> list[httpx.Request]:
    """The requests that reached the network side when ``url``'s name resolves to ``answer``."""
    connected: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        connected.append(request)
        return httpx.Response(200)

    transport = GuardedTransport(
        policy, transport=httpx.MockTransport(record), resolver=lambda host, port: [answer]
    )
    with (
        httpx.Client(transport=transport, trust_env=False) as client,
        contextlib.suppress(ForbiddenError),
    ):
        client.get(url)
    return connected


@pytest.mark.parametrize("address", sorted(SPECIAL))
def test_special_ipv6_ranges_are_refused_before_connecting(address: str) -> None:
    assert forbidden_reason(ipaddress.ip_address(address)) == SPECIAL[address]
    assert _sent_through(EgressPolicy(), address, "http://innocent.example/") == []


def test_the_neighbours_of_the_special_ranges_stay_public() -> None:
    for address in ("fbff:ffff::1", "3fff:1000::1", "5f01::1", "2606:4700:4700::1111"):
        assert forbidden_reason(ipaddress.ip_address(address)) is None, address


@pytest.mark.parametrize(
    "answer", ["169.254.169.254", "169.254.10.1", "fe80::1", "64:ff9b::a9fe:a9fe", "fd00:ec2::254"]
)
def test_an_allow_listed_name_never_reaches_link_local_or_metadata(answer: str) -> None:
    """The name's DNS record is not the operator's to vouch for: only a listed address is."""
    policy = EgressPolicy.parse(["internal.example", "*.svc.example"])

    assert _sent_through(policy, answer, "http://internal.example/latest/meta-data/") == []
    assert _sent_through(policy, answer, "http://db.svc.example/") == []


def test_a_link_local_address_listed_as_such_is_reached_by_name() -> None:
    policy = EgressPolicy.parse(["internal.example", "169.254.169.254"])

    sent = _sent_through(policy, "169.254.169.254", "http://internal.example/latest/")

    assert [r.url.host for r in sent] == ["169.254.169.254"]
    assert sent[0].headers["host"] == "internal.example"


def test_an_allow_listed_name_still_reaches_the_internal_address_it_names() -> None:
    policy = EgressPolicy.parse(["internal.example"])

    sent = _sent_through(policy, "10.0.0.5", "http://internal.example/")

    assert [r.url.host for r in sent] == ["10.0.0.5"]

"""What http_request may reach: address classes, the allow-list, and the transport that pins
each connection to the address it checked (a real local HTTP server, resolvers injected)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

import httpx
import pytest

from toolexec.egress import EgressPolicy, GuardedTransport, forbidden_reason
from toolexec.errors import ConfigurationError, ErrorType, ForbiddenError
from toolexec.testing import FlakyServer, Reply

LOOPBACK_ONLY = EgressPolicy.parse(["127.0.0.1"])


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "a loopback address"),
        ("::1", "a loopback address"),
        ("::ffff:127.0.0.1", "a loopback address"),
        ("10.1.2.3", "a private address"),
        ("172.16.0.1", "a private address"),
        ("192.168.1.1", "a private address"),
        ("fc00::1", "a private address"),
        ("169.254.169.254", "a cloud metadata service"),
        ("fd00:ec2::254", "a cloud metadata service"),
        ("100.100.100.200", "a cloud metadata service"),
        ("169.254.1.1", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("224.0.0.1", "a multicast address"),
        ("100.64.0.1", "not a public address"),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_addresses_are_classified(address: str, reason: str | None) -> None:
    assert forbidden_reason(ipaddress.ip_address(address)) == reason


def test_the_allow_list_takes_hosts_wildcards_addresses_and_networks() -> None:
    policy = EgressPolicy.parse(
        ["127.0.0.1", " 10.0.0.0/8", "*.svc.local", "Internal.Example.", ""]
    )

    assert policy.allows(ipaddress.ip_address("10.9.9.9"))
    assert policy.allows(ipaddress.ip_address("127.0.0.1"))
    assert not policy.allows(ipaddress.ip_address("127.0.0.2"))
    assert not policy.allows(ipaddress.ip_address("192.168.0.1"))
    assert policy.allows_host("api.svc.local") and policy.allows_host("internal.example")
    assert not policy.allows_host("svc.local.evil.example")


def test_a_malformed_network_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="TOOLEXEC_HTTP_ALLOW"):
        EgressPolicy.parse(["10.0.0.0/33"])


@pytest.fixture(scope="module")
def service() -> Iterator[FlakyServer]:
    with FlakyServer() as server:
        yield server


@pytest.fixture(scope="module")
def other_loopback() -> Iterator[FlakyServer]:
    """A server on 127.0.0.2: loopback, but not on a 127.0.0.1-only allow-list."""
    with FlakyServer(host="127.0.0.2") as server:
        yield server


def _client(policy: EgressPolicy, **kwargs: object) -> httpx.Client:
    return httpx.Client(
        transport=GuardedTransport(policy, **kwargs),  # type: ignore[arg-type]
        follow_redirects=True,
        trust_env=False,
        timeout=5,
    )


def test_loopback_is_refused_by_default_and_never_contacted(service: FlakyServer) -> None:
    path = service.unique_path("default")
    url = service.script(path, Reply(200))

    with _client(EgressPolicy()) as client, pytest.raises(ForbiddenError) as caught:
        client.get(url)

    assert caught.value.error_type is ErrorType.FORBIDDEN
    assert "a loopback address" in caught.value.message
    assert "TOOLEXEC_HTTP_ALLOW" in caught.value.message
    assert service.hits(path) == []


def test_an_allowed_address_is_reached(service: FlakyServer) -> None:
    path = service.unique_path("allowed")
    url = service.script(path, Reply(200, {"fine": True}))

    with _client(LOOPBACK_ONLY) as client:
        response = client.get(url)

    assert response.json() == {"fine": True}
    assert len(service.hits(path)) == 1


def test_a_redirect_to_a_forbidden_address_is_refused_before_connecting(
    service: FlakyServer, other_loopback: FlakyServer
) -> None:
    """The allowed service redirects to 127.0.0.2; that hop is checked and never made."""
    target = other_loopback.unique_path("target")
    hidden = other_loopback.script(target, Reply(200))
    path = service.unique_path("redirect")
    url = service.script(path, Reply(302, {}, headers={"location": hidden}))

    with _client(LOOPBACK_ONLY) as client, pytest.raises(ForbiddenError) as caught:
        client.get(url)

    assert caught.value.details["address"] == "127.0.0.2"
    assert len(service.hits(path)) == 1
    assert other_loopback.hits(target) == []


def test_a_redirect_to_the_metadata_service_is_refused(service: FlakyServer) -> None:
    path = service.unique_path("to-metadata")
    url = service.script(
        path, Reply(302, {}, headers={"location": "http://169.254.169.254/latest/meta-data/"})
    )

    with _client(LOOPBACK_ONLY) as client, pytest.raises(ForbiddenError) as caught:
        client.get(url)

    assert caught.value.details["reason"] == "a cloud metadata service"


def test_the_connection_goes_to_the_address_that_was_checked(service: FlakyServer) -> None:
    """A name resolved once, checked, then connected to by address: no second lookup that a
    DNS-rebinding server could answer differently. ``svc.test`` exists only in this resolver."""
    lookups: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        lookups.append(host)
        return ["10.0.0.7", "127.0.0.1"]  # the first is forbidden, the second allowed

    path = service.unique_path("pinned")
    service.script(path, Reply(200, {"pinned": True}))
    port = service.url.rsplit(":", 1)[1]

    with _client(LOOPBACK_ONLY, resolver=resolver) as client:
        response = client.get(f"http://svc.test:{port}{path}")

    assert response.json() == {"pinned": True}
    assert response.request.url.host == "svc.test"
    assert lookups == ["svc.test"]
    assert len(service.hits(path)) == 1


def test_an_allowed_host_name_may_resolve_anywhere(service: FlakyServer) -> None:
    path = service.unique_path("named")
    service.script(path, Reply(200))
    port = service.url.rsplit(":", 1)[1]
    policy = EgressPolicy.parse(["svc.test"])

    with _client(policy, resolver=lambda host, port: ["127.0.0.1"]) as client:
        assert client.get(f"http://svc.test:{port}{path}").status_code == 200


def test_a_name_that_does_not_resolve_is_a_connection_error() -> None:
    def resolver(host: str, port: int) -> list[str]:
        raise OSError("Name or service not known")

    with _client(EgressPolicy(), resolver=resolver) as client, pytest.raises(httpx.ConnectError):
        client.get("http://nowhere.test/")

"""Redis URLs toolexec takes: Sentinel parsing, what Celery is given, and masked passwords."""

from __future__ import annotations

import pytest
import redis

from toolexec.connection import (
    celery_url,
    parse_cluster,
    parse_sentinel,
    redact_url,
    through_blips,
)
from toolexec.errors import ConfigurationError

SENTINELS = "sentinel://:pw@s1:26379/2;sentinel://s2:26380/2;sentinel://s3/2?master_name=mymaster"


def test_a_sentinel_url_names_every_sentinel_the_master_its_database_and_password() -> None:
    target = parse_sentinel(SENTINELS)

    assert target.sentinels == [("s1", 26379), ("s2", 26380), ("s3", 26379)]
    assert (target.master, target.db, target.password) == ("mymaster", 2, "pw")


def test_a_sentinel_url_without_a_master_name_says_how_to_add_one() -> None:
    with pytest.raises(ConfigurationError, match=r"\?master_name=") as caught:
        parse_sentinel("sentinel://:secret@s1:26379/0")

    assert "secret" not in str(caught.value)


def test_celery_gets_the_sentinel_url_bare_and_the_master_name_as_a_transport_option() -> None:
    url, options = celery_url(SENTINELS)

    assert url == "sentinel://:pw@s1:26379/2;sentinel://s2:26380/2;sentinel://s3/2"
    assert options == {"master_name": "mymaster"}


def test_a_rediss_url_gets_the_certificate_check_celerys_backend_insists_on() -> None:
    url, _ = celery_url("rediss://:pw@h:6380/0?ssl_ca_certs=/ca.pem")

    assert url == "rediss://:pw@h:6380/0?ssl_ca_certs=/ca.pem&ssl_cert_reqs=required"
    assert celery_url("rediss://h/0?ssl_cert_reqs=none") == ("rediss://h/0?ssl_cert_reqs=none", {})
    assert celery_url("redis://h:6379/0") == ("redis://h:6379/0", {})


def test_passwords_are_masked_in_every_part_of_a_url() -> None:
    shown = redact_url("sentinel://:one@s1:26379/0;sentinel://:two@s2:26379/0")

    assert "one" not in shown and "two" not in shown
    assert shown == "sentinel://:***@s1:26379/0;sentinel://:***@s2:26379/0"


CLUSTER = "rediss+cluster://app:s3cret@10.0.0.1:7000,10.0.0.2:7001/0?ssl_cert_reqs=required"


def test_a_cluster_url_names_every_seed_node_its_credentials_and_tls_options() -> None:
    target = parse_cluster(CLUSTER)

    assert target.nodes == [("10.0.0.1", 7000), ("10.0.0.2", 7001)]
    assert (target.username, target.password, target.tls) == ("app", "s3cret", True)
    assert target.client_kwargs()["ssl_cert_reqs"] == "required"
    assert parse_cluster("redis+cluster://h:1").client_kwargs() == {
        "username": None,
        "password": None,
    }


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://:pw@h1:7000,h2/0", "not host:port"),
        ("redis+cluster://:pw@h1:7000/3", "only database 0"),
        ("redis+cluster://:pw@h1:7000?db=1", "unknown parameter"),
        ("redis+cluster://:pw@", "names no cluster node"),
    ],
)
def test_a_wrong_cluster_url_is_refused_saying_why_and_never_showing_the_password(
    url: str, says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says) as caught:
        parse_cluster(url)

    assert "pw" not in str(caught.value).replace("pw@", "")
    assert ":***@" in str(caught.value)


def test_a_cluster_url_is_shown_with_its_password_masked() -> None:
    assert redact_url(CLUSTER) == (
        "rediss+cluster://app:***@10.0.0.1:7000,10.0.0.2:7001/0?ssl_cert_reqs=required"
    )
    assert redact_url("redis+cluster://h1:1,h2:2") == "redis+cluster://h1:1,h2:2"


def test_through_blips_tries_again_after_a_blip_until_it_succeeds() -> None:
    outcomes: list[Exception | str] = [redis.ConnectionError("reset"), redis.TimeoutError(), "ok"]
    pauses: list[float] = []

    def write() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert through_blips(write, within_s=10, sleep=pauses.append) == "ok"
    assert len(pauses) == 2 and all(0 < p <= 1.0 for p in pauses)


def test_through_blips_gives_up_after_its_time_with_the_last_error() -> None:
    def write() -> None:
        raise redis.ConnectionError("refused")

    with pytest.raises(redis.ConnectionError):
        through_blips(write, within_s=0.0, sleep=lambda _: None)


def test_through_blips_does_not_retry_what_a_retry_cannot_cure() -> None:
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        raise redis.ResponseError("WRONGTYPE")

    with pytest.raises(redis.ResponseError):
        through_blips(write, within_s=10, sleep=lambda _: None)
    assert calls == [1]

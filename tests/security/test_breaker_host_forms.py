"""Issue 22, item 10: one host, many spellings, many breakers.

``http_request`` keeps a breaker and a retry budget per host, named from the
URL the model wrote. Before, ``127.1``, ``2130706433`` and ``127.0.0.1`` (all
dialled as 127.0.0.1 by the resolver) got three breakers: once the breaker of
one spelling opened, a model went on hammering the same failing service
through the next. Now every spelling of an address names the same breaker.
"""

from __future__ import annotations

import pytest

from toolexec.breaker import breaker_name
from toolexec.breaker.policy import host_form
from toolexec.layers.retry_budget import budget_name
from toolexec.policies import RetryBudgetPolicy

LOOPBACK_SPELLINGS = [
    "http://127.0.0.1/flaky",
    "http://127.1/flaky",
    "http://127.0.1/flaky",
    "http://2130706433/flaky",
    "http://0x7f000001/flaky",
    "http://0x7F.0.0.1/flaky",
    "http://0177.0.0.1/flaky",
    "http://017700000001/flaky",
    "http://127.0.0.1./flaky",
    "http://[::ffff:127.0.0.1]/flaky",
    "http://[::FFFF:7f00:1]:8080/flaky",
]


@pytest.mark.parametrize("url", LOOPBACK_SPELLINGS)
def test_every_spelling_of_an_address_names_one_breaker(url: str) -> None:
    assert breaker_name("http_request", "url", {"url": url}) == "http_request@127.0.0.1"


@pytest.mark.parametrize("url", LOOPBACK_SPELLINGS)
def test_the_retry_budget_agrees_with_the_breaker(url: str) -> None:
    policy = RetryBudgetPolicy(key_argument="url")

    assert budget_name("http_request", policy, {"url": url}) == "http_request@127.0.0.1"


@pytest.mark.parametrize(
    ("host", "form"),
    [
        ("2001:db8:0:0:0:0:0:1", "2001:db8::1"),
        ("api.example.com.", "api.example.com"),
        ("1.2.3.4.example", "1.2.3.4.example"),  # a name whose last label is not a number
        ("256.1.1.1", "256.1.1.1"),  # not an address: left as the name it is
        ("4294967296", "4294967296"),  # past 32 bits: not an address either
        ("0x", "0.0.0.0"),
        ("08.1.1.1", "08.1.1.1"),  # 8 is no octal digit
    ],
)
def test_host_forms(host: str, form: str) -> None:
    assert host_form(host) == form

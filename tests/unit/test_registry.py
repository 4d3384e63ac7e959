"""``@tool`` turns a typed function into a schema, a policy and a unique name."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
from pydantic import Field

from toolexec.errors import ConfigurationError, ErrorType
from toolexec.policies import Jitter, RetryPolicy, ToolPolicy
from toolexec.registry import Registry, ToolSpec, default_registry, tool


def noop() -> None:
    """Does nothing; a body for tests about declarations."""


def _spec(registry: Registry, name: str) -> ToolSpec:
    spec = registry.get(name)
    assert spec is not None, f"{name} is not registered"
    return spec


def test_a_signature_becomes_a_json_schema(registry: Registry) -> None:
    @tool(registry=registry)
    def search(
        query: Annotated[str, Field(description="What to look for.")],
        kind: Literal["web", "news"] = "web",
        limit: int = 10,
        site: str | None = None,
    ) -> list[str]:
        return []

    schema = _spec(registry, "search").json_schema()
    assert schema["type"] == "object"
    assert schema["required"] == ["query"]
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["query"]["type"] == "string"
    assert props["query"]["description"] == "What to look for."
    assert props["kind"]["enum"] == ["web", "news"]
    assert props["kind"]["default"] == "web"
    assert props["limit"] == {"default": 10, "title": "Limit", "type": "integer"}
    assert {"type": "null"} in props["site"]["anyOf"]
    assert {"type": "string"} in props["site"]["anyOf"]
    assert props["site"]["default"] is None
    assert "title" not in schema


def test_the_argument_model_applies_defaults_and_coerces(registry: Registry) -> None:
    @tool(registry=registry)
    def page(n: int, size: int = 20) -> int:
        return n * size

    model = _spec(registry, "page").arguments.model_validate({"n": "3"})
    assert (model.n, model.size) == (3, 20)  # type: ignore[attr-defined]


def test_the_docstring_becomes_the_description(registry: Registry) -> None:
    @tool(registry=registry)
    def lookup(key: str) -> str:
        """Find a value by key.

        Returns the empty string when the key is unknown.
        """
        return ""

    assert _spec(registry, "lookup").description == (
        "Find a value by key.\n\nReturns the empty string when the key is unknown."
    )


def test_an_explicit_description_and_name_win(registry: Registry) -> None:
    @tool(name="find-user", description="Look a user up.", registry=registry)
    def lookup(user_id: int) -> str:
        """Ignored."""
        return ""

    spec = _spec(registry, "find-user")
    assert spec.description == "Look a user up."
    assert spec.task_name == "tools.find-user"
    assert registry.get("lookup") is None


def test_a_function_without_docstring_is_described_by_its_name(registry: Registry) -> None:
    @tool(registry=registry)
    def ping() -> str:
        return "pong"

    assert _spec(registry, "ping").description == "ping"


def test_policy_values_reach_the_tool_policy(registry: Registry) -> None:
    @tool(
        registry=registry,
        timeout=4.5,
        max_attempts=5,
        backoff_base=0.2,
        backoff_cap=3.0,
        jitter="decorrelated",
        retry_on=frozenset({ErrorType.RATE_LIMITED}),
        queue="slow",
        side_effects=True,
    )
    def charge(amount: int) -> str:
        return "ok"

    policy = _spec(registry, "charge").policy
    assert policy == ToolPolicy(
        timeout=4.5,
        retry=RetryPolicy(
            max_attempts=5,
            base=0.2,
            cap=3.0,
            jitter=Jitter.DECORRELATED,
            retry_on=frozenset({ErrorType.RATE_LIMITED}),
        ),
        queue="slow",
        side_effects=True,
    )
    assert policy.to_json()["retry_on"] == ["rate_limited"]
    assert policy.to_json()["jitter"] == "decorrelated"


def test_a_whole_retry_policy_is_used_as_given(registry: Registry) -> None:
    given = RetryPolicy(max_attempts=7, factor=3.0, jitter=Jitter.EQUAL)

    @tool(registry=registry, retry=given)
    def fetch(url: str) -> str:
        return url

    assert _spec(registry, "fetch").policy.retry is given


def test_defaults_retry_transient_failures_three_times(registry: Registry) -> None:
    @tool(registry=registry)
    def plain() -> None:
        return None

    policy = _spec(registry, "plain").policy
    assert policy.timeout == 30.0 and policy.queue is None and not policy.side_effects
    assert policy.retry == RetryPolicy()


def test_the_catalog_entry_falls_back_to_the_default_queue(registry: Registry) -> None:
    @tool(registry=registry)
    def a() -> None: ...

    @tool(registry=registry, queue="gpu")
    def b() -> None: ...

    assert _spec(registry, "a").catalog_entry("tools")["policy"]["queue"] == "tools"
    assert _spec(registry, "b").catalog_entry("tools")["policy"]["queue"] == "gpu"


@pytest.mark.parametrize("bad", ["", "has space", "dots.are.out", "é", "x" * 65])
def test_names_that_model_apis_refuse_are_refused(registry: Registry, bad: str) -> None:
    with pytest.raises(ConfigurationError, match="must be 1-64"):
        tool(name=bad, registry=registry)(noop)


def test_a_64_character_name_is_accepted(registry: Registry) -> None:
    tool(name="n" * 64, registry=registry)(noop)
    assert registry.names() == ["n" * 64]


def test_var_args_are_refused(registry: Registry) -> None:
    def spread(*items: int) -> int:
        return sum(items)

    with pytest.raises(ConfigurationError, match=r"\*args and \*\*kwargs"):
        tool(registry=registry)(spread)


def test_var_kwargs_are_refused(registry: Registry) -> None:
    def loose(**options: Any) -> None:
        return None

    with pytest.raises(ConfigurationError):
        tool(registry=registry)(loose)
    assert len(registry) == 0


def test_a_non_positive_timeout_is_refused(registry: Registry) -> None:
    with pytest.raises(ConfigurationError):
        tool(registry=registry, timeout=0)(noop)


def test_an_unknown_jitter_is_a_configuration_error(registry: Registry) -> None:
    with pytest.raises(ConfigurationError):
        tool(registry=registry, jitter="sometimes")(noop)


def test_two_different_functions_cannot_share_a_name(registry: Registry) -> None:
    def first() -> int:
        return 1

    def second() -> int:
        return 2

    tool(name="number", registry=registry)(first)
    with pytest.raises(ConfigurationError, match="two tools are named 'number'"):
        tool(name="number", registry=registry)(second)
    assert _spec(registry, "number").func is first


def test_registering_the_same_function_again_is_allowed(registry: Registry) -> None:
    """A worker may import a tool module twice; that must not fail."""

    def echo(text: str) -> str:
        return text

    tool(registry=registry)(echo)
    tool(registry=registry, timeout=5)(echo)
    assert registry.names() == ["echo"]
    assert _spec(registry, "echo").policy.timeout == 5


def test_the_decorated_function_stays_callable_and_carries_its_spec(registry: Registry) -> None:
    @tool(registry=registry)
    def add(a: int, b: int) -> int:
        return a + b

    assert add(2, 3) == 5
    assert add.__toolexec__ is _spec(registry, "add")  # type: ignore[attr-defined]


def test_a_private_registry_keeps_its_tools_out_of_the_default_one(registry: Registry) -> None:
    @tool(registry=registry)
    def unit_test_private_probe() -> None: ...

    assert registry.names() == ["unit_test_private_probe"]
    assert default_registry.get("unit_test_private_probe") is None


def test_async_functions_are_detected(registry: Registry) -> None:
    @tool(registry=registry)
    async def later() -> int:
        return 1

    @tool(registry=registry)
    def now() -> int:
        return 1

    assert _spec(registry, "later").is_async
    assert not _spec(registry, "now").is_async


def test_subscribe_replays_existing_tools_then_sees_new_ones(registry: Registry) -> None:
    @tool(registry=registry)
    def old() -> None: ...

    seen: list[str] = []
    registry.subscribe(lambda spec: seen.append(spec.name))
    assert seen == ["old"]

    @tool(registry=registry)
    def new() -> None: ...

    assert seen == ["old", "new"]
    assert registry.names() == ["new", "old"]
    assert sorted(spec.name for spec in registry) == ["new", "old"]


@pytest.mark.parametrize(
    "flat",
    [{"max_attempts": 5}, {"backoff_base": 1.0}, {"backoff_cap": 9.0}, {"jitter": "none"}],
)
def test_a_whole_retry_policy_refuses_the_flat_retry_fields_it_would_ignore(
    registry: Registry, flat: dict[str, Any]
) -> None:
    with pytest.raises(ConfigurationError, match="retry= gives the whole retry policy"):

        @tool(registry=registry, retry=RetryPolicy(max_attempts=2), **flat)
        def fetch(x: int) -> int:
            return x


def test_the_flat_retry_fields_alone_build_the_policy_with_the_defaults_for_the_rest(
    registry: Registry,
) -> None:
    @tool(registry=registry, max_attempts=5, backoff_cap=9.0)
    def fetch(x: int) -> int:
        return x

    spec = registry.get("fetch")
    assert spec is not None
    assert spec.policy.retry == RetryPolicy(max_attempts=5, cap=9.0)

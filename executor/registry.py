"""Declaring tools: a typed function becomes a schema, a policy and a name.

``@tool`` leaves the function callable as it was and records a
:class:`ToolSpec` in a :class:`Registry`. The worker side (the ``tasks``
package) listens to the registry and turns each spec into a Celery task named
``tools.<name>``; the client never imports tool code, it reads the catalog the
workers publish.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar, get_type_hints, overload

import pydantic

from toolexec.errors import TRANSIENT_TYPES, ConfigurationError, ErrorType
from toolexec.fallback.steps import FallbackStep, check_chain
from toolexec.policies import (
    ApprovalPolicy,
    BreakerPolicy,
    Jitter,
    RateLimitPolicy,
    RetryBudgetPolicy,
    RetryPolicy,
    ToolPolicy,
)
from toolexec.strict import StrictSchemaError, strict_schema

__all__ = ["Registry", "ToolSpec", "default_registry", "tool"]

F = TypeVar("F", bound=Callable[..., Any])

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI and Anthropic accept


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool: its function, argument model and policy."""

    name: str
    description: str
    func: Callable[..., Any]
    arguments: type[pydantic.BaseModel]
    policy: ToolPolicy
    #: Whether the effect of a side-effecting call is already there; same
    #: arguments as ``func``. Asked before an uncertain write is repeated.
    check: Callable[..., Any] | None = None
    #: JSON Schema of what the tool returns; None: read from ``func``'s return annotation.
    returns: dict[str, Any] | None = None
    #: Set when the function serves an MCP resource or template (``toolexec.resources``):
    #: its URI (template), name, description and MIME type, published with the catalog.
    resource: dict[str, Any] | None = None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.func)

    @property
    def task_name(self) -> str:
        return f"tools.{self.name}"

    def json_schema(self) -> dict[str, Any]:
        schema = self.arguments.model_json_schema()
        schema.pop("title", None)
        return schema

    def catalog_entry(self, default_queue: str) -> dict[str, Any]:
        """What workers publish so that clients can validate and route calls."""
        policy = self.policy.to_json()
        policy["queue"] = self.policy.queue or default_queue
        entry = {
            "name": self.name,
            "task": self.task_name,
            "description": self.description,
            "parameters": self.json_schema(),
            "policy": policy,
        }
        if self.resource is not None:
            entry["resource"] = dict(self.resource)
        returns = self.returns if self.returns is not None else _returns_schema(self.func)
        if returns is not None:  # MCP clients are told the shape (toolexec.mcp)
            entry["returns"] = returns
        return entry


def _returns_schema(func: Callable[..., Any]) -> dict[str, Any] | None:
    """The JSON Schema of a tool's return annotation; None when absent or not JSON.

    A tool returning an ``httpx.Response`` (the executor classifies it) or ``Any``
    has no schema worth publishing.
    """
    try:
        hint = get_type_hints(func).get("return", Any)
        if hint is Any:
            return None
        return pydantic.TypeAdapter(hint).json_schema()
    except (NameError, TypeError, pydantic.PydanticUserError):
        return None


def _check_strict(spec: ToolSpec) -> None:
    """Refuse a tool OpenAI's strict mode could not be given (the Agents SDK's default).

    Maps and free-form values have strict forms (``toolexec.strict``); what has none
    would fail only later, in the request of whoever offers the tool to a model.
    """
    try:
        strict_schema(spec.json_schema())
    except StrictSchemaError as exc:
        raise ConfigurationError(
            f"tool {spec.name!r} cannot be offered to a model in OpenAI's strict mode "
            f"(the OpenAI Agents SDK's default): {exc}"
        ) from exc


def _argument_model(name: str, func: Callable[..., Any]) -> type[pydantic.BaseModel]:
    """A pydantic model of the function's parameters that refuses unknown ones."""
    hints = get_type_hints(func, include_extras=True)
    fields: dict[str, Any] = {}
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(
                f"tool {name!r}: *args and **kwargs cannot be described to a model; "
                "declare every argument by name"
            )
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    config = pydantic.ConfigDict(extra="forbid")
    return pydantic.create_model(f"{name}_arguments", __config__=config, **fields)


class Registry:
    """The tools one process knows, with listeners told of each new one."""

    def __init__(self) -> None:
        self._specs: dict[str, ToolSpec] = {}
        self._listeners: list[Callable[[ToolSpec], None]] = []
        self._lock = threading.Lock()

    def register(self, spec: ToolSpec) -> None:
        with self._lock:
            existing = self._specs.get(spec.name)
            if existing is not None and _qualname(existing.func) != _qualname(spec.func):
                raise ConfigurationError(
                    f"two tools are named {spec.name!r}: {_qualname(existing.func)} and "
                    f"{_qualname(spec.func)}; give one of them another name=..."
                )
            self._specs[spec.name] = spec
            listeners = list(self._listeners)
        for listener in listeners:
            listener(spec)

    def subscribe(self, listener: Callable[[ToolSpec], None]) -> None:
        """Call ``listener`` for every tool registered so far and from now on."""
        with self._lock:
            self._listeners.append(listener)
            specs = list(self._specs.values())
        for spec in specs:
            listener(spec)

    def get(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    def set_fallbacks(self, name: str, steps: Sequence[FallbackStep]) -> ToolSpec:
        """Give a registered tool its fallback chain, e.g. one naming tools declared later."""
        spec = self._specs.get(name)
        if spec is None:
            raise ConfigurationError(
                f"no tool named {name!r} is registered; declare it with @tool before "
                "setting its fallbacks"
            )
        chain = _checked_fallbacks(name, steps, spec.policy.side_effects)
        updated = replace(spec, policy=replace(spec.policy, fallbacks=chain))
        self.register(updated)
        return updated

    def names(self) -> list[str]:
        return sorted(self._specs)

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(list(self._specs.values()))

    def __len__(self) -> int:
        return len(self._specs)


def _qualname(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def _checked_fallbacks(
    name: str, steps: Sequence[FallbackStep] | None, side_effects: bool
) -> tuple[FallbackStep, ...]:
    if not steps:
        return ()
    return check_chain(name, steps, side_effects=side_effects)


def _checked_check(
    name: str, func: Callable[..., Any], check: Callable[..., Any] | None, side_effects: bool
) -> Callable[..., Any] | None:
    """A check takes the tool's own arguments, and only a tool that writes has one."""
    if check is None:
        return None
    if not side_effects:
        raise ConfigurationError(
            f"tool {name!r}: check= needs side_effects=True (only a write can be uncertain)"
        )
    if not callable(check):
        raise ConfigurationError(f"tool {name!r}: check must be callable, not {check!r}")
    expected = list(inspect.signature(func).parameters)
    given = list(inspect.signature(check).parameters)
    if given != expected:
        raise ConfigurationError(
            f"tool {name!r}: its check must take the tool's arguments "
            f"({', '.join(expected)}), not ({', '.join(given)})"
        )
    return check


def _retry_policy(name: str, whole: RetryPolicy | None, flat: dict[str, Any]) -> RetryPolicy:
    """``whole``, or the policy the flat fields describe; never both, one would be ignored."""
    given = sorted(field for field, value in flat.items() if value is not None)
    if whole is not None:
        if given:
            raise ConfigurationError(
                f"tool {name!r}: retry= gives the whole retry policy, so {', '.join(given)} "
                "would be ignored; put them into the RetryPolicy instead"
            )
        return whole
    try:
        jitter = Jitter(flat["jitter"] or Jitter.FULL)
    except ValueError as exc:
        raise ConfigurationError(f"tool {name!r}: {exc}") from exc
    defaults = RetryPolicy()
    return RetryPolicy(
        max_attempts=defaults.max_attempts
        if flat["max_attempts"] is None
        else flat["max_attempts"],
        base=defaults.base if flat["backoff_base"] is None else flat["backoff_base"],
        cap=defaults.cap if flat["backoff_cap"] is None else flat["backoff_cap"],
        jitter=jitter,
        retry_on=TRANSIENT_TYPES if flat["retry_on"] is None else flat["retry_on"],
    )


#: The registry ``@tool`` uses unless given another.
default_registry = Registry()


@overload
def tool(func: F, /) -> F: ...


@overload
def tool(
    *,
    name: str | None = ...,
    description: str | None = ...,
    timeout: float = ...,
    max_attempts: int | None = ...,
    backoff_base: float | None = ...,
    backoff_cap: float | None = ...,
    jitter: Jitter | str | None = ...,
    retry_on: frozenset[ErrorType] | None = ...,
    retry: RetryPolicy | None = ...,
    queue: str | None = ...,
    side_effects: bool = ...,
    check: Callable[..., Any] | None = ...,
    coalesce: bool = ...,
    breaker: BreakerPolicy | None = ...,
    breaker_key: str | None = ...,
    payload_threshold_bytes: int | None = ...,
    payload_token_budget: int | None = ...,
    max_result_bytes: int | None = ...,
    fallbacks: Sequence[FallbackStep] | None = ...,
    retry_budget: RetryBudgetPolicy | None = ...,
    rate_limit: RateLimitPolicy | None = ...,
    priority: int | None = ...,
    max_in_flight: int | None = ...,
    approval: ApprovalPolicy | bool | None = ...,
    registry: Registry | None = ...,
) -> Callable[[F], F]: ...


def tool(
    func: F | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float = 30.0,
    max_attempts: int | None = None,
    backoff_base: float | None = None,
    backoff_cap: float | None = None,
    jitter: Jitter | str | None = None,
    retry_on: frozenset[ErrorType] | None = None,
    retry: RetryPolicy | None = None,
    queue: str | None = None,
    side_effects: bool = False,
    check: Callable[..., Any] | None = None,
    coalesce: bool = False,
    breaker: BreakerPolicy | None = None,
    breaker_key: str | None = None,
    payload_threshold_bytes: int | None = None,
    payload_token_budget: int | None = None,
    max_result_bytes: int | None = None,
    fallbacks: Sequence[FallbackStep] | None = None,
    retry_budget: RetryBudgetPolicy | None = None,
    rate_limit: RateLimitPolicy | None = None,
    priority: int | None = None,
    max_in_flight: int | None = None,
    approval: ApprovalPolicy | bool | None = None,
    registry: Registry | None = None,
) -> F | Callable[[F], F]:
    """Register a typed function (sync or ``async def``) as a tool.

    The signature becomes the argument schema, the docstring the description
    the model reads. ``timeout`` bounds one attempt in seconds; the retry
    settings (``max_attempts`` 3, ``backoff_base`` 0.5 s, ``backoff_cap`` 30 s,
    full jitter, transient errors by default) build a :class:`RetryPolicy`,
    or ``retry`` gives one whole, and then none of them may be given too.
    ``breaker`` is the tool's :class:`BreakerPolicy` (a default one when None);
    ``breaker_key`` names an argument holding a URL, to keep one breaker per
    downstream host (``http_request@api.example.com``) instead of one per tool.
    ``side_effects`` marks a tool that writes: its calls get an idempotency key
    and run at most once per key (``toolexec.idempotency``); ``check`` has the
    tool's arguments and returns whether the effect is already there (or what
    it found), and is asked before an uncertain write is repeated.
    ``coalesce`` lets identical calls of a read-only tool that are in flight at
    once share one execution.
    ``payload_threshold_bytes`` and ``payload_token_budget`` override the
    settings of the same name for this tool's results (``toolexec.payloads``);
    ``max_result_bytes`` caps a result's size (``payload_max_bytes`` by default):
    a larger one ends the call with ``result_too_large`` instead of being stored.
    ``fallbacks`` is the tool's chain (``fallback.Alternative``, ``LastGood``,
    ``Explain``), tried in order when it fails in a way the model cannot fix.
    ``retry_budget`` caps the retries of all callers together (a 10% ratio by
    default; ``toolexec.layers.retry_budget``); ``rate_limit`` holds the whole fleet to a
    number of calls per second (``toolexec.layers.ratelimit``; none by default).
    ``priority`` is the priority of the tool's calls when a caller names none (1 most
    urgent … 5; 3 by default; ``toolexec.fairness``); ``max_in_flight`` caps the tool's
    calls running at once across the fleet, the excess waiting in a lane of its own (a
    Redis broker; ``toolexec.transport.lanes``).
    ``approval`` (True, or an :class:`ApprovalPolicy`) makes each call wait for a
    person's approval before its first attempt (``toolexec.layers.approvals``).
    """

    def register(fn: F) -> F:
        tool_name = fn.__name__ if name is None else name
        if not _NAME.match(tool_name):
            raise ConfigurationError(
                f"tool name {tool_name!r} must be 1-64 letters, digits, '_' or '-' "
                "(what model APIs accept)"
            )
        flat = {
            "max_attempts": max_attempts,
            "backoff_base": backoff_base,
            "backoff_cap": backoff_cap,
            "jitter": jitter,
            "retry_on": retry_on,
        }
        policy = ToolPolicy(
            timeout=timeout,
            retry=_retry_policy(tool_name, retry, flat),
            queue=queue,
            side_effects=side_effects,
            coalesce=coalesce,
            breaker=breaker or BreakerPolicy(probe_lease_s=max(60.0, timeout + 10.0)),
            breaker_key=breaker_key,
            payload_threshold_bytes=payload_threshold_bytes,
            payload_token_budget=payload_token_budget,
            max_result_bytes=max_result_bytes,
            fallbacks=_checked_fallbacks(tool_name, fallbacks, side_effects),
            retry_budget=retry_budget or RetryBudgetPolicy(),
            rate_limit=rate_limit,
            priority=priority,
            max_in_flight=max_in_flight,
            approval=ApprovalPolicy() if approval is True else (approval or None),
        )
        spec = ToolSpec(
            name=tool_name,
            description=description or inspect.getdoc(fn) or tool_name,
            func=fn,
            arguments=_argument_model(tool_name, fn),
            policy=policy,
            check=_checked_check(tool_name, fn, check, side_effects),
        )
        _check_strict(spec)
        (default_registry if registry is None else registry).register(spec)
        fn.__toolexec__ = spec  # type: ignore[attr-defined]
        return fn

    return register(func) if func is not None else register

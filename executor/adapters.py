"""From a model's tool calls to the messages that answer them, under the run's guard.

A model response asks for several tools at once: OpenAI chat completions as
``tool_calls`` on the assistant message, Anthropic as ``tool_use`` content
blocks. This module reads either shape, as plain dicts or as the official
SDKs' objects (anything with ``model_dump``; the SDKs are not imported), runs
the calls in parallel through the client with the :class:`RunGuard` deciding
what may run, and renders one reply per call, in the calls' order: OpenAI
``role: tool`` messages or Anthropic ``tool_result`` blocks. The guard's
verdicts are part of those replies (a nudge's hint, ``tool_disabled``,
``run_aborted``, ``run_budget_exhausted``), so the loop needs no extra logic.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from toolexec.bounds import checked_timeout, depth_problem
from toolexec.errors import ErrorType, InfrastructureError, UsageError
from toolexec.guard import GuardedResult, RoundPlan, Ruling, RunGuard
from toolexec.results import ErrorInfo, ToolResult
from toolexec.strict import from_strict

if TYPE_CHECKING:
    from toolexec.client import ToolClient

__all__ = ["Format", "Round", "ToolCall", "arun_round", "parse_tool_calls", "run_round"]

Format = Literal["openai", "anthropic"]
_FORMATS = ("openai", "anthropic")


@dataclass(frozen=True)
class ToolCall:
    """One call a model asked for, whatever API it came from.

    ``arguments`` is a dict, or the model's raw text when that is not a JSON
    object (the client then answers ``invalid_arguments`` and says why).
    ``problem`` marks a call toolexec cannot run at all (an OpenAI custom tool).
    """

    id: str
    tool: str
    arguments: Any
    problem: str | None = None


@dataclass(frozen=True)
class Round:
    """One model response's calls, what came of them, and the replies to send back."""

    calls: tuple[ToolCall, ...]
    outcomes: tuple[GuardedResult, ...]
    messages: list[dict[str, Any]]

    @property
    def results(self) -> list[ToolResult]:
        return [outcome.result for outcome in self.outcomes]

    @property
    def ended(self) -> bool:
        """Whether the guard has ended the run: the loop should let the model answer now."""
        return any(o.ruling in (Ruling.ABORT, Ruling.EXHAUSTED) for o in self.outcomes)


# -- reading tool calls ----------------------------------------------------------


def _fields(obj: Any) -> Mapping[str, Any]:
    """A dict, or an SDK (pydantic) object as one."""
    if isinstance(obj, Mapping):
        return obj
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        dumped: Mapping[str, Any] = dump()
        return dumped
    raise UsageError(
        "expected a tool call as a dict or an OpenAI/Anthropic SDK object, "
        f"not {type(obj).__name__}"
    )


def _items(container: Any) -> list[Any]:
    """The calls or content blocks in a list, an assistant message or a whole response."""
    if container is None:
        return []
    if isinstance(container, list | tuple):
        return list(container)
    fields = _fields(container)
    choices = fields.get("choices")
    if choices:  # an OpenAI ChatCompletion: its first choice
        if not isinstance(choices, list | tuple):
            raise UsageError(f"a response's choices must be a list, not {type(choices).__name__}")
        return _items(_fields(choices[0]).get("message"))
    if "tool_calls" in fields:  # an OpenAI assistant message
        return _listed(fields["tool_calls"], "tool_calls")
    if isinstance(fields.get("content"), list):  # an Anthropic Message
        return list(fields["content"])
    raise UsageError(
        "pass the tool calls as a list, an assistant message or a model response; "
        f"got a {type(container).__name__} with fields {sorted(fields)}"
    )


def _listed(value: Any, name: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise UsageError(f"{name} must be a list of tool calls, not {type(value).__name__}")
    return list(value)


def _decode(text: Any) -> Any:
    """OpenAI sends arguments as JSON text; a model sometimes sends broken JSON."""
    if text is None or text == "":
        return {}
    if not isinstance(text, str):
        return text
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # the client says what is wrong with the text
        return text
    return value if isinstance(value, dict) else text


def _call_id(fields: Mapping[str, Any]) -> str:
    """The id the reply must carry; without one there is nothing to answer."""
    call_id = fields.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise UsageError(
            f"a tool call needs its id (a non-empty string) to be answered, not {call_id!r:.80}"
        )
    return call_id


def _part(fields: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A nested object of a call (``function``, ``custom``); empty when it is not one."""
    value = fields.get(name)
    if isinstance(value, Mapping):
        return value
    dump = getattr(value, "model_dump", None)
    return _fields(value) if callable(dump) else {}


def _openai_call(item: Any) -> ToolCall:
    fields = _fields(item)
    kind = fields.get("type") or "function"
    if kind == "custom":
        custom = _part(fields, "custom")
        return ToolCall(
            _call_id(fields),
            str(custom.get("name") or ""),
            {},
            "custom (free-form) tool calls are not supported; toolexec tools take JSON "
            "arguments: call the tool as a function",
        )
    if kind != "function":
        raise UsageError(f"unknown OpenAI tool call type {kind!r:.80}")
    function = _part(fields, "function")
    return _named(_call_id(fields), function.get("name"), _decode(function.get("arguments")))


def _anthropic_call(item: Any) -> ToolCall | None:
    fields = _fields(item)
    if fields.get("type") != "tool_use":  # text, thinking, server tools: not ours to run
        return None
    arguments = fields.get("input")
    return _named(_call_id(fields), fields.get("name"), {} if arguments is None else arguments)


def _named(call_id: str, name: Any, arguments: Any) -> ToolCall:
    """A call without a usable tool name, or with arguments nested too deeply to look at,
    becomes an error reply, not a crash of the loop."""
    if not isinstance(name, str) or not name:
        return ToolCall(call_id, str(name or "")[:64], {}, "the tool call names no tool")
    too_deep = depth_problem(arguments)
    if too_deep is not None:  # the guard and the client would recurse into it
        return ToolCall(call_id, name, {}, too_deep)
    return ToolCall(call_id, name, arguments)


def parse_tool_calls(tool_calls: Any, format: Format = "openai") -> list[ToolCall]:
    """The calls in an OpenAI ``tool_calls`` list or an Anthropic content list.

    Also takes the assistant message itself, or a whole ChatCompletion /
    Message, so a loop can pass on what the SDK returned.
    """
    _check_format(format)
    items = _items(tool_calls)
    if format == "openai":
        return [_openai_call(item) for item in items]
    return [call for item in items if (call := _anthropic_call(item)) is not None]


def _check_format(format: str) -> None:
    if format not in _FORMATS:
        raise UsageError(f"format must be 'openai' or 'anthropic', not {format!r}")


# -- running a round ---------------------------------------------------------------


def _unrunnable(call: ToolCall, run_id: str | None) -> ToolResult:
    info = ErrorInfo(
        type=ErrorType.INVALID_ARGUMENTS,
        message=call.problem or "this call cannot be run",
        suggestion="Call the tool again as a function with a JSON object of arguments.",
    )
    return ToolResult(
        status="error", tool=call.tool, call_id=call.id, run_id=run_id, error=info, attempts=0
    )


@dataclass(frozen=True)
class _Work:
    """What to send to the workers, and what the round will need afterwards."""

    calls: tuple[ToolCall, ...]
    plan: RoundPlan | None
    todo: list[int]
    timeout: float | None

    def pairs(self) -> list[tuple[str, Any]]:
        return [(self.calls[i].tool, self.calls[i].arguments) for i in self.todo]

    @property
    def run_fairness_key(self) -> str | None:
        """The run's fairness key, for a round that names none."""
        return self.plan.fairness_key if self.plan is not None else None


def _from_strict(client: ToolClient, calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
    """Arguments a model sent under strict-mode definitions, in the catalog's shape again."""
    catalog = client.catalog()
    return tuple(
        replace(c, arguments=from_strict(c.arguments, catalog[c.tool]["parameters"]))
        if c.problem is None and c.tool in catalog
        else c
        for c in calls
    )


def _prepare(
    client: ToolClient,
    tool_calls: Any,
    format: Format,
    guard: RunGuard | None,
    timeout: float | None,
    strict: bool = False,
    fairness_key: str | None = None,
) -> _Work:
    timeout = checked_timeout(timeout)  # before the guard writes anything
    calls = tuple(parse_tool_calls(tool_calls, format))
    if strict:
        calls = _from_strict(client, calls)
    if guard is None or not calls:
        return _Work(calls, None, [i for i, c in enumerate(calls) if c.problem is None], timeout)
    plan = guard.begin_round(
        [(c.tool, c.arguments) for c in calls],
        alternatives=sorted(client.catalog()),
        fairness_key=fairness_key,
    )
    todo = [i for i in plan.to_run if calls[i].problem is None]
    limits = [t for t in (plan.timeout, timeout) if t is not None]
    return _Work(calls, plan, todo, min(limits) if limits else None)


def _finish(
    work: _Work,
    got: Sequence[ToolResult],
    guard: RunGuard | None,
    run_id: str | None,
    format: Format,
) -> Round:
    ran = dict(zip(work.todo, got, strict=True))
    allowed = set(work.plan.to_run) if work.plan is not None else set(range(len(work.calls)))
    results: list[ToolResult | None] = [
        ran[i] if i in ran else (_unrunnable(c, run_id) if i in allowed else None)
        for i, c in enumerate(work.calls)
    ]
    if guard is None or work.plan is None:
        outcomes = [GuardedResult(r) for r in results if r is not None]
    else:
        outcomes = guard.end_round(work.plan, results)
    messages = [_render(o, c, format) for o, c in zip(outcomes, work.calls, strict=True)]
    return Round(work.calls, tuple(outcomes), messages)


def _abandon(guard: RunGuard | None, work: _Work) -> None:
    """The calls never went out: the round must not count against the model."""
    if guard is not None and work.plan is not None:
        with contextlib.suppress(InfrastructureError):  # the original error says more
            guard.abandon_round(work.plan)


def _render(outcome: GuardedResult, call: ToolCall, format: Format) -> dict[str, Any]:
    if format == "openai":
        return outcome.to_openai_message(call.id)
    return outcome.to_anthropic_block(call.id)


def run_round(
    client: ToolClient,
    tool_calls: Any,
    *,
    format: Format = "openai",
    guard: RunGuard | None = None,
    timeout: float | None = None,
    strict: bool = False,
    fairness_key: str | None = None,
    priority: int | None = None,
) -> Round:
    """Run one model response's tool calls in parallel under ``guard``.

    Without a guard the calls simply run; with one, the run's remaining wall
    time bounds ``timeout``, and refused calls never reach a worker. ``strict``:
    the model was given strict-mode definitions (``tool_definitions(strict=True)``),
    so its arguments are turned back into the catalog's shape first.
    """
    run_id = guard.run_id if guard else None
    work = _prepare(client, tool_calls, format, guard, timeout, strict, fairness_key)
    try:
        got = (
            client.call_many(
                work.pairs(),
                run_id=run_id,
                timeout=work.timeout,
                guard=False,
                fairness_key=fairness_key or work.run_fairness_key,
                priority=priority,
            )
            if work.todo
            else []
        )
    except InfrastructureError:
        _abandon(guard, work)
        raise
    return _finish(work, got, guard, run_id, format)


async def arun_round(
    client: ToolClient,
    tool_calls: Any,
    *,
    format: Format = "openai",
    guard: RunGuard | None = None,
    timeout: float | None = None,
    strict: bool = False,
    fairness_key: str | None = None,
    priority: int | None = None,
) -> Round:
    """The asyncio form of :func:`run_round`; Redis round trips go to a thread."""
    run_id = guard.run_id if guard else None
    work = await asyncio.to_thread(
        _prepare, client, tool_calls, format, guard, timeout, strict, fairness_key
    )
    try:
        got = (
            await client.acall_many(
                work.pairs(),
                run_id=run_id,
                timeout=work.timeout,
                guard=False,
                fairness_key=fairness_key or work.run_fairness_key,
                priority=priority,
            )
            if work.todo
            else []
        )
    except InfrastructureError:
        await asyncio.to_thread(_abandon, guard, work)
        raise
    return await asyncio.to_thread(_finish, work, got, guard, run_id, format)

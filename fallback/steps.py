"""The steps of a fallback chain, declared next to the tool they stand in for.

A chain is tried in order after the primary tool has failed in a way the
model cannot fix: alternative tools first (often a ``*_lite`` variant with
simpler arguments), then the last good result of the same call from a cache,
then an explanation that tells the model the tool is unavailable and what to
do instead. An explanation always ends a chain: one is added when none is
declared, so a chain always answers.

Steps are plain frozen values; argument mappings are code, so a chain only
runs on a worker that imports the primary tool's module. The catalog carries
:meth:`describe` of each step, enough for a client to know a chain exists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolexec.errors import ConfigurationError

__all__ = [
    "Alternative",
    "ArgumentMap",
    "Explain",
    "FallbackStep",
    "LastGood",
    "check_chain",
    "complete_chain",
]

#: Turns the primary's validated arguments (as JSON) into the alternative's.
ArgumentMap = Callable[[Mapping[str, Any]], Mapping[str, Any]]

#: A day: long enough to bridge an outage, short enough that nobody mistakes
#: the answer for current; a tool whose data ages faster sets its own.
DEFAULT_CACHE_TTL_S = 86_400.0


@dataclass(frozen=True)
class Alternative:
    """Call another tool in the primary's place.

    ``arguments`` maps the primary's arguments to the alternative's (default:
    the same arguments). ``needs_s`` is the time the step must have left
    before the call's deadline to be worth starting; None takes the
    alternative's own timeout, so that the steps after it still have time.
    """

    tool: str
    arguments: ArgumentMap | None = None
    needs_s: float | None = None

    def __post_init__(self) -> None:
        if self.needs_s is not None and self.needs_s < 0:
            raise ConfigurationError(f"needs_s must be >= 0 or None, not {self.needs_s}")

    @property
    def source(self) -> str:
        return self.tool

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "tool",
            "tool": self.tool,
            "maps_arguments": self.arguments is not None,
            "needs_s": self.needs_s,
        }


@dataclass(frozen=True)
class LastGood:
    """Answer with the last successful result of the same call, if younger than ``ttl_s``.

    Every success of the primary is stored (keyed by the tool and its
    normalised arguments) for ``ttl_s`` seconds; the answer carries its age.
    Results larger than ``max_bytes`` of JSON are not stored.
    """

    ttl_s: float = DEFAULT_CACHE_TTL_S
    max_bytes: int = 256_000

    def __post_init__(self) -> None:
        if self.ttl_s <= 0:
            raise ConfigurationError(f"a cache's ttl_s must be positive, not {self.ttl_s}")
        if self.max_bytes <= 0:
            raise ConfigurationError(f"a cache's max_bytes must be positive, not {self.max_bytes}")

    @property
    def source(self) -> str:
        return "cache"

    def describe(self) -> dict[str, Any]:
        return {"kind": "cache", "ttl_s": self.ttl_s}


@dataclass(frozen=True)
class Explain:
    """The chain's last word: the tool is unavailable, and what to do instead.

    ``instead`` is written for the model ("Answer from what you know and say
    the prices may be out of date."); ``message`` replaces the default
    sentence naming the tool and its error.
    """

    instead: str = (
        "Continue without this tool: use another tool or answer from what you know, "
        "and tell the user this information could not be fetched."
    )
    message: str | None = None

    @property
    def source(self) -> str:
        return "explanation"

    def describe(self) -> dict[str, Any]:
        return {"kind": "explain", "instead": self.instead}


FallbackStep = Alternative | LastGood | Explain


def check_chain(
    tool: str, steps: Sequence[Any], *, side_effects: bool = False
) -> tuple[FallbackStep, ...]:
    """The chain of ``tool`` as declared, or a ConfigurationError saying what is wrong.

    A tool with side effects cannot answer from a cache: the model would take
    a stored "done" for a write that never happened.
    """
    chain = tuple(steps)
    problems = [f"{s!r} is not a fallback step" for s in chain if not _is_step(s)]
    if side_effects and any(isinstance(s, LastGood) for s in chain):
        problems.append("a tool with side effects cannot fall back to a cached result")
    problems += [
        f"{tool!r} cannot fall back to itself"
        for s in chain
        if isinstance(s, Alternative) and s.tool == tool
    ]
    if sum(isinstance(s, LastGood) for s in chain) > 1:
        problems.append("at most one LastGood cache")
    if any(isinstance(s, Explain) for s in chain[:-1]):
        problems.append("Explain ends a chain: nothing after it would ever run")
    tools = [s.tool for s in chain if isinstance(s, Alternative)]
    if len(tools) != len(set(tools)):
        problems.append("each alternative tool at most once")
    if problems:
        raise ConfigurationError(f"fallbacks of {tool!r}: " + "; ".join(problems))
    return chain


def complete_chain(steps: Sequence[FallbackStep]) -> tuple[FallbackStep, ...]:
    """``steps`` ending in an explanation, adding the default one when none is declared."""
    chain = tuple(steps)
    if chain and isinstance(chain[-1], Explain):
        return chain
    return (*chain, Explain())


def _is_step(value: Any) -> bool:
    return isinstance(value, Alternative | LastGood | Explain)

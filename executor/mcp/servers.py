"""Declaring a remote MCP server: where it is and the policy its tools run under.

A worker learns of a server from ``toolexec worker --mcp-server NAME=URL`` (or
``NAME=stdio:COMMAND``) or from :func:`mcp_server` in a tools module beside
``@tool``; ``TOOLEXEC_MCP_SERVERS`` lets an operator change a declared policy
without a release. ``toolexec.mcp.remote`` registers the server's tools.
"""

from __future__ import annotations

import re
import shlex
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from toolexec.errors import TRANSIENT_TYPES, ConfigurationError
from toolexec.policies import BreakerPolicy, Jitter, RetryPolicy, ToolPolicy

if TYPE_CHECKING:  # fallback builds on the registry
    from toolexec.fallback.steps import FallbackStep

__all__ = ["RemoteServer", "declared_servers", "mcp_server"]

_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class RemoteServer:
    """A remote MCP server and the policy its tools run under on this worker."""

    name: str
    url: str | None = None
    command: tuple[str, ...] = ()
    timeout: float = 30.0
    max_attempts: int = 3
    backoff_base: float = 0.5
    backoff_cap: float = 10.0
    queue: str | None = None
    #: Per remote tool (its own name), overriding what the annotations say.
    side_effects: Mapping[str, bool] = field(default_factory=dict)
    breaker: BreakerPolicy | None = None
    #: Per remote tool (its own name): a fallback chain (toolexec.fallback.steps).
    fallbacks: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    #: HTTP headers of every request, e.g. the server's Authorization; never shown in a repr.
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: OAuth to the server (``toolexec.mcp.oauth.OAuth``); None: headers alone authenticate.
    oauth: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _SERVER_NAME.match(self.name):
            raise ConfigurationError(
                f"an MCP server's name must be 1-32 letters, digits, '_' or '-', not {self.name!r}"
            )
        if (self.url is None) == (not self.command):
            raise ConfigurationError(
                f"MCP server {self.name!r}: give exactly one of url= (streamable HTTP) "
                "or command= (stdio)"
            )
        problems = [text for bad, text in self._policy_checks() if bad]
        if problems:
            raise ConfigurationError(f"MCP server {self.name!r}: " + "; ".join(problems))

    def _policy_checks(self) -> list[tuple[bool, str]]:
        """The numbers may come from TOOLEXEC_MCP_SERVERS, so their types are checked too."""
        numbers = (self.timeout, self.backoff_base, self.backoff_cap)
        if not all(_number(n) for n in numbers) or not _whole(self.max_attempts):
            return [
                (
                    True,
                    "timeout, backoff_base and backoff_cap are numbers, max_attempts "
                    "a whole number",
                )
            ]
        return [
            (not self.timeout > 0, "timeout must be positive"),
            (self.max_attempts < 1, "max_attempts must be at least 1"),
            (not 0 < self.backoff_base <= self.backoff_cap, "need 0 < backoff_base <= backoff_cap"),
            (self.queue is not None and not isinstance(self.queue, str), "queue is a name"),
            (
                not all(isinstance(v, bool) for v in self.side_effects.values()),
                "side_effects maps tool names to true or false",
            ),
            (
                not isinstance(self.headers, Mapping)
                or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in self.headers.items()
                ),
                "headers map names to strings",
            ),
        ]

    @classmethod
    def parse(cls, spec: str) -> RemoteServer:
        """``NAME=URL`` (streamable HTTP) or ``NAME=stdio:COMMAND`` (a command line)."""
        name, sep, target = spec.partition("=")
        if not sep or not target:
            raise ConfigurationError(
                f"--mcp-server takes NAME=URL or NAME=stdio:COMMAND, not {spec!r}"
            )
        if target.startswith("stdio:"):
            return cls(name=name.strip(), command=tuple(shlex.split(target[len("stdio:") :])))
        if not target.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"MCP server {name!r}: {target!r} is neither an http(s) URL nor stdio:COMMAND"
            )
        return cls(name=name.strip(), url=target)

    def configured(self, overrides: Mapping[str, Any]) -> RemoteServer:
        """This server with the operator's settings on top (``TOOLEXEC_MCP_SERVERS``)."""
        allowed = {"timeout", "max_attempts", "backoff_base", "backoff_cap", "queue", "headers"}
        changes: dict[str, Any] = {k: v for k, v in overrides.items() if k in allowed}
        unknown = set(overrides) - allowed - {"side_effects"}
        if unknown:
            raise ConfigurationError(
                f"TOOLEXEC_MCP_SERVERS[{self.name!r}]: unknown keys {sorted(unknown)}; "
                f"use {sorted(allowed | {'side_effects'})}"
            )
        if "side_effects" in overrides:
            given = overrides["side_effects"]
            if not isinstance(given, Mapping):
                raise ConfigurationError(
                    f"TOOLEXEC_MCP_SERVERS[{self.name!r}]: side_effects maps tool names to "
                    f"true or false, not {given!r}"
                )
            changes["side_effects"] = {**self.side_effects, **given}
        return replace(self, **changes)

    def tool_name(self, remote: str) -> str:
        return f"{self.name}.{remote}"

    def policy(self, side_effects: bool) -> ToolPolicy:
        """The policy of each of this server's tools: one breaker for the whole server."""
        return ToolPolicy(
            timeout=self.timeout,
            retry=RetryPolicy(
                max_attempts=self.max_attempts,
                base=self.backoff_base,
                cap=self.backoff_cap,
                jitter=Jitter.FULL,
                retry_on=TRANSIENT_TYPES,
            ),
            queue=self.queue,
            side_effects=side_effects,
            breaker=self.breaker or BreakerPolicy(probe_lease_s=max(60.0, self.timeout + 10.0)),
            breaker_key=f"@mcp:{self.name}",
        )


_declared: list[RemoteServer] = []
_declared_lock = threading.Lock()


def mcp_server(
    name: str,
    url: str | None = None,
    *,
    command: Sequence[str] = (),
    timeout: float = 30.0,
    max_attempts: int = 3,
    backoff_base: float = 0.5,
    backoff_cap: float = 10.0,
    queue: str | None = None,
    side_effects: Mapping[str, bool] | None = None,
    breaker: BreakerPolicy | None = None,
    fallbacks: Mapping[str, Sequence[FallbackStep]] | None = None,
    headers: Mapping[str, str] | None = None,
    oauth: Any = None,
) -> RemoteServer:
    """Declare a remote MCP server in a tools module, beside ``@tool``.

    The worker that imports the module lists the server's tools when it starts
    and registers each as ``name.tool``. ``side_effects`` overrides, per remote
    tool, what its annotations say; ``fallbacks`` gives a remote tool a chain;
    ``headers`` go with every HTTP request (read a token from the environment here,
    or put it in ``TOOLEXEC_MCP_SERVERS``, rather than in code); ``oauth`` (a
    ``toolexec.mcp.oauth.OAuth``) authenticates with OAuth instead.
    """
    server = RemoteServer(
        name=name,
        url=url,
        command=tuple(command),
        timeout=timeout,
        max_attempts=max_attempts,
        backoff_base=backoff_base,
        backoff_cap=backoff_cap,
        queue=queue,
        side_effects=dict(side_effects or {}),
        breaker=breaker,
        fallbacks=dict(fallbacks or {}),
        headers=dict(headers or {}),
        oauth=oauth,
    )
    with _declared_lock:
        _declared[:] = [s for s in _declared if s.name != name] + [server]
    return server


def declared_servers() -> list[RemoteServer]:
    with _declared_lock:
        return list(_declared)

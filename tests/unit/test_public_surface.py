"""The public surface, pinned: what toolexec, toolexec.fallback and toolexec.testing export.

A name added to or dropped from one of these is an API change and must change
this list in the same commit. The README and the examples import only from the
public modules (these three, and the adapters for an optional framework or for
MCP, each behind its extra), so a reader copies nothing that may move
(docs/architecture.md, Boundaries and the planned layout).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import toolexec
import toolexec.fallback
import toolexec.testing

ROOT = Path(__file__).resolve().parents[2]

TOOLEXEC = [
    "Answer",
    "ApprovalPolicy",
    "Audio",
    "BreakerPolicy",
    "BrokerUnavailableError",
    "CallHandle",
    "ClientError",
    "Clock",
    "ConfigurationError",
    "Content",
    "ErrorInfo",
    "ErrorType",
    "ForbiddenError",
    "Image",
    "InfrastructureError",
    "InvalidArgumentsError",
    "Jitter",
    "ManualClock",
    "NotFoundError",
    "PayloadExpiredError",
    "PayloadIntegrityError",
    "PayloadMissingError",
    "PayloadRef",
    "PayloadStoreUnavailableError",
    "PayloadUnavailableError",
    "PermanentError",
    "RateLimitPolicy",
    "RateLimitedError",
    "RedisUnavailableError",
    "Registry",
    "Resource",
    "RetryBudgetPolicy",
    "RetryDecision",
    "RetryPolicy",
    "RunBudget",
    "Settings",
    "SystemClock",
    "Text",
    "Timings",
    "ToolClient",
    "ToolConnectionError",
    "ToolException",
    "ToolPolicy",
    "ToolResult",
    "ToolSpec",
    "ToolTimeoutError",
    "ToolexecError",
    "TransientError",
    "UnauthorizedError",
    "UnavailableError",
    "UsageError",
    "default_registry",
    "elicit",
    "log",
    "notify_updated",
    "resource",
    "sample",
    "tool",
]

#: What a tool declares; the machinery that runs a chain stays in the package's modules.
FALLBACK = ["Alternative", "ArgumentMap", "Explain", "FallbackStep", "LastGood"]

#: What a user tests their own tools with: a scripted service and a real worker.
TESTING = ["FlakyServer", "Hit", "Ledger", "LocalStack", "Reply", "WorkerProcess", "local_stack"]

#: Besides the three packages: each adapter needs its optional extra, so it cannot be
#: re-exported from toolexec itself.
EXTRA_ENTRY_POINTS = {
    "toolexec.integrations.langchain",
    "toolexec.integrations.openai_agents",
    "toolexec.integrations.pydantic_ai",
    "toolexec.mcp",
}

#: Internal imports the examples still make, each a name the public surface lacks.
#: Each entry is a debt (docs/architecture.md, planned layout): remove it by giving the
#: example a public way, never add one.
KNOWN_INTERNAL = {
    ("examples/agent_loop.py", "toolexec.tasks.demo_tools"),
    ("examples/agent_loop.py", "toolexec.adapters"),
    ("examples/agent_loop.py", "toolexec.embedded"),
    ("examples/trace_one_call.py", "toolexec.connection"),
    ("examples/trace_one_call.py", "toolexec.ops.traces"),
}


@pytest.mark.parametrize(
    ("package", "expected"),
    [(toolexec, TOOLEXEC), (toolexec.fallback, FALLBACK), (toolexec.testing, TESTING)],
    ids=["toolexec", "toolexec.fallback", "toolexec.testing"],
)
def test_the_public_names_are_exactly_the_pinned_ones(package: object, expected: list[str]) -> None:
    assert sorted(package.__all__) == expected  # type: ignore[attr-defined]


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.DOTALL)


def _sources() -> list[tuple[str, str]]:
    found = [("README.md", block) for block in _python_blocks((ROOT / "README.md").read_text())]
    found += [
        (str(path.relative_to(ROOT)), path.read_text())
        for path in sorted((ROOT / "examples").glob("*.py"))
    ]
    return found


def _imports(source: str) -> list[tuple[str, list[str]]]:
    """(module, names) for every toolexec import; ``import toolexec.x`` has no names."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("toolexec"):
            found.append((node.module or "", [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("toolexec")]
    return found


PUBLIC = {"toolexec": TOOLEXEC, "toolexec.fallback": FALLBACK, "toolexec.testing": TESTING}


def test_the_readme_and_the_examples_import_only_public_names() -> None:
    sources = _sources()
    assert any(where == "README.md" for where, _ in sources), "no python block in the README"
    crossing = []
    for where, source in sources:
        for module, names in _imports(source):
            if module in EXTRA_ENTRY_POINTS or (where, module) in KNOWN_INTERNAL:
                continue
            if module not in PUBLIC or not set(names) <= set(PUBLIC[module]) or not names:
                crossing.append(f"{where}: from {module} import {', '.join(names) or '*'}")
    assert crossing == []


def test_each_known_internal_import_is_still_made() -> None:
    """A debt paid off leaves the list, so that the list never hides a new crossing."""
    made = {(where, module) for where, source in _sources() for module, _ in _imports(source)}
    assert made >= KNOWN_INTERNAL

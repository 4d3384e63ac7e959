"""When values are stored instead of sent: the worker's layer, the executor, arguments.

The store is a real directory (FilePayloadStore) and time a ManualClock; the
executor runs real tools from a private registry with the real Runner.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from toolexec.clock import ManualClock
from toolexec.context import CallContext
from toolexec.errors import (
    ConfigurationError,
    ErrorType,
    InvalidArgumentsError,
    UnavailableError,
)
from toolexec.layers import Attempt, Outcome
from toolexec.payloads import (
    ARGUMENT_MARKER,
    FilePayloadStore,
    Limits,
    Offloader,
    PayloadLayer,
    PayloadReader,
    resolve_arguments,
    store_arguments,
)
from toolexec.payloads.signing import SIGNATURE_KEY, MarkerSigner
from toolexec.payloads.tokens import MIN_TOKEN_BUDGET, estimate_tokens, json_bytes
from toolexec.pipeline.execution import Executor, Final, Verdict
from toolexec.pipeline.runner import Runner
from toolexec.registry import Registry, ToolSpec, tool
from toolexec.results import ToolResult
from toolexec.settings import Settings

SIGNER = MarkerSigner.fixed(b"unit-test-secret")
BIG_TEXT = "".join(f"line {i}\n" for i in range(20_000))  # ~190 KB


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock) -> FilePayloadStore:
    return FilePayloadStore(tmp_path / "payloads", clock)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        payload_store=f"file://{tmp_path / 'payloads'}",
        payload_threshold_bytes=10_000,
        payload_token_budget=300,
        payload_ttl_s=600,
    )


@pytest.fixture
def layer(store: FilePayloadStore, clock: ManualClock, settings: Settings) -> PayloadLayer:
    return PayloadLayer(Offloader(store, clock), settings)


def _spec(registry: Registry, func: Callable[..., Any], **policy: Any) -> ToolSpec:
    tool(registry=registry, **policy)(func)
    spec = registry.get(func.__name__)
    assert spec is not None
    return spec


def _attempt(spec: ToolSpec, clock: ManualClock) -> Attempt:
    ctx = CallContext(
        call_id="c-1",
        tool=spec.name,
        deadline=clock.now() + 60,
        submitted_at=clock.now(),
        reply_to="r-1",
    )
    return Attempt(spec, ctx, 1, {}, 30.0)


def _returns(value: Any) -> Callable[[], Outcome]:
    return lambda: Outcome(data=value, duration_s=0.01)


def _noop() -> None:
    """A tool whose only role is to carry a policy."""


def test_a_small_result_passes_through_untouched(
    layer: PayloadLayer, registry: Registry, clock: ManualClock
) -> None:
    spec = _spec(registry, _noop)
    outcome = layer.around(_attempt(spec, clock), _returns({"answer": 42}))
    assert outcome.data == {"answer": 42} and outcome.payload is None


def test_a_result_over_the_threshold_is_stored_with_a_preview_in_its_place(
    layer: PayloadLayer,
    registry: Registry,
    clock: ManualClock,
    store: FilePayloadStore,
) -> None:
    spec = _spec(registry, _noop)

    outcome = layer.around(_attempt(spec, clock), _returns(BIG_TEXT))

    ref = outcome.payload
    assert ref is not None
    assert (ref.store, ref.unit, ref.count) == ("file", "lines", 20_000)
    assert ref.expires_at == clock.now() + 600
    assert outcome.data["partial"] is True
    assert estimate_tokens(json_bytes(outcome.data)) <= 300
    assert PayloadReader(store, clock).load(ref) == BIG_TEXT


def test_a_result_under_the_bytes_but_over_the_token_budget_is_stored(
    layer: PayloadLayer, registry: Registry, clock: ManualClock
) -> None:
    """300 tokens is ~1 200 bytes: a 5 000-byte result is under 10 000 bytes but too long."""
    spec = _spec(registry, _noop)
    outcome = layer.around(_attempt(spec, clock), _returns("w" * 5_000))
    assert outcome.payload is not None


def test_a_tools_own_limits_override_the_settings(
    layer: PayloadLayer, registry: Registry, clock: ManualClock, settings: Settings
) -> None:
    def roomy() -> None:
        """Allows large inline results."""

    spec = _spec(registry, roomy, payload_threshold_bytes=500_000, payload_token_budget=100_000)
    assert Limits.for_tool(settings, spec) == Limits(500_000, 100_000)
    outcome = layer.around(_attempt(spec, clock), _returns(BIG_TEXT))
    assert outcome.payload is None and outcome.data == BIG_TEXT


def test_a_failure_is_not_stored(
    layer: PayloadLayer, registry: Registry, clock: ManualClock
) -> None:
    spec = _spec(registry, _noop)
    failed = Outcome(failure=UnavailableError("down"))
    assert layer.around(_attempt(spec, clock), lambda: failed) is failed


@pytest.mark.parametrize(
    ("side_effects", "kind", "retryable"),
    [(False, ErrorType.UNAVAILABLE, True), (True, ErrorType.TOOL_ERROR, False)],
)
def test_a_store_that_fails_turns_the_result_into_a_failure(
    settings: Settings,
    registry: Registry,
    clock: ManualClock,
    tmp_path: Path,
    side_effects: bool,
    kind: ErrorType,
    retryable: bool,
) -> None:
    """Retried only when running the tool again is harmless."""
    broken = FilePayloadStore(tmp_path / "broken", clock)
    (tmp_path / "broken").rmdir()
    (tmp_path / "broken").write_text("not a directory")
    spec = _spec(registry, _noop, side_effects=side_effects)

    outcome = PayloadLayer(Offloader(broken, clock), settings).around(
        _attempt(spec, clock), _returns(BIG_TEXT)
    )

    assert outcome.failure is not None and outcome.data is None
    assert (outcome.failure.error_type, outcome.failure.retryable) == (kind, retryable)
    assert "could not be stored" in outcome.failure.message


def _final_result(verdict: Verdict) -> ToolResult:
    assert isinstance(verdict, Final), verdict
    return verdict.result


def test_the_executor_puts_the_reference_on_the_result(
    layer: PayloadLayer, registry: Registry, clock: ManualClock
) -> None:
    def listing(n: int) -> list[int]:
        """Returns n numbers."""
        return list(range(n))

    spec = _spec(registry, listing)
    executor = Executor(runner=Runner(), clock=clock, rng=random.Random(1), layers=[layer])

    result = _final_result(executor.attempt(spec, {"n": 50_000}, _attempt(spec, clock).ctx, 1))

    assert result.ok and result.payload is not None
    assert result.data["total_items"] == 50_000
    assert result.data["items"] == list(range(len(result.data["items"])))


def test_load_without_a_client_says_how_to_fetch(
    layer: PayloadLayer, registry: Registry, clock: ManualClock
) -> None:
    spec = _spec(registry, _noop)
    outcome = layer.around(_attempt(spec, clock), _returns(BIG_TEXT))
    result = ToolResult(
        status="ok", tool="t", call_id="c", data=outcome.data, payload=outcome.payload
    )
    assert ToolResult(status="ok", tool="t", call_id="c", data=[1]).load() == [1]
    with pytest.raises(ValueError, match="fetch_payload"):
        result.load()


# -- arguments ----------------------------------------------------------------


def test_large_arguments_are_stored_and_small_ones_stay(
    store: FilePayloadStore, clock: ManualClock
) -> None:
    offloader = Offloader(store, clock)
    stored = store_arguments({"doc": BIG_TEXT, "mode": "short"}, offloader, 10_000, 60, SIGNER)

    assert stored["mode"] == "short"
    assert set(stored["doc"]) == {ARGUMENT_MARKER, SIGNATURE_KEY}
    assert resolve_arguments(stored, PayloadReader(store, clock), SIGNER) == {
        "doc": BIG_TEXT,
        "mode": "short",
    }


def test_an_argument_that_expired_is_invalid_arguments(
    store: FilePayloadStore, clock: ManualClock
) -> None:
    stored = store_arguments({"doc": BIG_TEXT}, Offloader(store, clock), 10_000, 60, SIGNER)
    clock.advance(61)
    with pytest.raises(InvalidArgumentsError, match="argument 'doc' was stored as payload"):
        resolve_arguments(stored, PayloadReader(store, clock), SIGNER)


def test_the_executor_resolves_stored_arguments_before_validation(
    store: FilePayloadStore, registry: Registry, clock: ManualClock
) -> None:
    def count_lines(doc: str) -> int:
        """Counts the document's lines."""
        return doc.count("\n")

    spec = _spec(registry, count_lines)
    reader = PayloadReader(store, clock)
    executor = Executor(
        runner=Runner(),
        clock=clock,
        resolve_arguments=lambda raw: resolve_arguments(raw, reader, SIGNER),
    )
    stored = store_arguments({"doc": BIG_TEXT}, Offloader(store, clock), 10_000, 30, SIGNER)
    ctx = _attempt(spec, clock).ctx  # deadline in 60 s

    assert _final_result(executor.attempt(spec, stored, ctx, 1)).data == 20_000
    clock.advance(31)
    lost = _final_result(executor.attempt(spec, stored, ctx, 1))
    assert lost.error is not None and lost.error.type == ErrorType.INVALID_ARGUMENTS
    assert lost.attempts == 0


def test_limits_below_the_smallest_preview_are_refused_at_declaration(
    registry: Registry,
) -> None:
    """A budget under MIN_TOKEN_BUDGET could not hold even the preview's note."""
    with pytest.raises(ConfigurationError, match="at least 200 tokens"):
        _spec(registry, _noop, payload_token_budget=MIN_TOKEN_BUDGET - 1)
    with pytest.raises(ConfigurationError, match="payload_threshold_bytes"):
        _spec(registry, _noop, payload_threshold_bytes=0)
    with pytest.raises(ValueError, match="payload_token_budget"):
        Settings(payload_token_budget=MIN_TOKEN_BUDGET - 1)
    assert Settings(payload_token_budget=MIN_TOKEN_BUDGET).payload_token_budget == 200


def test_a_side_effecting_tools_payload_lives_as_long_as_its_idempotency_record(
    store: FilePayloadStore, registry: Registry, clock: ManualClock, settings: Settings
) -> None:
    """Its record replays the reference for idempotency_retention_s: the payload must outlive
    the shorter payload TTL, or a replay would hand out a dead reference."""

    def charge() -> None:
        """Writes somewhere."""

    spec = _spec(registry, charge, side_effects=True)
    keeps = settings.model_copy(update={"idempotency_retention_s": 86_400.0})
    layer = PayloadLayer(Offloader(store, clock), keeps)

    outcome = layer.around(_attempt(spec, clock), _returns(BIG_TEXT))

    assert outcome.payload is not None
    assert outcome.payload.expires_at == clock.now() + 86_400
    clock.advance(3_600)  # past payload_ttl_s (600 s here), within the record's retention
    assert PayloadReader(store, clock).load(outcome.payload) == BIG_TEXT

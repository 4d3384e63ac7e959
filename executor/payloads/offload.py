"""Storing values too large for messages, on both sides of the queue.

On the worker, :class:`PayloadLayer` looks at what the tool returned: past
the byte threshold or the token budget (settings, or the tool's own
``@tool(payload_threshold_bytes=..., payload_token_budget=...)``), the value
goes to the payload store and the result carries a :class:`PayloadRef` and a
preview. On the client, :func:`store_arguments` does the same for a large
argument (a document to summarise), and the worker's
:func:`resolve_arguments` puts the value back before validation.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from toolexec.bounds import depth_problem
from toolexec.clock import Clock
from toolexec.connection import redis_client
from toolexec.errors import (
    InvalidArgumentsError,
    PayloadStoreUnavailableError,
    PayloadUnavailableError,
    ResultTooLargeError,
    ToolException,
    UnavailableError,
)
from toolexec.layers import Attempt, Layer, Outcome, Proceed
from toolexec.payloads.encoding import (
    Encoded,
    Index,
    TooLarge,
    encode,
    segment_bounds,
    segment_digest,
)
from toolexec.payloads.preview import build_preview
from toolexec.payloads.reader import INDEX_SUFFIX, PayloadReader
from toolexec.payloads.signing import SIGNATURE_KEY, MarkerSigner, marker_signer
from toolexec.payloads.store import PayloadStore, open_store
from toolexec.payloads.tokens import budget_bytes
from toolexec.registry import ToolSpec
from toolexec.results import PayloadRef
from toolexec.settings import Settings

if TYPE_CHECKING:
    import redis

__all__ = [
    "ARGUMENT_MARKER",
    "Limits",
    "Offloader",
    "PayloadLayer",
    "WorkerPayloads",
    "resolve_arguments",
    "result_limit",
    "store_arguments",
    "worker_payloads",
]

#: The key of the object that stands in a message for a stored argument.
ARGUMENT_MARKER = "$toolexec_payload"


@dataclass(frozen=True)
class Limits:
    """When a value is stored rather than sent, and how big its preview may be."""

    threshold_bytes: int
    token_budget: int

    @classmethod
    def for_tool(cls, settings: Settings, spec: ToolSpec) -> Limits:
        policy = spec.policy
        return cls(
            policy.payload_threshold_bytes or settings.payload_threshold_bytes,
            policy.payload_token_budget or settings.payload_token_budget,
        )

    @property
    def inline_bytes(self) -> int:
        """The largest value that stays inline: under both the threshold and the budget."""
        return min(self.threshold_bytes, budget_bytes(self.token_budget))


#: Above this, the body is hashed in a thread while the store writes it.
_OVERLAP_BYTES = 1_000_000


class _Digest:
    """sha256 of ``data`` and of each stretch a page read fetches, computed beside the
    caller: hashing and socket writes both release the GIL, so at 10 MB the hash
    costs nothing on top of the write. A thread per large payload, not a pool, so a
    forked (prefork) worker inherits no pool whose threads did not survive the fork."""

    def __init__(self, data: bytes, bounds: list[int]) -> None:
        self._data = data
        self._bounds = bounds
        self._value = ""
        self.segments: list[str] = []
        self._thread: threading.Thread | None = None
        if len(data) >= _OVERLAP_BYTES:
            self._thread = threading.Thread(target=self._run, name="toolexec-sha256")
            self._thread.start()

    def _run(self) -> None:
        whole = hashlib.sha256()
        view = memoryview(self._data)
        for start, end in itertools.pairwise(self._bounds):
            stretch = view[start:end]
            whole.update(stretch)
            self.segments.append(segment_digest(stretch))
        self._value = whole.hexdigest()

    def hexdigest(self) -> str:
        if self._thread is None:
            self._run()
        else:
            self._thread.join()
        return self._value


class Offloader:
    """Writes values (and their paging index) to a store and hands back references."""

    def __init__(self, store: PayloadStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def put(self, value: Any, ttl_s: float) -> PayloadRef:
        """Store ``value`` for ``ttl_s`` seconds.

        The body goes before its index: a reader that finds the index finds the body.
        """
        return self.put_encoded(encode(value), ttl_s)

    def put_encoded(self, encoded: Encoded, ttl_s: float) -> PayloadRef:
        key = uuid.uuid4().hex
        digest = _Digest(encoded.body, segment_bounds(encoded.marks, len(encoded.body)))
        self.store.put(key, encoded.body, ttl_s)
        sha256 = digest.hexdigest()
        index = Index(
            unit=encoded.unit,
            count=encoded.count,
            size_bytes=len(encoded.body),
            content_type=encoded.content_type,
            sha256=sha256,
            marks=encoded.marks,
            segments=digest.segments,
        )
        raw_index = index.to_bytes()
        self.store.put(key + INDEX_SUFFIX, raw_index, ttl_s)
        return PayloadRef(
            key=key,
            store=self.store.kind,
            size_bytes=len(encoded.body),
            content_type=encoded.content_type,
            sha256=sha256,
            index_sha256=hashlib.sha256(raw_index).hexdigest(),
            expires_at=self.clock.now() + ttl_s,
            unit=encoded.unit,
            count=encoded.count,
        )


def result_limit(settings: Settings, spec: ToolSpec) -> int:
    """The largest result ``spec`` may return, in bytes of stored JSON or text."""
    return spec.policy.max_result_bytes or settings.payload_max_bytes


def oversized(value: Any, limit: int, most: int | None = None) -> Encoded | None:
    """``value`` encoded when it is larger than ``limit`` bytes; None when it fits inline.

    Scalars always fit; a string shorter than ``limit / 4`` characters cannot
    pass ``limit`` bytes of UTF-8, so small results cost no encoding here.
    Past ``most`` bytes encoding stops at once with :class:`TooLarge`.
    """
    if not isinstance(value, str | list | dict):
        return None
    if isinstance(value, str) and len(value) * 4 <= limit:
        return None
    encoded = encode(value, most)
    return encoded if len(encoded.body) > limit else None


class PayloadLayer(Layer):
    """Stores a result past its tool's limits and returns a preview and a reference.

    It sits inside the breaker and outside fault injection, so a layer that
    records outcomes (idempotency) sees and keeps only the reference.
    """

    name = "payloads"

    def __init__(
        self,
        offloader: Offloader,
        settings: Settings,
        on_offload: Callable[[str, int, str], None] | None = None,
    ) -> None:
        self.offloader = offloader
        self.settings = settings
        # (tool, bytes, kind): the worker's observers (toolexec.pipeline.observe), e.g. its metrics
        self.on_offload = on_offload

    def ttl_for(self, spec: ToolSpec) -> float:
        """How long a result is kept: a side-effecting tool's idempotency record replays it
        (reference and preview) for ``idempotency_retention_s``, so its payload lives as long."""
        if spec.policy.side_effects:
            return max(self.settings.payload_ttl_s, self.settings.idempotency_retention_s)
        return self.settings.payload_ttl_s

    def around(self, attempt: Attempt, proceed: Proceed) -> Outcome:
        outcome = proceed()
        if not outcome.ok or outcome.payload is not None:
            return outcome
        limits = Limits.for_tool(self.settings, attempt.spec)
        most = result_limit(self.settings, attempt.spec)
        try:
            encoded = oversized(outcome.data, min(limits.inline_bytes, most), most)
        except TooLarge as stop:
            return replace(outcome, data=None, failure=_too_large(stop.size, most))
        if encoded is None:
            return outcome
        try:
            ref = self.offloader.put_encoded(encoded, self.ttl_for(attempt.spec))
        except PayloadStoreUnavailableError as exc:
            return replace(outcome, data=None, failure=_unstorable(attempt.spec, exc))
        if self.on_offload is not None:
            self.on_offload(attempt.tool, ref.size_bytes, "result")
        preview = build_preview(outcome.data, ref, limits.token_budget)
        return replace(outcome, data=preview, payload=ref)


def _too_large(size: int, most: int) -> ResultTooLargeError:
    """Encoding stopped at ``size`` bytes: the whole result may be larger still."""
    return ResultTooLargeError(
        f"the tool's result is at least {size:,} bytes, more than its limit of {most:,} "
        "bytes; it was not stored",
        suggestion="Ask for less at once: a page, a filter or a narrower range.",
        details={"size_bytes": size, "limit_bytes": most},
    )


def _unstorable(spec: ToolSpec, exc: PayloadStoreUnavailableError) -> ToolException:
    message = f"the result is too large to send inline and could not be stored: {exc}"
    if spec.policy.side_effects:  # running the tool again could repeat its effect
        return ToolException(message, suggestion="Check the payload store before calling again.")
    return UnavailableError(message, suggestion="Try again later.")


def store_arguments(
    arguments: Mapping[str, Any],
    offloader: Offloader,
    threshold_bytes: int,
    ttl_s: float,
    signer: MarkerSigner,
) -> dict[str, Any]:
    """``arguments`` with each value over ``threshold_bytes`` stored and replaced by a
    signed marker (:mod:`toolexec.payloads.signing`)."""
    out = dict(arguments)
    for name, value in arguments.items():
        encoded = oversized(value, threshold_bytes)
        if encoded is not None:
            ref = offloader.put_encoded(encoded, ttl_s).model_dump(mode="json")
            out[name] = {ARGUMENT_MARKER: ref, SIGNATURE_KEY: signer.sign(name, ref)}
    return out


def _marker(name: str, value: Any, signer: MarkerSigner) -> PayloadRef | None:
    """The reference in a marker the client signed; None for an ordinary value.

    A marker without a good signature came from somewhere else (a model's
    arguments): refused before the store is asked anything, with words that say
    nothing of whether such a payload exists.
    """
    if not isinstance(value, dict) or ARGUMENT_MARKER not in value:
        return None
    ref = value[ARGUMENT_MARKER]
    if set(value) != {ARGUMENT_MARKER, SIGNATURE_KEY} or not signer.verify(
        name, ref, value[SIGNATURE_KEY]
    ):
        raise InvalidArgumentsError(
            f"argument {name!r} holds a {ARGUMENT_MARKER} reference that toolexec did not "
            "make; only the client stores arguments apart",
            suggestion=f"Pass the value itself, not a {ARGUMENT_MARKER} object.",
        )
    try:
        return PayloadRef.model_validate(ref)
    except ValueError as exc:  # signed, so ours: a client of another version
        raise InvalidArgumentsError(f"argument {name!r}: unreadable reference ({exc})") from None


def resolve_arguments(raw: Any, reader: PayloadReader, signer: MarkerSigner) -> Any:
    """Raw arguments with every stored one put back; a lost one is ``invalid_arguments``.

    Arguments nested deeper than any tool needs are refused here, first, because
    validation, redaction and the markers' search recurse into them: a message
    that did not come through the client must not end in ``internal_error``.
    """
    nested = depth_problem(raw)
    if nested is not None:
        raise InvalidArgumentsError(nested, suggestion="Send a flatter structure.")
    if not isinstance(raw, dict):
        return raw
    out = dict(raw)
    for name, value in raw.items():
        try:
            ref = _marker(name, value, signer)
        except PayloadStoreUnavailableError as exc:  # the signing key is in Redis
            raise UnavailableError(f"argument {name!r} could not be checked: {exc}") from exc
        if ref is not None:
            out[name] = _load_argument(name, ref, reader)
    return out


def _load_argument(name: str, ref: PayloadRef, reader: PayloadReader) -> Any:
    try:
        return reader.load(ref)
    except PayloadUnavailableError as exc:
        raise InvalidArgumentsError(
            f"argument {name!r} was stored as payload {ref.key}, which cannot be read: {exc}",
            suggestion="Call the tool again; the client stores the argument anew.",
        ) from exc
    except PayloadStoreUnavailableError as exc:
        raise UnavailableError(f"argument {name!r} could not be fetched: {exc}") from exc


@dataclass(frozen=True)
class WorkerPayloads:
    """What a worker needs: the layer for results, the resolver for arguments."""

    layer: PayloadLayer
    reader: PayloadReader
    signer: MarkerSigner

    def resolve(self, raw: Any) -> Any:
        return resolve_arguments(raw, self.reader, self.signer)


def worker_payloads(
    settings: Settings,
    redis_url: str,
    clock: Clock,
    client: redis.Redis,
    on_offload: Callable[[str, int, str], None] | None = None,
) -> WorkerPayloads:
    """The payload store of ``settings`` wired for a worker, on the worker's one ``client``."""
    store = open_store(settings, redis_url, clock, client=client)
    return WorkerPayloads(
        PayloadLayer(Offloader(store, clock), settings, on_offload),
        PayloadReader(store, clock),
        marker_signer(settings, redis_client(redis_url)),
    )

"""Reading stored payloads back: whole and verified, or a page at a time.

Every failure to read says which payload, why, and what to do instead, as a
:class:`PayloadUnavailableError`: an expired reference is an ordinary event
for an agent that comes back to a result later, not a crash.
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass
from typing import Any

from toolexec.clock import Clock
from toolexec.errors import (
    PayloadExpiredError,
    PayloadIntegrityError,
    PayloadMissingError,
    PayloadUnavailableError,
    UsageError,
)
from toolexec.payloads.encoding import (
    Index,
    decode,
    segment_bounds,
    segment_digest,
    span,
    split_units,
)
from toolexec.payloads.store import PayloadStore, check_key
from toolexec.results import PayloadRef, PayloadUnit

__all__ = ["INDEX_SUFFIX", "PayloadPage", "PayloadReader"]

INDEX_SUFFIX = ".index"

_WHAT_TO_DO = (
    "Call the tool again for a fresh result (and read it sooner, or raise "
    "TOOLEXEC_PAYLOAD_TTL_S if results must live longer)."
)


@dataclass(frozen=True)
class PayloadPage:
    """``limit`` lines, items or keys of a stored value from ``offset`` (counted from 0).

    ``next_offset`` is where the following page starts, None after the last.
    For keys, ``entries`` holds ``[key, value]`` pairs in the object's order.
    """

    key: str
    unit: PayloadUnit
    offset: int
    total: int
    entries: list[Any]

    @property
    def next_offset(self) -> int | None:
        end = self.offset + len(self.entries)
        return end if end < self.total else None

    @property
    def text(self) -> str:
        """The lines of a text page, joined again."""
        return "\n".join(str(line) for line in self.entries)

    def to_json(self) -> dict[str, Any]:
        """The page as a tool result a model can read."""
        return {
            "payload_key": self.key,
            "unit": self.unit,
            "offset": self.offset,
            "total": self.total,
            "next_offset": self.next_offset,
            self.unit: self.entries,
        }


class PayloadReader:
    """Fetches, verifies and pages payloads from one store."""

    def __init__(self, store: PayloadStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def fetch(self, ref: PayloadRef) -> bytes:
        """The payload's bytes, exactly as stored, checked against ``ref.sha256``."""
        check_key(ref.key)
        self._check_store(ref)
        data = self._guard(ref.key, ref, lambda: self.store.get(ref.key))
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise PayloadIntegrityError(
                f"payload {ref.key} does not match its sha256 ({len(data):,} bytes read, "
                f"{ref.size_bytes:,} expected): it was changed or replaced in the store. "
                "Do not use it; call the tool again."
            )
        return data

    def load(self, ref: PayloadRef) -> Any:
        """The whole value, as the tool returned it."""
        return decode(self.fetch(ref), ref.content_type)

    def read(self, ref: PayloadRef | str, offset: int = 0, limit: int = 100) -> PayloadPage:
        """A page of ``limit`` units from ``offset``; ``ref`` may be just the key.

        The page's bytes are checked against the index's digests of the stretches
        they span, and with a reference the index itself is checked against it
        (``index_sha256``, ``sha256``); with only a key, there is nothing outside
        the store to check the index against.
        """
        if offset < 0 or limit < 1:
            raise UsageError(f"offset must be >= 0 and limit >= 1, not {offset} and {limit}")
        key = ref if isinstance(ref, str) else ref.key
        check_key(key)
        known = None if isinstance(ref, str) else ref
        if known is not None:
            self._check_store(known)
        index = self._index(key, known)
        if offset >= index.count:
            return PayloadPage(key, index.unit, offset, index.count, [])
        first, start, end = span(index.marks, offset, limit)
        if known is not None and not index.segments:  # written before pages were verified
            segment = self.fetch(known)[start:end]
        else:
            segment = self._guard(key, known, lambda: self.store.get_range(key, start, end))
            _verify_segment(key, index, start, end, segment)
        units = split_units(segment, index.unit)[offset - first : offset - first + limit]
        entries = [list(pair) for pair in units] if index.unit == "keys" else units
        return PayloadPage(key, index.unit, offset, index.count, entries)

    def _index(self, key: str, known: PayloadRef | None) -> Index:
        raw = self._guard(key, known, lambda: self.store.get(key + INDEX_SUFFIX))
        expected = None if known is None else known.index_sha256
        if expected is not None and hashlib.sha256(raw).hexdigest() != expected:
            raise _tampered(key, "its paging index does not match the reference")
        try:
            index = Index.from_bytes(raw)
        except (ValueError, TypeError, KeyError) as exc:
            raise _tampered(key, f"its paging index cannot be read ({exc})") from None
        if known is not None and index.sha256 != known.sha256:
            raise _tampered(key, "its paging index belongs to another value")
        return index

    def _check_store(self, ref: PayloadRef) -> None:
        if ref.store != self.store.kind:
            raise PayloadMissingError(
                f"payload {ref.key} was written to a {ref.store} store, but this client reads "
                f"a {self.store.kind} store: set TOOLEXEC_PAYLOAD_STORE as the workers have it."
            )

    def _guard(self, key: str, ref: PayloadRef | None, read: Any) -> bytes:
        """``read()``, with a store's bare 'not found' turned into a message that helps."""
        try:
            data: bytes = read()
        except PayloadExpiredError as exc:
            raise PayloadExpiredError(f"payload {key} has expired ({exc}). {_WHAT_TO_DO}") from None
        except PayloadMissingError as exc:
            raise self._lost(key, ref, exc) from None
        return data

    def _lost(self, key: str, ref: PayloadRef | None, exc: Exception) -> PayloadUnavailableError:
        if ref is not None and ref.expires_at is not None and self.clock.now() >= ref.expires_at:
            when = datetime.datetime.fromtimestamp(ref.expires_at, datetime.UTC).isoformat()
            return PayloadExpiredError(
                f"payload {key} ({ref.size_bytes:,} bytes, {ref.content_type}) expired at "
                f"{when} and is gone. {_WHAT_TO_DO}"
            )
        return PayloadMissingError(
            f"payload {key} is not in the {self.store.kind} payload store ({exc}): it expired, "
            "was deleted, or was written to another store (check that TOOLEXEC_PAYLOAD_STORE "
            f"is the same for workers and clients). {_WHAT_TO_DO}"
        )


def _tampered(key: str, why: str) -> PayloadIntegrityError:
    return PayloadIntegrityError(
        f"payload {key} cannot be trusted: {why}; it was changed or replaced in the store. "
        "Do not use it; call the tool again."
    )


def _verify_segment(key: str, index: Index, start: int, end: int, data: bytes) -> None:
    """``data`` (bytes ``start`` to ``end``) against the digests of the stretches it spans."""
    bounds = segment_bounds(index.marks, index.size_bytes)
    if len(index.segments) != len(bounds) - 1 or start not in bounds or end not in bounds:
        raise _tampered(key, "its paging index does not describe its body")
    first = bounds.index(start)
    for i in range(first, bounds.index(end)):
        a, b = bounds[i] - start, bounds[i + 1] - start
        if segment_digest(data[a:b]) != index.segments[i]:
            raise _tampered(key, f"bytes {bounds[i]}-{bounds[i + 1]} do not match its digest")

"""Large values on the client's side: arguments stored apart, results read back.

The store is opened on first use, because building an S3 client takes a while
and most agents never send or read a large value.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from toolexec.clock import Clock
from toolexec.connection import redis_client
from toolexec.context import CallContext
from toolexec.keys import REPLY_TTL_S
from toolexec.payloads import (
    MarkerSigner,
    Offloader,
    PayloadPage,
    PayloadReader,
    marker_signer,
    open_store,
    store_arguments,
)
from toolexec.results import PayloadRef
from toolexec.settings import Settings

__all__ = ["ClientPayloads"]


class ClientPayloads:
    """The payload store as one client uses it; safe to share between threads."""

    def __init__(self, settings: Settings, url: str, clock: Clock) -> None:
        self.settings = settings
        self.url = url
        self.clock = clock
        self._io: tuple[Offloader, PayloadReader] | None = None
        self._signer: MarkerSigner | None = None
        self._lock = threading.Lock()

    def _open(self) -> tuple[Offloader, PayloadReader]:
        with self._lock:
            if self._io is None:
                store = open_store(self.settings, self.url, self.clock)
                self._io = (Offloader(store, self.clock), PayloadReader(store, self.clock))
            return self._io

    def signer(self) -> MarkerSigner:
        """What signs this client's argument markers; its secret is read on first use."""
        with self._lock:
            if self._signer is None:
                self._signer = marker_signer(self.settings, redis_client(self.url))
            return self._signer

    def fetch(self, ref: PayloadRef) -> bytes:
        return self._open()[1].fetch(ref)

    def load(self, ref: PayloadRef) -> Any:
        return self._open()[1].load(ref)

    def read(self, ref: PayloadRef | str, offset: int, limit: int) -> PayloadPage:
        return self._open()[1].read(ref, offset, limit)

    def store_large_arguments(
        self, ctx: CallContext, arguments: dict[str, Any]
    ) -> tuple[dict[str, Any], str | None]:
        """Arguments with each one over the threshold stored, or why they cannot be sent.

        A stored argument must outlive the call (the worker reads it on every
        attempt) and its reply, so its TTL is at least the call's time left.
        """
        threshold = self.settings.payload_threshold_bytes
        if len(json.dumps(arguments)) <= threshold:
            return arguments, None
        ttl = max(self.settings.payload_ttl_s, ctx.deadline - self.clock.now() + REPLY_TTL_S)
        inline = store_arguments(arguments, self._open()[0], threshold, ttl, self.signer())
        size = len(json.dumps(inline))
        if size > self.settings.max_argument_bytes:
            return inline, (
                f"the arguments are {size:,} bytes of JSON even with the large ones stored "
                f"apart; the limit is {self.settings.max_argument_bytes:,}"
            )
        return inline, None

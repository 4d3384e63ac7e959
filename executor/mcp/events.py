"""The front's memory of what it sent on each SSE stream, for clients that reconnect.

A client whose connection drops mid-call reconnects with ``Last-Event-ID`` and
gets every event after it on that stream (the SDK replays them through this
store), so a long call survives a dropped connection. Events live in this
process only: a client reconnects to the front that holds its session anyway.
The store is bounded; the oldest events are forgotten first.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage

__all__ = ["MemoryEventStore"]

#: Events kept across all streams; at a few hundred bytes each, a few MB at most.
DEFAULT_MAX_EVENTS = 10_000


class MemoryEventStore(EventStore):
    """Events by id, in the order sent; ids are this process's counter, never reused."""

    def __init__(self, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        self.max_events = max_events
        self._events: OrderedDict[int, tuple[StreamId, JSONRPCMessage | None]] = OrderedDict()
        self._ids = itertools.count(1)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        number = next(self._ids)
        self._events[number] = (stream_id, message)
        while len(self._events) > self.max_events:
            self._events.popitem(last=False)
        return str(number)

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        """Send the stream's events after ``last_event_id``; None when that id is unknown."""
        if not last_event_id.isdigit() or int(last_event_id) not in self._events:
            return None
        after = int(last_event_id)
        stream = self._events[after][0]
        for number, (sid, message) in list(self._events.items()):
            if number > after and sid == stream and message is not None:
                await send_callback(EventMessage(message, str(number)))
        return stream

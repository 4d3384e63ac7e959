"""A tool that returns a stream (a generator, a file, a ``map``) is read only up to its limit.

Turning a result into JSON reads an iterator to its end: a tool returning an
endless generator grew a worker to an 8 GB allocation and the allocator
aborted it, taking every call in flight with it. So an iterator is read here,
on the tool's body thread and within its time limit, item by item, while the
JSON it makes is counted; once that passes the tool's result limit
(``max_result_bytes``, else ``TOOLEXEC_PAYLOAD_MAX_BYTES``) reading stops, the
iterator is closed and the call ends ``result_too_large``.

The items read are held as Python values until the result is stored, so the
memory a stream costs is a small multiple of the limit, never unbounded. An
iterator nested inside a returned list or dict is not looked for.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Iterator
from typing import Any

from pydantic_core import to_jsonable_python

from toolexec.errors import ResultTooLargeError

__all__ = ["bounded_body", "drained"]

_dump = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def drained(value: Any, most: int) -> Any:
    """``value`` itself, or, for an iterator, its items as a list of at most ``most`` bytes.

    Characters are counted, not bytes: never more than the UTF-8 bytes, so
    nothing under the limit is refused here, and the payload layer's exact
    check still applies to what is returned.
    """
    if not isinstance(value, Iterator):
        return value
    items: list[Any] = []
    size = 2  # the brackets
    try:
        for item in value:
            plain = to_jsonable_python(item)
            size += len(_dump(plain)) + 1
            if size > most:
                raise _endless(type(value).__name__, len(items), most)
            items.append(plain)
    finally:
        close = getattr(value, "close", None)
        if callable(close):  # a generator's finally blocks run now, a file is released
            close()
    return items


def bounded_body(func: Callable[..., Any], most: int) -> Callable[..., Any]:
    """``func`` whose returned iterator is :func:`drained` on the body thread.

    An ``async`` tool is returned unchanged: it cannot return a sync generator
    from a coroutine without building it whole first.
    """
    if asyncio.iscoroutinefunction(func):
        return func

    @functools.wraps(func)
    def body(**kwargs: Any) -> Any:
        return drained(func(**kwargs), most)

    return body


def _endless(kind: str, read: int, most: int) -> ResultTooLargeError:
    return ResultTooLargeError(
        f"the tool returned a {kind} whose items passed the result limit of {most:,} bytes "
        f"after {read:,} items; reading stopped there and nothing was stored",
        suggestion="Ask for less at once: a page, a filter or a narrower range.",
        details={"limit_bytes": most, "items_read": read},
    )

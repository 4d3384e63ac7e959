"""Where toolexec's Redis is, and clients for it.

With no ``TOOLEXEC_REDIS_URL`` the embedded server is started or found here;
with one, any Redis >= 6 or Valkey. URLs are shown only with the password
masked, because they end up in error messages and logs.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from executor.embedded import ensure_embedded
from executor.errors import RedisUnavailableError
from executor.settings import Settings

__all__ = ["fail_fast_client", "redact_url", "redis_client", "redis_url", "unavailable"]


def redis_url(settings: Settings) -> str:
    """The configured Redis URL, or the embedded server's (started if needed)."""
    if settings.redis_url:
        return settings.redis_url
    return ensure_embedded(settings.data_dir).url


def redis_client(url: str, **kwargs: Any) -> redis.Redis:
    """A client that fails fast on connect but lets blocking reads wait."""
    kwargs.setdefault("socket_connect_timeout", 5.0)
    # redis-py 8 defaults socket_timeout to 5 s, which cuts a reply wait (BLPOP) short.
    kwargs.setdefault("socket_timeout", None)
    kwargs.setdefault("health_check_interval", 30)
    return redis.Redis.from_url(url, decode_responses=True, **kwargs)


def fail_fast_client(url: str) -> redis.Redis:
    """A client for checks on the call path (breakers), where waiting is worse than failing.

    redis-py retries a failed command with backoff by default, which would add
    seconds to every tool call while Redis is down; this one gives up after a
    second and lets the caller's ``on_redis_error`` policy decide.
    """
    return redis_client(url, socket_timeout=1.0, retry=Retry(NoBackoff(), 1))


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))


def unavailable(url: str, exc: BaseException) -> RedisUnavailableError:
    """The error to raise when toolexec's Redis does not answer."""
    return RedisUnavailableError(
        f"cannot reach Redis at {redact_url(url)} ({type(exc).__name__}: {exc}); the call was "
        "not made. Check that the server is running and TOOLEXEC_REDIS_URL is right "
        "(unset it to use the embedded server)."
    )

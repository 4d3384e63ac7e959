"""Where toolexec's Redis is, and clients for it.

With no ``TOOLEXEC_REDIS_URL`` the embedded server is started or found here;
with one, any Redis >= 6 or Valkey. URLs are shown only with the password
masked, because they end up in error messages and logs.

Three kinds of URL work for toolexec's state and for the broker alike:
``redis://[:password@]host:port/db``; ``rediss://`` for TLS, with redis-py's
query parameters (``?ssl_cert_reqs=required&ssl_ca_certs=/path/ca.pem``); and
Redis Sentinel for high availability, in Celery's form plus the master's name:
``sentinel://[:password@]host1:26379/0;sentinel://host2:26379/0?master_name=mymaster``.
The password is the master's; :func:`celery_url` turns such a URL into what
Celery takes (the URL, and ``master_name`` in the transport options).

A fourth kind is for toolexec's state only: a Redis Cluster,
``redis+cluster://[:password@]host1:port[,host2:port...]`` (``rediss+cluster://``
for TLS, with the same query parameters as ``rediss://``). The hosts are seed
nodes; redis-py's ``RedisCluster`` learns the rest. kombu cannot use a cluster
as a broker, so with one the broker is set apart (``TOOLEXEC_BROKER_URL``:
RabbitMQ, or a standalone or Sentinel Redis; :class:`toolexec.settings.Settings`
refuses anything else at start).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis._parsers.commands import CommandPolicies, RequestPolicy, ResponsePolicy
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.commands.policies import BasePolicyResolver, PolicyResolver, StaticPolicyResolver
from redis.retry import Retry

from toolexec.clock import AnchoredClock, Clock
from toolexec.embedded import ensure_embedded
from toolexec.errors import ConfigurationError, RedisUnavailableError
from toolexec.policies import Jitter, RetryPolicy
from toolexec.settings import Settings
from toolexec.stores.failopen import REDIS_ERRORS

__all__ = [
    "BLIPS",
    "RECONNECT",
    "ClusterTarget",
    "ScriptPolicies",
    "SentinelTarget",
    "async_redis_client",
    "async_reply_client",
    "celery_url",
    "fail_fast_client",
    "fleet_clock",
    "is_cluster",
    "parse_cluster",
    "parse_sentinel",
    "redact_url",
    "redis_client",
    "redis_url",
    "reply_client",
    "through_blips",
    "unavailable",
]

_SENTINEL_PORT = 26379

T = TypeVar("T")

#: What a restart or a failover raises, and nothing that a retry would not cure: the
#: one definition (toolexec.stores.failopen), named for what it is to a waiter.
BLIPS = REDIS_ERRORS

#: Pauses between tries while Redis is away: a blip costs a few tenths of a second,
#: an outage one try a second.
RECONNECT = RetryPolicy(max_attempts=1, base=0.05, cap=1.0, jitter=Jitter.EQUAL)


def through_blips(
    func: Callable[[], T], within_s: float, sleep: Callable[[float], None] = time.sleep
) -> T:
    """``func()``, tried again after :data:`BLIPS` with backoff for ``within_s`` seconds.

    For writes a call's outcome depends on (its answer, its idempotency
    record): failing them on a restart that lasts a second would throw away
    work already done. The caller bounds ``within_s`` by how long the write
    is still useful, usually the call's deadline; the last error is raised.
    """
    give_up = time.monotonic() + max(0.0, within_s)
    rng = random.Random()
    for failures in itertools.count(1):
        try:
            return func()
        except BLIPS:
            left = give_up - time.monotonic()
            if left <= 0:
                raise
            sleep(min(left, RECONNECT.backoff(failures, None, rng)))
    raise AssertionError("unreachable")  # itertools.count never ends


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
    kwargs.setdefault("decode_responses", True)  # False for bytes (payloads)
    if is_sentinel(url):
        target = parse_sentinel(url)
        sentinels = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            target.sentinels, sentinel_kwargs=target.sentinel_kwargs(kwargs)
        )
        master: redis.Redis = sentinels.master_for(  # type: ignore[no-untyped-call]
            target.master, **target.master_kwargs(), **kwargs
        )
        return master
    if is_cluster(url):
        return _cluster_client(parse_cluster(url), kwargs)
    return redis.Redis.from_url(url, **kwargs)


#: A cluster client's retries of a command whose node failed: redis-py's default
#: (10, up to 1 s apart) can hold a call for seconds past its deadline while a
#: failover runs; three retries within about a second find an elected replica
#: or give up, and the caller's failure policy decides.
_CLUSTER_RETRIES = 3


def _cluster_retry() -> Retry:
    return Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), _CLUSTER_RETRIES)


#: A script's keys follow its key count, so its slot is read from the command itself.
_KEYED = CommandPolicies(
    request_policy=RequestPolicy.DEFAULT_KEYED, response_policy=ResponsePolicy.DEFAULT_KEYED
)


class ScriptPolicies(BasePolicyResolver):
    """redis-py's command policies, with ``EVAL`` and ``EVALSHA`` known to be keyed.

    Without a policy for a command, redis-py 8's cluster pipeline asks a node
    ``COMMAND GETKEYS`` for every such command it queues, only to learn whether
    it has keys: one more round trip to the default node per script, two per
    call, and a dependency on that node (dead during a failover) even for a
    pipeline bound elsewhere. Its single-command path reads a script's keys from
    the command already; with this policy the pipeline does the same.
    """

    def __init__(self, fallback: PolicyResolver | None = None) -> None:
        scripts = {"eval": _KEYED, "evalsha": _KEYED}
        super().__init__({"core": scripts}, fallback or StaticPolicyResolver())

    def with_fallback(self, fallback: PolicyResolver) -> PolicyResolver:
        return ScriptPolicies(fallback)


class _Cluster(redis.cluster.RedisCluster):
    """A ``RedisCluster`` whose pipelines share its command policies.

    ``RedisCluster.pipeline()`` builds its pipeline with redis-py's default
    policies, not the client's; the pipeline reads them at execution time, so
    they are handed on here. Were the attribute to go in a later redis-py,
    pipelines would only be back to the extra ``COMMAND GETKEYS`` (a cluster
    test counts them).
    """

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)  # type: ignore[no-untyped-call]
        if hasattr(pipe, "_policy_resolver"):
            pipe._policy_resolver = self._policy_resolver
        return pipe


def _cluster_client(target: ClusterTarget, kwargs: dict[str, Any]) -> redis.Redis:
    kwargs.setdefault("retry", _cluster_retry())
    kwargs.setdefault("policy_resolver", ScriptPolicies())
    nodes = [redis.cluster.ClusterNode(h, p) for h, p in target.nodes]  # type: ignore[no-untyped-call]
    cluster = _Cluster(startup_nodes=nodes, **target.client_kwargs(), **kwargs)
    # RedisCluster speaks every command the stores use (keys are routed by slot);
    # it is not a redis.Redis subclass, hence the cast.
    return cast(redis.Redis, cluster)


def _async_cluster_client(target: ClusterTarget, kwargs: dict[str, Any]) -> redis.asyncio.Redis:
    kwargs.setdefault("retry", _cluster_retry())
    nodes = [redis.asyncio.cluster.ClusterNode(h, p) for h, p in target.nodes]
    cluster = redis.asyncio.cluster.RedisCluster(
        startup_nodes=nodes, decode_responses=True, **target.client_kwargs(), **kwargs
    )
    return cast(redis.asyncio.Redis, cluster)


def async_redis_client(url: str, **kwargs: Any) -> redis.asyncio.Redis:
    """The asyncio twin of :func:`redis_client`, for callers that await replies."""
    kwargs.setdefault("socket_connect_timeout", 5.0)
    if is_sentinel(url):
        target = parse_sentinel(url)
        sentinels = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            target.sentinels, sentinel_kwargs=target.sentinel_kwargs(kwargs)
        )
        master: redis.asyncio.Redis = sentinels.master_for(
            target.master, decode_responses=True, **target.master_kwargs(), **kwargs
        )
        return master
    if is_cluster(url):
        return _async_cluster_client(parse_cluster(url), kwargs)
    return redis.asyncio.Redis.from_url(url, decode_responses=True, **kwargs)


def is_sentinel(url: str) -> bool:
    return url.startswith("sentinel://")


def is_cluster(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
    return url.startswith(("redis+cluster://", "rediss+cluster://"))


#: Query parameters of a ``rediss+cluster://`` URL passed on to redis-py (TLS only:
#: anything else in the query is refused rather than silently ignored).
_CLUSTER_QUERY = frozenset(
    {"ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname"}
)


@dataclass(frozen=True)
class ClusterTarget:
    """A Redis Cluster: seed nodes, credentials and TLS options."""

    nodes: list[tuple[str, int]]
    tls: bool = False
    username: str | None = None
    password: str | None = None
    tls_options: tuple[tuple[str, str], ...] = ()

    def client_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"username": self.username, "password": self.password}
        if self.tls:
            out["ssl"] = True
            out.update(self.tls_options)
        return out


def parse_cluster(url: str) -> ClusterTarget:
    """The seed nodes, credentials and TLS options of a ``redis+cluster://`` URL.

    A cluster has one database, so a path other than ``/`` or ``/0`` is refused.
    """
    scheme, _, rest = url.partition("://")
    netloc, _, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    if "?" in netloc:
        netloc, _, query = netloc.partition("?")
    credentials, _, hosts = netloc.rpartition("@")
    nodes = [_host_port(url, chunk) for chunk in hosts.split(",") if chunk.strip()]
    if not nodes:
        raise ConfigurationError(f"{redact_url(url)} names no cluster node (host:port)")
    if path.strip("/") not in ("", "0"):
        raise ConfigurationError(
            f"{redact_url(url)} names database {path.strip('/')!r}; a Redis Cluster has only "
            "database 0 (use TOOLEXEC_KEY_PREFIX to share a cluster between deployments)"
        )
    options = parse_qsl(query)
    unknown = sorted({k for k, _ in options} - _CLUSTER_QUERY)
    if unknown:
        raise ConfigurationError(
            f"{redact_url(url)}: unknown parameter(s) {', '.join(unknown)} (a cluster URL "
            f"takes {', '.join(sorted(_CLUSTER_QUERY))})"
        )
    user, _, password = credentials.partition(":")
    return ClusterTarget(
        nodes=nodes,
        tls=scheme == "rediss+cluster",
        username=unquote(user) or None,
        password=unquote(password) or None,
        tls_options=tuple(options),
    )


def _host_port(url: str, chunk: str) -> tuple[str, int]:
    host, _, port = chunk.strip().rpartition(":")
    if not host or not port.isdigit():
        raise ConfigurationError(
            f"{redact_url(url)}: {chunk.strip()!r} is not host:port (every cluster node "
            "needs its port, e.g. redis+cluster://10.0.0.1:7000,10.0.0.2:7000)"
        )
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class SentinelTarget:
    """A master behind Redis Sentinel: where the sentinels are and which master to ask for."""

    sentinels: list[tuple[str, int]]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None

    def master_kwargs(self) -> dict[str, Any]:
        return {"db": self.db, "username": self.username, "password": self.password}

    @staticmethod
    def sentinel_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
        """Timeouts for the sentinels themselves (they need no password here)."""
        return {k: v for k, v in kwargs.items() if k.startswith("socket_")}


def parse_sentinel(url: str) -> SentinelTarget:
    """The sentinels, master name, database and master credentials of a ``sentinel://`` URL."""
    chunks = _chunks(url)
    query = {k: v for chunk in chunks for k, v in parse_qsl(chunk.query)}
    master = query.get("master_name")
    if not master:
        raise ConfigurationError(
            f"{redact_url(url)} names no master: add ?master_name=<name> (the name the "
            "sentinels monitor, e.g. mymaster) to the sentinel:// URL"
        )
    first = chunks[0]
    path = first.path.strip("/")
    return SentinelTarget(
        sentinels=[(c.hostname or "127.0.0.1", c.port or _SENTINEL_PORT) for c in chunks],
        master=master,
        db=int(path) if path.isdigit() else 0,
        username=unquote(first.username) if first.username else None,
        password=unquote(first.password) if first.password else None,
    )


def _chunks(url: str) -> list[Any]:
    return [urlsplit(chunk) for chunk in url.split(";") if chunk.strip()]


def celery_url(url: str) -> tuple[str, dict[str, Any]]:
    """``url`` as Celery's broker or result backend takes it, and the transport options it needs.

    Celery reads a sentinel's master name from the transport options, not the
    URL, and its backend refuses a ``rediss://`` URL without ``ssl_cert_reqs``
    (redis-py's own default, ``required``, is added).
    """
    if is_sentinel(url):
        master = parse_sentinel(url).master
        bare = [c._replace(query=_without(c.query, "master_name")) for c in _chunks(url)]
        return ";".join(urlunsplit(c) for c in bare), {"master_name": master}
    parts = urlsplit(url)
    if parts.scheme == "rediss" and "ssl_cert_reqs" not in dict(parse_qsl(parts.query)):
        query = "&".join(q for q in (parts.query, "ssl_cert_reqs=required") if q)
        return urlunsplit(parts._replace(query=query)), {}
    return url, {}


def _without(query: str, name: str) -> str:
    return urlencode([(k, v) for k, v in parse_qsl(query) if k != name])


def fail_fast_client(url: str) -> redis.Redis:
    """A client for checks on the call path (breakers), where waiting is worse than failing.

    redis-py retries a failed command with backoff by default, which would add
    seconds to every tool call while Redis is down; this one gives up after a
    second and lets the caller's ``on_redis_error`` policy decide.
    """
    return redis_client(url, socket_timeout=1.0, retry=Retry(NoBackoff(), 1))


def reply_client(url: str, *, block_s: float) -> redis.Redis:
    """A client for reply waits, which must neither hang on a dead peer nor retry on its own.

    Blocking reads of ``block_s`` at most, with a socket timeout a few seconds
    above, end a wait on a half-open connection (a partitioned or frozen
    server) within that time instead of never; the waiter retries with its
    own backoff until the call's deadline, so redis-py's built-in retries are
    off (they would sleep past the deadline on a long outage).
    """
    return redis_client(url, socket_timeout=block_s + 4.0, retry=Retry(NoBackoff(), 0))


def async_reply_client(url: str, *, block_s: float) -> redis.asyncio.Redis:
    """The asyncio twin of :func:`reply_client`."""
    from redis.asyncio.retry import Retry as AsyncRetry

    return async_redis_client(url, socket_timeout=block_s + 4.0, retry=AsyncRetry(NoBackoff(), 0))


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (in each of a sentinel URL's parts)."""
    if is_cluster(url):
        scheme, _, rest = url.partition("://")
        credentials, at, hosts = rest.rpartition("@")
        if not at or ":" not in credentials:
            return url
        return f"{scheme}://{credentials.partition(':')[0]}:***@{hosts}"
    if ";" in url:
        return ";".join(redact_url(chunk) for chunk in url.split(";"))
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


def fleet_clock(client: redis.Redis, base: Clock | None = None) -> AnchoredClock:
    """The fleet's clock: ``base`` (the host's clock) anchored on ``client``'s Redis ``TIME``.

    Deadlines are compared on other hosts than the one that set them; with both
    ends on this clock, a skew between the hosts' own clocks cannot make a
    worker refuse a call early or start one after its deadline.
    """

    def redis_time() -> float:
        seconds, micros = client.time()
        return float(seconds) + float(micros) / 1_000_000

    return AnchoredClock(redis_time, base)

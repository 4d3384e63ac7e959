"""All configuration in one frozen object, built at the entry points.

Nothing reads the environment at import time: the CLI, the Celery app's
``on_configure`` hook and :meth:`ToolClient.from_env` call
:meth:`Settings.from_env` when they start. Every field is documented in the
configuration table (docs/ops/configuration.md); the environment variable is the field name in
upper case with the ``TOOLEXEC_`` prefix.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = ["PROJECT_MARKERS", "Settings", "project_data_dir", "project_root"]


#: Files or folders that mark a project's root folder (the nearest one above the
#: working directory that holds one of them).
PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")


def project_root(cwd: Path) -> Path:
    """The project the working directory belongs to: the nearest folder at or above it that
    holds a :data:`PROJECT_MARKERS` entry, else the working directory itself (pure but for
    reading the folders)."""
    for folder in (cwd, *cwd.parents):
        if any((folder / marker).exists() for marker in PROJECT_MARKERS):
            return folder
    return cwd


def project_data_dir(base: Path, root: Path) -> Path:
    """A data folder of the project at ``root``: its name and a hash of its path (pure).

    Two checkouts on one host (two projects, or two clones of one) get two folders, so
    two embedded servers and two tool catalogs; a worker and a client started anywhere
    inside the same project share one.
    """
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:10]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", root.name)[:40] or "root"
    return base / "toolexec" / "projects" / f"{name}-{digest}"


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return project_data_dir(Path(base), project_root(Path.cwd().resolve()))


class Settings(BaseSettings):
    """toolexec's settings; docs/ops/configuration.md says what each variable does."""

    model_config = SettingsConfigDict(env_prefix="TOOLEXEC_", frozen=True, extra="ignore")

    redis_url: str | None = Field(
        default=None,
        description="Redis or Valkey for toolexec's state; unset starts an embedded Valkey.",
    )
    broker_url: str | None = Field(
        default=None,
        description="Celery broker; defaults to the Redis URL (amqp:// works too; "
        "required when the Redis URL is a redis+cluster:// one).",
    )
    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="Where the embedded server keeps its pidfile, URL file and log; the "
        "default is one folder per project (the nearest folder above the working directory "
        "with a pyproject.toml, setup.py, setup.cfg or .git) under "
        "$XDG_DATA_HOME/toolexec/projects, so two projects never share a server.",
    )
    key_prefix: str = Field(default="toolexec", description="Prefix of every Redis key.")
    tenant: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="A client's tenant: scopes its runs' guard state, its calls' idempotency "
        "records and last-good results, so other tenants cannot read, replay or reset them.",
    )
    tools: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated modules a worker imports for tools."
    )
    default_queue: str = Field(default="tools", description="Queue of tools that name none.")
    default_timeout: float = Field(
        default=60.0, gt=0, description="Deadline in seconds of a call that gives none."
    )
    max_timeout: float = Field(
        default=900.0, gt=0, description="Longest deadline a caller may ask for, in seconds."
    )
    max_batch_calls: int = Field(
        default=10_000,
        gt=0,
        le=1_000_000,
        description="Most calls one call_many (or model response) may hold; a larger batch is "
        "refused before anything is sent (docs/limits.md).",
    )
    reply_grace: float = Field(
        default=2.0,
        ge=0,
        description="How long a client waits past the deadline for the worker's own verdict.",
    )
    retry_after_cap_s: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="Longest Retry-After honoured, for the retry countdown and a breaker's "
        "open time alike: one URL's server cannot close a tool for everyone for longer.",
    )
    max_argument_bytes: int = Field(
        default=1_000_000, gt=0, description="Largest JSON-encoded arguments a call may carry."
    )
    catalog_cache_s: float = Field(
        default=5.0, ge=0, description="How long a client trusts its copy of the catalog."
    )
    worker_pool: Literal["threads", "prefork", "solo", "gevent", "eventlet"] = Field(
        default="threads", description="Celery pool of `toolexec worker`."
    )
    worker_concurrency: int = Field(
        default=32, gt=0, description="Slots per worker process (calls in parallel)."
    )
    worker_processes: int | None = Field(
        default=None,
        ge=1,
        le=512,
        description="Processes of `toolexec worker`, each with its own slots, sharing the "
        "queues (default: one per core with the default threads pool, else 1; "
        "`--processes` wins).",
    )
    worker_max_scheduled: int = Field(
        default=1_000,
        gt=0,
        le=1_000_000,
        description="Most messages with a future eta (retry backoffs, deferrals) a worker "
        "holds in memory; more are dead-lettered.",
    )
    eta_horizon_s: float = Field(
        default=900.0,
        gt=0,
        le=30 * 86_400,
        description="Furthest eta a worker accepts for a message without a call deadline, "
        "in seconds; later ones are dead-lettered (a call's own deadline bounds its eta).",
    )
    breaker_on_redis_error: Literal["allow", "deny"] = Field(
        default="allow",
        description="What breakers answer while Redis is unreachable: let calls through or refuse.",
    )
    idempotency_lease_s: float = Field(
        default=5.0,
        gt=0,
        description="Lease every running call holds: a crashed worker's call is taken "
        "over about this long after it stopped renewing (renewed every third of it).",
    )
    idempotency_sweep_s: float = Field(
        default=0.5, gt=0, description="How often each worker looks for expired leases."
    )
    idempotency_retention_s: float = Field(
        default=86_400.0,
        gt=0,
        description="How long a finished side-effecting call's outcome is kept for replay.",
    )
    task_events: bool = Field(
        default=True, description="Send task events so Flower and `celery events` see calls."
    )
    rabbitmq_priorities: bool = Field(
        default=False,
        description="On RabbitMQ, declare queues with x-max-priority 5 so workers take calls "
        "by priority; a queue declared without it must be drained and deleted first "
        "(docs/guides/fairness.md).",
    )
    rabbitmq_fairness: bool = Field(
        default=False,
        description="On RabbitMQ, send calls with a fairness key to per-key queues that "
        "workers consume side by side, a key's weight its number of queues; set it on "
        "workers and clients alike (docs/guides/fairness.md).",
    )
    payload_store: str = Field(
        default="redis",
        description="Where large results and arguments go: redis, file:///dir or s3://bucket/prefix.",
    )
    payload_threshold_bytes: int = Field(
        default=32_768, gt=0, description="A result or argument larger than this is stored."
    )
    payload_token_budget: int = Field(
        default=600,
        ge=200,  # toolexec.payloads.tokens.MIN_TOKEN_BUDGET
        description="A result estimated above this many tokens is stored; its preview fits in it.",
    )
    payload_max_bytes: int = Field(
        default=268_435_456, gt=0, description="Largest result or argument a payload store takes."
    )
    payload_ttl_s: float = Field(
        default=3600.0, gt=0, description="How long a stored payload can be read back, in seconds."
    )
    payload_secret: SecretStr | None = Field(
        default=None,
        description="Key of the HMAC that signs argument payload markers (the same on clients "
        "and workers); unset: a random one is created once in Redis and shared through it.",
    )
    payload_s3_endpoint_url: str | None = Field(
        default=None, description="S3-compatible endpoint (MinIO, moto, ...); unset: AWS."
    )
    payload_s3_region: str | None = Field(
        default=None, description="Region of the S3 bucket; unset: boto3's default."
    )
    faults_enabled: bool = Field(
        default=False,
        description="Apply fault-injection configs on this worker (tests only, never production).",
    )
    faults: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description='Fault configs per tool, as JSON: {"tool": {"rate": 0.3, "error": "timeout"}}.',
    )
    rate_limits: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description='Rate limits replacing tools\' own: {"tool": {"rate": 5, "burst": 10}}.',
    )
    stats: bool = Field(
        default=True,
        description="Workers count calls per tool and minute in Redis, for `toolexec status`.",
    )
    metrics_port: int | None = Field(
        default=None,
        gt=0,
        lt=65536,
        description="Serve Prometheus metrics on this port from each worker (`--metrics-port`).",
    )
    metrics_address: str = Field(
        default="127.0.0.1",
        description="Address the metrics server listens on; 0.0.0.0 for a remote Prometheus.",
    )
    log_format: Literal["text", "json"] = Field(
        default="text", description="Worker log lines as text, or one JSON object per line."
    )
    http_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Hosts and networks `http_request` may reach although they are loopback, "
        "private, link-local or cloud metadata: comma-separated hosts, IPs and CIDRs.",
    )
    http_max_response_bytes: int = Field(
        default=10_485_760,
        gt=0,
        description="Largest response body `http_request` reads (streamed; a larger one is "
        "result_too_large, and the download stops there).",
    )
    flower_user: str | None = Field(
        default=None, description="Basic-auth user of `toolexec flower`."
    )
    flower_password: SecretStr | None = Field(
        default=None, description="Basic-auth password of `toolexec flower` (never logged)."
    )
    flower_address: str = Field(
        default="127.0.0.1", description="Address `toolexec flower` listens on."
    )
    flower_port: int = Field(default=5555, gt=0, lt=65536, description="Port of `toolexec flower`.")

    mcp_call_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Deadline in seconds of a call made through `toolexec mcp`, capped by the "
        "client's own timeout when it sends one (_meta toolexec/timeout_s).",
    )
    mcp_token: SecretStr | None = Field(
        default=None,
        description="Bearer token `toolexec mcp --http` requires; needed to listen beyond "
        "loopback (never logged).",
    )
    mcp_token_key: SecretStr | None = Field(
        default=None,
        description="Fernet key that seals the OAuth tokens of remote MCP servers in Redis, "
        "shared by the fleet; unset: each process keeps its own in memory (never logged).",
    )
    mcp_allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Origins `toolexec mcp --http` accepts besides loopback ones, comma-separated "
        "(http://host:port, or http://host:* for any port).",
    )
    mcp_max_request_bytes: int = Field(
        default=1_048_576,
        gt=0,
        description="Largest request body `toolexec mcp --http` reads; larger ones get 413.",
    )
    mcp_max_sessions: int = Field(
        default=1000,
        gt=0,
        le=100_000,
        description="Most sessions `toolexec mcp --http` keeps open (each holds about 37 KB); "
        "one more is refused with HTTP 503, Retry-After and data.type too_many_sessions.",
    )
    mcp_session_idle_s: float = Field(
        default=1800.0,
        gt=0,
        le=604_800,
        description="An MCP session with no request in flight for this long is ended "
        "(its id then answers 404 and the client opens a new one).",
    )
    mcp_catalog_poll_s: float = Field(
        default=2.0,
        gt=0,
        description="How often `toolexec mcp` reads the catalog to send tools/list_changed.",
    )
    mcp_progress_s: float = Field(
        default=1.0,
        gt=0,
        description="How often `toolexec mcp` reports progress on a call in flight, when the "
        "client sent a progress token.",
    )
    mcp_guard: bool = Field(
        default=True,
        description="Run `toolexec mcp` calls under the run guard (one run per MCP session, "
        "per Toolexec-Run-Id header, or per _meta toolexec/run_id).",
    )
    mcp_servers: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description='Policies of remote MCP servers a worker proxies, as JSON: {"name": '
        '{"timeout": 10, "max_attempts": 3, "queue": "mcp", "side_effects": {"tool": true}, '
        '"headers": {"Authorization": "Bearer ..."}}}.',
    )

    @field_validator(
        "mcp_token",
        "mcp_token_key",
        "payload_secret",
        "flower_user",
        "flower_password",
        mode="before",
    )
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        """An empty or blank secret is no secret: read as unset, once, for every reader.

        ``${VAR:-}`` in a compose file passes an empty string. Were it a value,
        one reader testing ``is not None`` and another testing truthiness would
        disagree: the MCP bind check saw a token while the HTTP app served
        without auth, and the payload signer took an empty HMAC key.
        """
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        return None if isinstance(text, str) and not text.strip() else value

    @field_validator("tools", "http_allow", "mcp_allowed_origins", mode="before")
    @classmethod
    def _split_modules(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("payload_store")
    @classmethod
    def _known_store(cls, value: str) -> str:
        if value == "redis" or value.startswith(("file://", "s3://")):
            return value
        raise ValueError(
            f"TOOLEXEC_PAYLOAD_STORE must be redis, file:///a/directory or s3://bucket/prefix, "
            f"not {value!r}"
        )

    @model_validator(mode="after")
    def _broker_apart_from_cluster(self) -> Settings:
        """kombu has no Redis Cluster transport: refuse at start what would fail at publish."""
        cluster = ("redis+cluster://", "rediss+cluster://")
        if self.broker_url and self.broker_url.startswith(cluster):
            raise ValueError(
                "TOOLEXEC_BROKER_URL is a Redis Cluster URL, but Celery's Redis transport "
                "cannot use a cluster as its broker: use RabbitMQ (amqp://...) or a "
                "standalone or Sentinel Redis, and keep the cluster in TOOLEXEC_REDIS_URL"
            )
        if self.redis_url and self.redis_url.startswith(cluster) and not self.broker_url:
            raise ValueError(
                "TOOLEXEC_REDIS_URL is a Redis Cluster, which cannot also be Celery's broker "
                "(the default): set TOOLEXEC_BROKER_URL to RabbitMQ (amqp://...) or a "
                "standalone or Sentinel Redis"
            )
        return self

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """Settings from ``TOOLEXEC_*`` variables, with explicit overrides on top."""
        return cls(**overrides)

    @property
    def visibility_timeout(self) -> int:
        """Seconds before the Redis broker redelivers an unacknowledged message.

        Every countdown and every run ends by the call's deadline, which is at
        most ``max_timeout``; a message held longer than that belongs to a dead
        worker, so redelivering it sooner than the 1 h default is safe and makes
        recovery from a killed worker faster (docs/background.md, Celery).

        It cannot be shorter: an ``acks_late`` message still held when it runs
        out (a long call, a countdown waiting for its time) is delivered again
        while the first copy lives. Side-effecting and coalesced calls do not
        wait for it: their lease (``idempotency_lease_s``) lets another worker
        take a dead worker's call over within seconds, and when the broker's
        copy comes back at last, the call's record makes it a replay
        (``toolexec.idempotency``). Give clients and workers the same
        ``max_timeout``: a deadline beyond the workers' visibility timeout gets
        its message redelivered while it still runs.
        """
        return int(self.max_timeout) + 60

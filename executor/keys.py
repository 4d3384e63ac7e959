"""Every Redis key toolexec writes, built in one place.

Each TTL sits next to its key with the reason for its length, so that an
operator reading ``redis-cli --scan`` can tell what a key is and when it goes.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

__all__ = ["SHARD_BUCKETS", "BrokerKeys", "Keys", "bucket_of"]

#: How many buckets each fleet-wide index (idempotency leases, in-flight
#: attempts, per-minute stats) is split into. Each bucket is its own hash tag,
#: so on a Redis Cluster the buckets land on different slots and so on
#: different shards; on one Redis they only cost a few more small keys. 16
#: spreads evenly enough over up to ~8 shards without making a reader (the
#: sweeper, ``toolexec status``) touch many keys.
SHARD_BUCKETS = 16


def bucket_of(name: str, buckets: int = SHARD_BUCKETS) -> int:
    """The bucket of ``name``: stable across processes and hosts (not ``hash()``)."""
    return zlib.crc32(name.encode()) % buckets


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix, so several deployments can share a server.

    ``tenant`` (``TOOLEXEC_TENANT``) scopes what belongs to one caller's runs
    (:meth:`run`); a call carries it to the workers, which scope its
    idempotency record by it. What protects a service for everyone (breakers,
    rate limits, retry budgets, counters) stays shared across tenants.
    """

    prefix: str = "toolexec"
    buckets: int = SHARD_BUCKETS
    tenant: str | None = None

    def catalog(self) -> str:
        """Hash: tool name -> JSON catalog entry, published by every worker at start.

        No TTL: an entry stays until a worker publishes a newer one, so clients
        can validate calls even while every worker is restarting.

        ``{fleet}`` is a hash tag shared with :meth:`workers` and
        :meth:`queue_workers`: a worker publishes all three in one MULTI/EXEC,
        which a Redis Cluster allows only within one slot. They are written
        every 2 s per worker and read through clients' caches, so one slot
        carries them easily.
        """
        return f"{self.prefix}:{{fleet}}:catalog"

    def workers(self) -> str:
        """Sorted set: worker hostname scored by its last heartbeat (epoch s).

        No TTL: a worker removes itself when it shuts down cleanly, and members
        older than :data:`WORKER_FORGET_S` are pruned by every heartbeat, so a
        killed worker's entry does not stay for ever.
        """
        return f"{self.prefix}:{{fleet}}:workers"

    def scheduled(self) -> str:
        """Hash: worker hostname -> JSON ``{"held": n, "max": m}``, its messages with a future eta.

        Written with every heartbeat, for ``toolexec status``; a worker removes its
        field when it leaves. TTL :data:`WORKER_FORGET_S`, refreshed by each beat:
        once every worker is gone for that long, nobody needs the counts.
        """
        return f"{self.prefix}:{{fleet}}:scheduled"

    def queue_workers(self, queue: str) -> str:
        """Sorted set: the workers consuming ``queue``, scored by their last heartbeat.

        Lets a client answer at once when nothing serves a tool's queue. No TTL,
        pruned like :meth:`workers` (a queue nobody serves any more keeps an
        empty set, which Redis deletes).
        """
        return f"{self.prefix}:{{fleet}}:workers:{queue}"

    def deadletter(self) -> str:
        """List: one JSON entry per task message a worker refused (``toolexec.pipeline.poison``).

        Newest first, trimmed to :data:`DEADLETTER_MAX` entries. An entry holds
        the message's id, task, queue, the reason and the body's size and sha256,
        never the body (it may carry secrets). TTL :data:`DEADLETTER_TTL_S`,
        refreshed by every refusal: long enough to look into over a weekend.
        """
        return f"{self.prefix}:deadletter"

    def reply(self, reply_to: str) -> str:
        """List a worker pushes final results onto; the caller pops them.

        TTL: :data:`REPLY_TTL_S` past the call's deadline, so that replies for
        callers that died or gave up do not pile up.
        """
        return f"{self.prefix}:reply:{reply_to}"

    def approvals(self) -> str:
        """Hash of the calls waiting for a person's approval: call id -> what to show (JSON).

        No TTL: an entry goes when the call is decided or stops waiting, and
        ``toolexec approvals list`` drops entries past their ``expires_at`` (a call
        whose worker and queue both vanished).
        """
        return f"{self.prefix}:approvals"

    def approval(self, call_id: str) -> str:
        """A call's approval decision (JSON): the first decision written wins (SET NX).

        TTL: :data:`APPROVAL_DECISION_TTL_S`, past any call's deadline, so a parked
        call that comes back late still finds it.
        """
        return f"{self.prefix}:approval:{call_id}"

    def resource_updates(self) -> str:
        """Pub/sub channel of changed resource URIs (``toolexec.resources.notify_updated``).

        No TTL: a channel holds nothing; fronts subscribed at the time hear it.
        """
        return f"{self.prefix}:resource-updates"

    def caller(self, call_id: str) -> str:
        """What the caller of a call can answer (JSON), set by the MCP front before it publishes.

        A tool that asks its caller (``toolexec.caller``) reads it first: no key, no one
        to ask, and the tool gets a typed refusal at once instead of waiting out its
        deadline. TTL: the call's deadline plus :data:`REPLY_TTL_S`.
        """
        return f"{self.prefix}:caller:{call_id}"

    def asks(self, call_id: str) -> str:
        """List a running tool pushes its questions and log lines onto; the front pops them.

        TTL: the call's deadline plus :data:`REPLY_TTL_S`, refreshed by every push.
        """
        return f"{self.prefix}:asks:{call_id}"

    def answer(self, call_id: str, ask: int) -> str:
        """List the front pushes the caller's answer to one question onto; the tool pops it.

        TTL: the call's deadline plus :data:`REPLY_TTL_S` (an answer no one pops expires).
        """
        return f"{self.prefix}:answer:{call_id}:{ask}"

    def breaker(self, name: str) -> str:
        """Hash: one circuit breaker's whole state (state, window, open-until, ...).

        ``{name}`` is a hash tag: a breaker's keys share one Redis Cluster slot,
        so its Lua scripts may touch them all. TTL: :data:`BREAKER_IDLE_TTL_S`
        past the later of now and open-until, refreshed by every write; none
        while an operator isolates the breaker (it must stay open until reset).
        """
        return f"{self.prefix}:breaker:{{{name}}}"

    def breaker_probes(self, name: str) -> str:
        """Sorted set: probe permit id -> lease end (epoch s) of a half-open breaker.

        Same hash tag and TTL as :meth:`breaker`; a permit itself ends at its
        score, so a probe holder that died gives its permit back by then.
        """
        return f"{self.prefix}:breaker:{{{name}}}:probes"

    def breaker_gate(self, name: str) -> str:
        """String: ``"<state> <open_until> <isolated>"`` of a breaker that is not closed.

        Written only on a transition or while the breaker is open or half-open,
        never by the calls a closed breaker counts, and every write is published
        on a channel of the same name, so a client keeps a local copy that is
        dropped the moment the breaker moves (toolexec.breaker.gate). Absent
        means closed. Same hash tag and TTL as :meth:`breaker` (none while
        isolated); a closing transition deletes it.
        """
        return f"{self.prefix}:breaker:{{{name}}}:gate"

    def breaker_done(self, name: str) -> str:
        """Sorted set: ids of the records this breaker counted -> until when to remember them.

        A record that a worker sends again after a broken connection (it may or
        may not have been applied) finds its id here and is not counted twice
        (``toolexec.layers.batch``, held writes). Same hash tag as :meth:`breaker`.
        TTL: the latest member's score (the call's deadline and a margin), after
        which no copy of the record can arrive; members past it are pruned by
        every record, so the set holds at most the calls of one deadline.
        """
        return f"{self.prefix}:breaker:{{{name}}}:done"

    def breaker_gates(self) -> str:
        """Pub/sub pattern matching every :meth:`breaker_gate` channel (no TTL: not a key).

        The prefix is escaped, so glob characters in it match only themselves.
        """
        escaped = "".join(f"\\{c}" if c in "*?[]\\" else c for c in self.prefix)
        return f"{escaped}:breaker:*:gate"

    def breakers(self) -> str:
        """Sorted set: breaker name -> when a process last registered it (epoch s).

        No TTL: one short member per breaker, for ``toolexec breakers``. Members
        whose state has expired and that nobody registered for longer than
        :data:`BREAKER_IDLE_TTL_S` are pruned when the breakers are listed.
        """
        return f"{self.prefix}:breakers"

    def idempotency_bucket(self, record: str) -> str:
        """The hash tag of ``record`` and of the lease bucket it is indexed in.

        A record, its waiters, its bucket of the lease index and that bucket's
        fencing-token counter are one unit that one Lua script changes
        atomically, so they share one tag and one Redis Cluster slot; the
        :attr:`buckets` tags spread the records of the fleet over the shards.
        """
        return f"{{idem:{bucket_of(record, self.buckets)}}}"

    def idempotency(self, record: str) -> str:
        """Hash: one idempotency record: state, lease, fencing token, stored result.

        ``record`` is :func:`toolexec.idempotency.record_id`; its hash tag is
        :meth:`idempotency_bucket`.
        TTL: ``TOOLEXEC_IDEMPOTENCY_RETENTION_S`` (a day) from its last write: a
        replay must still work when an agent repeats a call hours later. A
        coalesced or merely leased call's record is deleted when the call ends
        and has nothing to replay: it expires a minute after the call's time
        budget, a net under a record whose every holder died.
        """
        return f"{self.prefix}:idem:{self.idempotency_bucket(record)}:{record}"

    def idempotency_waiters(self, record: str) -> str:
        """Sorted set: contexts (JSON) of calls joined to a running one, by deadline.

        Same hash tag and TTL as :meth:`idempotency`; emptied when the call ends.
        """
        return f"{self.idempotency(record)}:waiters"

    def idempotency_leases(self, bucket: int) -> str:
        """Sorted set: record -> when its lease ends (epoch s), for one bucket of records.

        What sweepers scan, one bucket at a time. No TTL: a member goes when its
        call ends or a sweeper finds it over.
        """
        return f"{self.prefix}:idem:{{idem:{bucket}}}:leases"

    def idempotency_leases_of(self, record: str) -> str:
        """The lease-index bucket ``record`` is in (same slot as the record)."""
        return self.idempotency_leases(bucket_of(record, self.buckets))

    def idempotency_tokens(self, record: str) -> str:
        """String: the fencing-token counter of ``record``'s bucket; only ever incremented.

        One counter per bucket, not per fleet: tokens only have to grow for
        each record, and a bucket's counter does (a record never changes
        bucket). Kept apart from the record because a released record is
        deleted, and its next holder must still get a larger token. No TTL.
        """
        return f"{self.prefix}:idem:{self.idempotency_bucket(record)}:tokens"

    def stats(self, bucket: int) -> str:
        """Hash: ``<minute>|<tool>|<counter>`` -> count, for one bucket of the calls that ended.

        ``minute`` is epoch seconds // 60; ``bucket`` is the call id's
        (:func:`bucket_of`), each its own hash tag, so the fleet's counting is
        spread over :attr:`buckets` keys (and shards) instead of one hot hash,
        and a reader adds the buckets up. Counters: ``calls``, ``ok``,
        ``failed|<error type>``, ``attempts``, ``retries``, ``retried|<error
        type>``; field ``pruned`` is the last minute that pruned the hash.

        One hash per bucket, not one per minute: a key per minute stayed until
        its TTL, so the key count grew by :attr:`buckets` a minute for the
        first hour of every deployment and never looked flat. The first write
        of each minute deletes the fields of minutes ``toolexec status`` can no
        longer show (``lua/stats_count.lua``), which bounds each hash to an hour
        of minutes x tools x counters. TTL: :data:`STATS_TTL_S`, set by every
        write: an hour after the fleet's last call there is nothing left to show.
        """
        return f"{self.prefix}:stats:{{stats:{bucket}}}"

    def stats_done(self, bucket: int) -> str:
        """Sorted set: ids of the attempt ends counted in one bucket -> until when to remember them.

        Same reason, TTL and pruning as :meth:`breaker_done`; same hash tag as
        the bucket's :meth:`stats` hashes, so one script checks and counts.
        """
        return f"{self.prefix}:stats:done:{{stats:{bucket}}}"

    def in_flight(self, bucket: int) -> str:
        """Sorted set: ``<tool>|<call id>|<attempt>`` -> when its lease ends (epoch s).

        One of :attr:`buckets` sets, by the call id's :func:`bucket_of`, each
        its own hash tag, so every attempt's start and end do not hit one key.

        A worker adds an attempt when it starts and removes it when it ends; a
        member whose lease passed belongs to a worker that died and is not
        counted. TTL: the longest lease (max timeout + a minute), refreshed by
        every start, so the set vanishes once no worker runs anything.
        """
        return f"{self.prefix}:inflight:{{inflight:{bucket}}}"

    def amqp_lanes(self, queue: str) -> str:
        """Set: the per-key RabbitMQ queues of ``queue`` (``TOOLEXEC_RABBITMQ_FAIRNESS``).

        Clients add a key's queues before sending to them, workers consume every
        member. No TTL: a member names a durable queue on the broker that may hold
        calls, and a worker that forgot it would leave them there; clients add
        their keys' queues again every :data:`AMQP_LANES_REFRESH_S`, so a set lost
        with a Redis restart is whole again within seconds.
        """
        return f"{self.prefix}:fair:amqp:{{{queue}}}"

    def amqp_inflight(self, key: str) -> str:
        """Sorted set: task ids of a capped fairness key's calls running on RabbitMQ workers.

        Scored by when each entry lapses (taken + the task's time limit and any
        eta wait): the end of the call removes it at once; one whose worker died
        is taken again by the redelivered message (same id, counted once) or
        lapses. TTL: the longest lease in it, renewed by every take, so the set
        vanishes once the key is idle (``toolexec.worker.amqp_caps``).
        """
        return f"{self.prefix}:fair:amqp-inflight:{{{key}}}"

    def run(self, run_id: str) -> str:
        """String: one agent run's guard state as JSON (counts, history, ladder, verdicts).

        Under a tenant, the tenant is part of the name: any client that knows a
        run id can read, forget or re-budget that run, unless tenants separate them.

        ``{run_id}`` is a hash tag, so later keys of the same run share its slot.
        TTL: :data:`RUN_IDLE_TTL_S` (or the run's wall-time budget, if longer),
        refreshed by every round: the guard must outlive the model's memory of
        the run across client restarts, but not a run nobody continues.
        """
        if self.tenant:  # a run id alone no longer finds another tenant's run
            return f"{self.prefix}:run:{{{self.tenant}/{run_id}}}"
        return f"{self.prefix}:run:{{{run_id}}}"

    def last_good(self, tool: str, digest: str) -> str:
        """String: JSON of the last successful result of one call (``toolexec.fallback.cache``).

        ``digest`` is :func:`toolexec.normalize.arguments_hash` of the tool and
        its validated arguments. TTL: the tool's ``LastGood(ttl_s=...)`` (a day
        by default), set by every success: an answer older than that is no
        longer worth giving, even as a degraded one.
        """
        return f"{self.prefix}:lastgood:{tool}:{digest}"

    def payload(self, key: str) -> str:
        """String: one stored payload (a large result or argument), or its ``.index``.

        TTL: the payload's own (``TOOLEXEC_PAYLOAD_TTL_S`` for results, at least
        the call's time left for arguments): a reference outlives its message,
        and nobody deletes a payload explicitly.
        """
        return f"{self.prefix}:payload:{key}"

    def payload_secret(self) -> str:
        """String: the key of the HMAC that signs argument markers (``toolexec.payloads.signing``).

        No TTL: every client and worker of the deployment must sign and check
        with the same secret for as long as it runs; created once, with SET NX,
        unless ``TOOLEXEC_PAYLOAD_SECRET`` gives one.
        """
        return f"{self.prefix}:secret:payloads"

    def budget(self, name: str) -> str:
        """Hash: one retry budget (``toolexec.layers.retry_budget``): calls per bucket, or tokens.

        TTL: twice the window of a ratio budget, refreshed by every call (older
        buckets no longer count); :data:`BUDGET_IDLE_TTL_S` for a token bucket,
        which then starts full again.
        """
        return f"{self.prefix}:budget:{{{name}}}"

    def budget_retries(self, name: str) -> str:
        """Sorted set: a ratio budget's retries of the last window, scored by time (epoch s).

        Same hash tag and TTL as :meth:`budget`; members older than the window
        are removed by every script that reads it.
        """
        return f"{self.prefix}:budget:{{{name}}}:retries"

    def budget_done(self, name: str) -> str:
        """Sorted set: ids of the outcomes this budget counted -> until when to remember them.

        Same reason, TTL and pruning as :meth:`breaker_done`; same hash tag as
        :meth:`budget`.
        """
        return f"{self.prefix}:budget:{{{name}}}:done"

    def rate_limit(self, name: str) -> str:
        """String: a shared rate limit's theoretical arrival time (GCRA, epoch s).

        TTL: until that time plus a second: past it the limit is idle, and an
        absent key means the same as a time in the past.
        """
        return f"{self.prefix}:ratelimit:{{{name}}}"

    def faults(self) -> str:
        """Hash: tool name -> JSON fault-injection config set by ``toolexec faults set``.

        No TTL: a fault stays until ``toolexec faults clear``; workers ignore it
        unless started with ``TOOLEXEC_FAULTS_ENABLED=true``.
        """
        return f"{self.prefix}:faults"

    def fault_sequence(self, tool: str) -> str:
        """String: how many attempts of ``tool`` the fault config has drawn for.

        The n-th attempt's fate is a function of (seed, n) alone, so a seed
        replays the same sequence across workers. Deleted when the config is
        set or cleared; TTL :data:`FAULT_SEQUENCE_TTL_S`, refreshed per attempt.
        """
        return f"{self.prefix}:faults:{{{tool}}}:n"

    def oauth_tokens(self, ident: str) -> str:
        """String: one remote MCP server's OAuth tokens, Fernet-sealed (``toolexec.mcp.tokens``).

        ``ident`` is the server's name and a digest of its URL and client id.
        TTL: :data:`OAUTH_REFRESH_TTL_S` while it holds a refresh token, else its
        access token's lifetime and a minute: past that it can only be thrown away.
        """
        return f"{self.prefix}:mcp:oauth:{{{ident}}}:tokens"

    def oauth_client(self, ident: str) -> str:
        """String: the client a remote MCP server registered for the fleet, Fernet-sealed.

        TTL: :data:`OAUTH_CLIENT_TTL_S`, rewritten by every registration; a client
        forgotten is registered again at the next sign-in.
        """
        return f"{self.prefix}:mcp:oauth:{{{ident}}}:client"

    def oauth_refresh_lock(self, ident: str) -> str:
        """String: which process refreshes the tokens of :meth:`oauth_tokens` now.

        TTL: :data:`OAUTH_LOCK_TTL_S`, so a holder that died lets go; deleted
        by its holder once the new tokens are stored.
        """
        return f"{self.prefix}:mcp:oauth:{{{ident}}}:refreshing"


@dataclass(frozen=True)
class BrokerKeys:
    """Keys toolexec keeps beside kombu's own in a Redis *broker* (``toolexec.transport.orphans``).

    They live where kombu's ``unacked`` hash lives, which may be another Redis
    than toolexec's state (``TOOLEXEC_BROKER_URL``), because a dead consumer's
    messages are restored from that hash. kombu's ``global_keyprefix``, when
    set, is added by its client. ``consumer`` is one consumer process's id.
    """

    prefix: str = "toolexec"

    def consumers(self) -> str:
        """Set: the ids of consumer processes that took messages from this broker.

        No TTL: a member goes when a watcher has restored its messages
        (:meth:`held`); one per worker process ever started, until then.
        """
        return f"{self.prefix}:consumers"

    def alive(self, consumer: str) -> str:
        """String: present while ``consumer`` beats. TTL :data:`CONSUMER_ALIVE_TTL_S`.

        Its expiry is the death certificate, kept by Redis's own clock so that
        skew between hosts cannot declare a live worker dead.
        """
        return f"{self.prefix}:consumer:{consumer}:alive"

    def held(self, consumer: str) -> str:
        """Set: delivery tags ``consumer`` took and has not acknowledged.

        Written in the same round trip as kombu's own unacked record. TTL: the
        broker's visibility timeout plus a minute, refreshed by every beat:
        past that kombu itself has restored whatever a dead consumer held.
        """
        return f"{self.prefix}:consumer:{consumer}:held"

    def inbox(self, consumer: str, queue: str) -> str:
        """List: the message ``consumer`` is taking from ``queue`` (``toolexec.transport.inbox``).

        A message moves here with ``BLMOVE`` and leaves in the MULTI/EXEC that
        records it as unacknowledged, so it is almost always empty (and so
        absent). No TTL: what it holds are calls, which must not expire; the
        orphan watch moves a dead consumer's inbox back to its queue.
        """
        return f"{self.prefix}:consumer:{consumer}:inbox:{queue}"

    def inboxes(self, consumer: str) -> str:
        """Set: the queues ``consumer`` has an inbox for, so a watcher finds them without SCAN.

        Written once per queue, before the consumer's first ``BLMOVE`` from it. No
        TTL, like the inboxes: a watcher deletes it with the dead consumer's keys.
        """
        return f"{self.prefix}:consumer:{consumer}:inboxes"

    def reaping(self, consumer: str) -> str:
        """String: which watcher is restoring a dead ``consumer``'s messages.

        TTL :data:`REAP_LOCK_S`: a watcher that dies mid-way lets another one
        finish the work (restoring a message twice is harmless: kombu's restore
        finds it gone).
        """
        return f"{self.prefix}:consumer:{consumer}:reaping"

    # -- fairness lanes (toolexec.transport.lanes) -------------------------------------------
    # A queue's lanes live on the broker, beside the queue, because one script moves a
    # message from the queue into a lane and from a lane into a consumer's inbox. Every
    # key of one queue shares the hash tag ``{queue}``; a broker is one Redis (kombu has
    # no Redis Cluster transport), so the per-key keys the script derives are fine.

    def lane_prefix(self, queue: str) -> str:
        """Prefix of the lists ``<prefix><priority>:<fairness key>`` of ``queue``'s lanes.

        A lane holds the calls of one (priority, key) waiting in ``queue``, oldest
        at the right. No TTL: they are calls (like the queue itself); an empty list
        is deleted by Redis.
        """
        return f"{self.prefix}:fair:{{{queue}}}:lane:"

    def lane(self, queue: str, priority: int, key: str) -> str:
        """List: one lane of ``queue`` (see :meth:`lane_prefix`)."""
        return f"{self.lane_prefix(queue)}{priority}:{key}"

    def ready(self, queue: str, priority: int) -> str:
        """Sorted set: the fairness keys with calls waiting at ``priority``, by virtual time.

        The lowest score goes next; taking a call adds 1/weight to its key's
        score. No TTL: a member leaves when its lane is empty, so the set is
        absent when nothing waits.
        """
        return f"{self.prefix}:fair:{{{queue}}}:ready:{priority}"

    def vclock(self, queue: str) -> str:
        """Hash: priority -> the virtual time of the last call taken at it.

        A key whose lane fills again starts there, not at its old score, so a key
        that was idle cannot bank a share. No TTL: five small fields per queue.
        """
        return f"{self.prefix}:fair:{{{queue}}}:vclock"

    def parked(self, queue: str) -> str:
        """Sorted set: ``<priority>|<key>`` lanes of ``queue`` at their key's ``max_in_flight``.

        Scored by virtual time; a lane goes back to :meth:`ready` once a call of
        its key ends. No TTL: a member leaves when it is taken back.
        """
        return f"{self.prefix}:fair:{{{queue}}}:parked"

    def fair_weights(self) -> str:
        """Hash: fairness key -> weight (``toolexec fairness set``); absent means 1.

        No TTL: it is an operator's configuration, removed by ``fairness clear``.
        """
        return f"{self.prefix}:fair:weights"

    def fair_caps(self) -> str:
        """Hash: fairness key -> ``max_in_flight`` across the fleet; absent means no cap.

        No TTL: configuration, as :meth:`fair_weights`.
        """
        return f"{self.prefix}:fair:caps"

    def fair_inflight_prefix(self) -> str:
        """Prefix of the sorted sets ``<prefix><key>`` (``<prefix>tool:<name>`` for a tool):
        delivery tags of a capped key's (or tool's) calls in flight.

        Scored by when the entry lapses (taken + the visibility timeout): the
        acknowledgement removes a tag at once; a tag whose worker died comes back
        with its message (the same tag, so counted once) or lapses. Each set's
        TTL is that lease too, refreshed by every take.
        """
        return f"{self.prefix}:fair:inflight:"


#: How often a client adds its fairness keys' RabbitMQ queues to :meth:`Keys.amqp_lanes`
#: again, and reads their weights again (a weight set takes effect within this).
AMQP_LANES_REFRESH_S = 5.0

#: A consumer that has not beaten for this long is dead: five missed beats of one
#: second, so a host busy for a few seconds is not declared dead.
CONSUMER_ALIVE_TTL_S = 5.0

#: How long a watcher may take to restore one dead consumer's messages.
REAP_LOCK_S = 30.0

#: A token-bucket retry budget nobody touched for an hour starts full again:
#: whatever failed then says nothing about the service now.
BUDGET_IDLE_TTL_S = 3_600

#: A fault sequence idle for a day is forgotten (its config stays).
FAULT_SEQUENCE_TTL_S = 86_400

#: Dead letters are evidence for an operator, kept a week after the last refusal.
DEADLETTER_TTL_S = 7 * 86_400

#: At most this many dead letters are kept: a flood of poison must not fill Redis.
DEADLETTER_MAX = 1_000

#: A worker silent this long is forgotten by ``toolexec status`` and the heartbeats:
#: an hour, long enough for an operator to notice one that died.
WORKER_FORGET_S = 3_600

#: A reply nobody collects within this long after its deadline is garbage.
REPLY_TTL_S = 300

#: Seconds an approval decision is kept: a day, beyond any call's deadline.
APPROVAL_DECISION_TTL_S = 86_400

#: A breaker nobody used for a day has a stale window: forget it. Bounds the
#: keys of per-host breakers (``http_request@<host>``) for hosts seen once.
BREAKER_IDLE_TTL_S = 86_400

#: A run nobody advanced for a day is over: its guard state goes. An aborted run
#: stays refused that long, so a client that restarts cannot resume it by accident.
RUN_IDLE_TTL_S = 86_400

#: A held write's id (``Keys.breaker_done`` and its kin) is remembered this long past
#: its call's deadline. The worker sends a held write again only before the deadline;
#: the margin covers the skew between the clock that set the deadline and the one the
#: script reads (Redis TIME, or a worker's own for the stats), well above what
#: NTP-synchronised hosts drift.
WRITE_ID_MARGIN_S = 60

#: ``toolexec status --minutes`` looks back at most an hour; a minute's counters
#: live a little longer so that the oldest minute shown is complete.
STATS_TTL_S = 3_720

#: An OAuth record with a refresh token is kept 30 days from its last write: refresh
#: tokens commonly last weeks, and a fleet idle for a month signs in again.
OAUTH_REFRESH_TTL_S = 30 * 86_400

#: A registered OAuth client is kept as long as the tokens it got.
OAUTH_CLIENT_TTL_S = OAUTH_REFRESH_TTL_S

#: A token refresh is one request to the authorization server, given the SDK's
#: 30 s: a holder that died lets the others refresh after that.
OAUTH_LOCK_TTL_S = 30

"""State on Redis that clients and workers share.

The catalog, workers' liveness, per-tool stats, the reply lists, the fleet's
fairness settings, the success-side tally, and what a store does while its
Redis is away (``failopen``). Keys and their TTLs are in ``toolexec.keys``,
scripts in ``toolexec.lua``.
"""

__all__: list[str] = []

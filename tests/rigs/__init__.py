"""Rigs the tests and the benchmarks drive a real deployment with; not shipped.

``chaos`` kills servers and workers under calls in flight (tests/chaos,
bench/chaos.py), ``capacity`` is the capacity model of docs/scaling.md, and
``localcluster`` a Redis Cluster of local servers. Users test their own tools with
``toolexec.testing``, which stays in the package.
"""

__all__: list[str] = []

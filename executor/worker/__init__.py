"""Celery's side of a worker: the app, the consumer and the log format.

Everything here imports Celery; the Celery-free core imports none of it (the
``core`` contract in pyproject.toml). The client's one edge is ``app``, which
it builds to send with (docs/architecture.md, Boundaries).
"""

__all__: list[str] = []

"""What operators run, installed with the ``ops`` extra (click, rich, flower,
prometheus-client).

``cli`` is the ``toolexec`` command (worker, call, tools, demo, embedded, mcp, and the
commands below), ``cli_support`` how each of them reports an unreachable server,
``worker_check`` the worker's start-up check of Redis and the broker, ``pool_default``
the pool and slots a worker runs when none was configured; ``status``, ``health``
(the workers' liveness probe), ``faults_cli``, ``mcp_cli`` and ``services_cli``
(Flower, the embedded Valkey in the foreground) are its operator commands, ``metrics``
and ``telemetry`` the worker's Prometheus endpoint and log set-up, ``demo`` the
scripted tour. Nothing here is needed to declare or call tools, and nothing is
re-exported, so importing one module does not import the others.
"""

__all__: list[str] = []

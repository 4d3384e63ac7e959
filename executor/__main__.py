"""``python -m toolexec`` and the ``toolexec`` console script.

The command line (worker, demo, status, breakers, faults, flower) needs the
``ops`` extra; a thin client install has the console script too, so it says
what to install instead of failing with a traceback.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["OPS_MODULES", "main", "missing_ops"]

#: What the ``ops`` extra installs that the command line imports.
OPS_MODULES = ("click", "rich", "flower", "prometheus_client")


def missing_ops() -> list[str]:
    """The modules of the ``ops`` extra this environment cannot import."""
    return [name for name in OPS_MODULES if importlib.util.find_spec(name) is None]


def main() -> None:
    missing = missing_ops()
    if missing:
        sys.stderr.write(
            f"toolexec: the command line needs the 'ops' extra ({', '.join(missing)} "
            "missing here). Install it with:  pip install 'toolexec[ops]'\n"
            "A process that only calls tools needs nothing more: "
            "from toolexec import ToolClient.\n"
        )
        raise SystemExit(1)
    from toolexec.ops.cli import main as run

    run()


if __name__ == "__main__":
    main()

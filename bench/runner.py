"""What running a sync tool body under the time limit costs: a thread per call vs reused.

``toolexec.pipeline.runner.Runner`` used to start a thread for every sync body; it now
hands the body to an idle body thread (or starts one). Both run the same no-op
body with the same limit, from 1 caller thread and from 8 (a threads worker's
slots), in interleaved rounds; the figure is CPU µs of this process per call
(``time.process_time``, all threads) and wall µs per call.

Usage: ``python bench/runner.py [--calls N] [--rounds N]``
"""

from __future__ import annotations

import argparse
import contextvars
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from _common import command_line, interleave, markdown_table, median

from toolexec.pipeline.runner import Runner

LIMIT_S = 60.0


def thread_per_call(func: Callable[..., Any], kwargs: dict[str, Any], limit: float) -> Any:
    """The old way, kept here as the baseline: a new thread per body, abandoned on time-out."""
    done = threading.Event()
    box: list[Any] = []
    context = contextvars.copy_context()  # the attempt's context vars, as the runner keeps

    def target() -> None:
        box.append(context.run(func, **kwargs))
        done.set()

    threading.Thread(target=target, daemon=True).start()
    if not done.wait(limit):
        raise TimeoutError
    return box[0]


def _noop() -> None:
    return None


def measure(run: Callable[..., Any], calls: int, callers: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per call of ``calls`` bodies run from ``callers`` threads."""
    share = calls // callers

    def caller() -> None:
        for _ in range(share):
            run(_noop, {}, LIMIT_S)

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    cpu, wall = time.process_time(), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = share * callers
    return 1e6 * (time.process_time() - cpu) / total, 1e6 * (time.perf_counter() - wall) / total


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    reused = Runner()
    rows = []
    for callers in (1, 8):
        runs = interleave(
            args.rounds,
            {
                "thread per call": lambda c=callers: measure(thread_per_call, args.calls, c),
                "reused": lambda c=callers: measure(reused.run, args.calls, c),
            },
        )
        old_cpu = median([r[0] for r in runs["thread per call"]])
        new_cpu = median([r[0] for r in runs["reused"]])
        old_wall = median([r[1] for r in runs["thread per call"]])
        new_wall = median([r[1] for r in runs["reused"]])
        rows.append(
            [
                str(callers),
                f"{old_cpu:.0f} / {new_cpu:.0f}",
                f"{new_cpu / old_cpu:.2f}x",
                f"{old_wall:.0f} / {new_wall:.0f}",
                f"{new_wall / old_wall:.2f}x",
            ]
        )
    headers = [
        "caller threads",
        "CPU µs per call: thread per call / reused",
        "ratio",
        "wall µs per call",
        "ratio",
    ]
    print(markdown_table(headers, rows))
    print(f"\n{args.rounds} rounds of {args.calls} no-op bodies, interleaved, medians")
    print(f"\ncommand: `{command_line()}`")


if __name__ == "__main__":
    main()

"""Which pools a second Ctrl-C stops at once, and the one line it prints."""

from __future__ import annotations

from celery.concurrency import get_implementation

from toolexec.tasks.interrupt import kills_jobs, stop_line


def test_only_prefork_keeps_celerys_cold_shutdown() -> None:
    assert kills_jobs(get_implementation("prefork"))
    assert not kills_jobs(get_implementation("threads"))
    assert not kills_jobs(get_implementation("solo"))


def test_the_line_says_what_happens_to_the_calls() -> None:
    line = stop_line("SIGINT", 3, 2, 5.0)
    assert "\n" not in line and line.startswith("toolexec worker: second Ctrl-C")
    assert "3 call(s) in flight" in line and "2 message(s) back" in line
    assert "about 5 s" in line and "'unknown'" in line
    assert stop_line("SIGQUIT", 0, 0, 2.0).startswith("toolexec worker: SIGQUIT")

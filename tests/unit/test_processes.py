"""How many worker processes ``toolexec worker`` runs, and how they are named (pure)."""

from __future__ import annotations

from toolexec.ops.processes import child_argv, plan_processes, process_label, process_name


def test_one_process_per_core_by_default_and_as_given_otherwise() -> None:
    assert plan_processes(4, None, configured=False).processes == 4
    assert "one per core" in plan_processes(4, None, configured=False).reason
    assert plan_processes(1, None, configured=False).processes == 1
    assert plan_processes(4, 3, configured=True).processes == 3
    # a pool or slots given explicitly are taken as given: one process, as before
    assert plan_processes(4, None, configured=True).processes == 1


def test_each_process_is_named_after_the_worker_and_labelled_among_its_siblings() -> None:
    names = [process_name("toolexec-7@host", i) for i in (1, 2)]
    assert names == ["toolexec-7.p1@host", "toolexec-7.p2@host"]
    assert [process_label(n, [*names, "other@host"]) for n in names] == ["1/2", "2/2"]
    assert process_label("other@host", names) is None
    assert process_name("w-%h", 3) == "w-%h.p3"


def test_a_process_runs_the_same_worker_as_one_process_under_its_own_name() -> None:
    argv = child_argv(["-P", "threads", "-c", "8"], "toolexec-7@%h", 2)
    assert argv[-6:] == ["-c", "8", "--processes", "1", "--hostname", "toolexec-7.p2@%h"]

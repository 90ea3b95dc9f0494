"""tasks.wakeup: which waiting claims a wake-up wakes."""

from __future__ import annotations

from contextlib import ExitStack

from tasks.wakeup import SPARE_WAKEUPS, Waiters


def test_notify__n_tasks_wake_the_n_plus_spare_longest_waiting_claims() -> None:
    """Issue 11: a fleet of 1,000 idle workers was woken whole for each task, a burst of
    1,000 claims per task; now about one claim per task (and a spare or two)."""
    waiters = Waiters()
    with ExitStack() as stack:
        events = [stack.enter_context(waiters.interest(["q"])) for _ in range(10)]
        waiters.notify(["q:1"])
        assert [e.is_set() for e in events] == [True] * (1 + SPARE_WAKEUPS) + [False] * (
            9 - SPARE_WAKEUPS
        )
        waiters.notify(["q:2"])  # the next ones: those already awake are not counted
        assert sum(e.is_set() for e in events) == 2 * (1 + SPARE_WAKEUPS) + 1
        waiters.notify(["q"])  # a bare queue id wakes every waiting claim
        assert all(e.is_set() for e in events)


def test_notify__other_queues_and_several_at_once() -> None:
    waiters = Waiters()
    with waiters.interest(["a"]) as a, waiters.interest(["b"]) as b:
        with waiters.interest(["c"]) as c:
            waiters.notify(["a:1", "b"])
            assert (a.is_set(), b.is_set(), c.is_set()) == (True, True, False)
    waiters.notify(["a:5", "c:1"])  # nobody waits any more: nothing to do, no error

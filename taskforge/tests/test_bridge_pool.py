"""The bridge's thread pool (taskforge.api.bridge._Pool): who runs a job, and when."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from taskforge.api.bridge import _Pool

pytestmark = pytest.mark.timeout(30)


def _in_loop(main: Callable[[asyncio.AbstractEventLoop], Any]) -> Any:
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.close()


def test_pool__a_job_goes_to_the_thread_that_finished_last() -> None:
    """Four threads started by four jobs at once; then one job at a time: each runs on
    the thread that finished last (warm), not on each idle thread in turn."""
    pool = _Pool(8)
    all_busy = threading.Barrier(4)

    def together() -> int:
        all_busy.wait(10)
        return threading.get_ident()

    async def main(loop: asyncio.AbstractEventLoop) -> tuple[set[int], list[int]]:
        started = await asyncio.gather(
            *[
                pool.run(loop, lambda: (all_busy.wait(10), threading.get_ident())[1])
                for _ in range(4)
            ]
        )
        one_by_one = [await pool.run(loop, threading.get_ident) for _ in range(12)]
        return set(started), one_by_one

    started, one_by_one = _in_loop(main)
    pool.shutdown()
    assert len(started) == 4
    assert len(set(one_by_one)) == 1 and one_by_one[0] in started


def test_pool__with_every_thread_busy_jobs_wait_for_one_in_order() -> None:
    pool = _Pool(2)
    release = threading.Event()
    ran: list[int] = []

    def job(n: int) -> int:
        if n < 2:
            release.wait(10)
        ran.append(n)
        return n * 10

    async def main(loop: asyncio.AbstractEventLoop) -> list[int]:
        futures = [pool.run(loop, job, n) for n in range(6)]
        await asyncio.sleep(0.2)
        assert ran == []  # both threads hold a blocked job; the rest wait
        release.set()
        return list(await asyncio.gather(*futures))

    assert _in_loop(main) == [0, 10, 20, 30, 40, 50]
    assert (sorted(ran[:2]) == [0, 1] and ran[2:] == [2, 3, 4, 5]) or sorted(ran) == list(range(6))
    assert pool._threads == 2
    pool.shutdown()


def test_pool__an_exception_reaches_the_caller_and_the_thread_serves_on() -> None:
    pool = _Pool(1)

    def fail() -> None:
        raise ValueError("boom")

    async def main(loop: asyncio.AbstractEventLoop) -> int:
        with pytest.raises(ValueError, match="boom"):
            await pool.run(loop, fail)
        return int(await pool.run(loop, lambda: 7))

    assert _in_loop(main) == 7
    pool.shutdown()


def test_pool__shutdown_ends_the_threads_once_queued_jobs_have_run() -> None:
    pool = _Pool(2)
    gate = threading.Event()
    done: list[int] = []

    def job(n: int) -> threading.Thread:
        gate.wait(10)
        done.append(n)
        return threading.current_thread()

    async def main(loop: asyncio.AbstractEventLoop) -> list[threading.Thread]:
        futures = [pool.run(loop, job, n) for n in range(5)]
        await asyncio.sleep(0.1)
        pool.shutdown()  # three jobs still queued
        gate.set()
        return list(await asyncio.gather(*futures))

    threads = set(_in_loop(main))
    assert sorted(done) == [0, 1, 2, 3, 4]
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in threads)

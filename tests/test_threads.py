"""Worker jobs: ``await job`` is woken by the worker as it ends (no polling), lets the event loop run
meanwhile, hands back the result or the error, and survives a cancelled await."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from nvkit.threads import run_in_worker


def _no_sleeping(monkeypatch):
    """``await job`` must not poll: any asyncio.sleep inside it fails the test."""
    real = asyncio.sleep

    async def refuse(delay, *a, **k):
        if threading.current_thread() is threading.main_thread() and getattr(refuse, "armed", False):
            raise AssertionError(f"await job polled with asyncio.sleep({delay})")
        return await real(delay, *a, **k)
    monkeypatch.setattr(asyncio, "sleep", refuse)
    return refuse


def test_await_is_woken_by_the_worker_and_the_loop_runs_meanwhile(monkeypatch):
    guard = _no_sleeping(monkeypatch)
    go = threading.Event()
    job = run_in_worker(lambda j: (go.wait(10), 42)[1])
    ticks = []

    async def other_work():  # what a widget message handler would be: it runs while the cell awaits
        loop = asyncio.get_running_loop()
        for i in range(3):
            ticks.append(i)
            await loop.run_in_executor(None, lambda: None)
        go.set()

    async def main():
        guard.armed = True
        t = asyncio.ensure_future(other_work())
        value = await job
        guard.armed = False
        await t
        return value

    assert asyncio.run(main()) == 42
    assert ticks == [0, 1, 2]


def test_await_hands_back_the_workers_error():
    job = run_in_worker(lambda j: 1 / 0)

    async def main():
        return await job
    with pytest.raises(ZeroDivisionError):
        asyncio.run(main())


def test_await_on_a_finished_job_returns_at_once():
    job = run_in_worker(lambda j: "done")
    job.wait_done(10)
    assert asyncio.run(job.wait()) == "done"


def test_a_cancelled_await_leaves_the_job_and_a_later_await_working():
    go = threading.Event()
    job = run_in_worker(lambda j: (go.wait(10), "later")[1])

    async def cancel_then_wait():
        task = asyncio.ensure_future(job.wait())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        go.set()  # the worker ends after the first await gave up: its wake-up must not break anything
        return await job

    assert asyncio.run(cancel_then_wait()) == "later"


def test_a_job_ending_after_its_loop_closed_is_harmless():
    go = threading.Event()
    job = run_in_worker(lambda j: (go.wait(10), 1)[1])

    async def give_up():
        try:
            await asyncio.wait_for(job.wait(), 0.01)
        except asyncio.TimeoutError:
            pass
    asyncio.run(give_up())  # the loop is closed now; the job's wake-up for it must not raise
    go.set()
    assert job.wait_done(10) and job.error is None and job.result() == 1


def test_the_waits_return_after_the_done_callbacks():
    """A script that waits on a panel's job then reads the panel must find what the panel's done
    callback wrote: ``result``, ``wait_done`` and ``await`` return once the callbacks have run."""
    for how in ("result", "wait_done", "await"):
        go = threading.Event()
        job = run_in_worker(lambda j: (go.wait(10), "answer")[1])
        shown = []

        def slow_callback(j, shown=shown):
            time.sleep(0.3)  # a panel redrawing its table
            shown.append(j.result())  # a callback may read the result: no waiting on itself
        job.add_done_callback(slow_callback)
        go.set()
        if how == "result":
            assert job.result(timeout=10) == "answer"
        elif how == "wait_done":
            assert job.wait_done(10)
        else:
            assert asyncio.run(job.wait()) == "answer"
        assert shown == ["answer"] and job.settled and job.done, how
        later = []
        job.add_done_callback(later.append)  # after the end: called at once, here
        assert later == [job]


def test_a_worker_runs_its_jobs_in_order_on_one_thread_until_closed():
    from nvkit.threads import Job, Worker
    w = Worker("nvkit-test-worker")
    go = threading.Event()
    seen = []

    def record(i):
        def fn(job):
            if i == 0:
                go.wait(10)  # the later jobs queue behind this one
            seen.append((i, threading.current_thread()))
            if i == 1:
                raise ValueError("the second job fails")
            return i
        return fn

    jobs = [Job(record(i), worker=w).start() for i in range(3)]
    assert not any(j.done for j in jobs) and w.alive
    go.set()
    assert jobs[0].result(10) == 0 and jobs[2].result(10) == 2
    with pytest.raises(ValueError, match="second job"):
        jobs[1].result(10)  # its error is its own; the job after it still ran
    assert [i for i, _ in seen] == [0, 1, 2]
    first = seen[0][1]
    assert all(t is first for _, t in seen) and first.name == "nvkit-test-worker" and first is not threading.main_thread()
    # from a done callback on the worker thread, result() of that job does not wait for itself
    inner = []
    j = Job(lambda job: "x", worker=w)
    j.add_done_callback(lambda jj: inner.append(jj.result(1)))
    assert j.start().result(10) == "x" and inner == ["x"]
    w.close()
    first.join(10)
    assert not first.is_alive() and not w.alive  # closed: the thread ended after what was queued
    again = Job(lambda job: threading.current_thread(), worker=w).start().result(10)
    assert again is not first and again.is_alive()  # a job after close starts a new thread
    w.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_job_whose_thread_dies_before_it_runs_is_settled_with_an_error_and_the_worker_goes_on():
    """A hook on new threads (a debugger's, a profiler's) that raises kills the worker's thread
    before the job begins: the wait ends with an NvkitError instead of hanging, the job's done
    callbacks run (a caller's state put back), and the worker's next job runs on a new thread."""
    from nvkit.errors import NvkitError
    from nvkit.threads import Job, Worker
    w = Worker("nvkit-test-worker")
    seen = []

    def broken_hook(*_):
        raise RuntimeError("a profiler's hook failed")
    threading.setprofile(broken_hook)
    try:
        job = Job(lambda j: 1, worker=w)
        job.add_done_callback(lambda j: seen.append(j.error))
        job.start()
    finally:
        threading.setprofile(None)
    with pytest.raises(NvkitError, match="ended before it ran this work"):
        job.result(timeout=10)
    assert job.done and job.settled and len(seen) == 1 and isinstance(seen[0], NvkitError)
    with pytest.raises(NvkitError):
        job.result(timeout=1)  # the same answer again, at once
    assert Job(lambda j: 2, worker=w).start().result(timeout=10) == 2
    w.close()

"""The child-process timeout that bounds reward checks from any thread."""

import operator
import os
import threading
import time

import pytest

from creditflow.errors import WorkerError
from creditflow.rewards._timeout import TimeoutWorker


@pytest.fixture(scope="module")
def worker():
    worker = TimeoutWorker()
    yield worker
    worker.close()


def test_returns_the_value(worker):
    assert worker.call(operator.add, 2, 3, timeout_s=30) == 5
    assert worker.call(str.upper, "\udcff\x00a", timeout_s=30) == "\udcff\x00A"


def test_start_starts_the_child_once(worker):
    worker.start()
    pid = worker.call(os.getpid, timeout_s=30)
    worker.start()  # running: nothing to do
    assert worker.call(os.getpid, timeout_s=30) == pid != os.getpid()


def test_exception_in_the_child_becomes_worker_error_and_the_worker_survives(worker):
    with pytest.raises(WorkerError, match="ValueError"):
        worker.call(int, "not a number", timeout_s=30)
    pid = worker.call(os.getpid, timeout_s=30)
    assert pid == worker.call(os.getpid, timeout_s=30) != os.getpid()


def test_timeout_kills_the_child_and_the_next_call_gets_a_new_one(worker):
    before = worker.call(os.getpid, timeout_s=30)
    start = time.perf_counter()
    with pytest.raises(TimeoutError):
        worker.call(time.sleep, 60, timeout_s=0.3)
    assert 0.3 <= time.perf_counter() - start < 5.0
    after = worker.call(os.getpid, timeout_s=30)
    assert after != before


def test_a_crashed_child_is_replaced(worker):
    before = worker.call(os.getpid, timeout_s=30)
    with pytest.raises(WorkerError, match="died"):
        worker.call(os._exit, 3, timeout_s=30)
    assert worker.call(os.getpid, timeout_s=30) != before


def test_works_from_another_thread(worker):
    results = {}

    def in_thread():
        try:
            worker.call(time.sleep, 60, timeout_s=0.2)
        except TimeoutError:
            results["timed_out"] = True
        results["sum"] = worker.call(operator.add, 1, 1, timeout_s=30)

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join(timeout=60)
    assert results == {"timed_out": True, "sum": 2}


def test_close_then_call_restarts(worker):
    worker.close()
    worker.close()  # idempotent
    assert worker.call(operator.mul, 6, 7, timeout_s=30) == 42

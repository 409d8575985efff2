"""Run a function in a child process under a wall-clock timeout that works from any thread.

Why a process: math_verify bounds its own work with ``signal.alarm``, which exists only in
the main thread of the main interpreter (elsewhere ``parse`` raises ValueError) and would
clobber any other SIGALRM user. A Python thread cannot be interrupted either. So the
rewards turn math_verify's timeout off and call it in one long-lived child process: the
parent waits on a socket with a deadline and kills the child when the deadline passes.
The killed child takes whatever state the runaway call left with it; the next call starts
a fresh one. A call costs one socket round trip (tens of microseconds), not a process start.

Why not ``multiprocessing.Process``: "spawn" re-runs the caller's ``__main__`` in the child,
so a training script without an ``if __name__ == "__main__"`` guard would recurse; "fork"
of a multi-threaded parent (torch, tokenizers) can deadlock on a lock another thread held.
A plain ``python -c`` subprocess has neither problem; it speaks multiprocessing's pickled
``Connection`` protocol over a socket pair.
"""

import atexit
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from creditflow.errors import WorkerError

logger = logging.getLogger(__name__)

# The child imports the package (and, in warm_up, sympy and antlr) before it answers; on
# a loaded machine that takes seconds. It is not charged to any call's timeout.
STARTUP_TIMEOUT_S = 120.0

# The child's bootstrap: adopt the parent's sys.path (so it imports the same creditflow,
# installed or not), then serve. Only the standard library is needed to get that far.
_BOOTSTRAP = (
    "import sys\n"
    "from multiprocessing.connection import Connection\n"
    "conn = Connection(int(sys.argv[1]))\n"
    "sys.path[:] = conn.recv()\n"
    "from creditflow.rewards._timeout import serve\n"
    "serve(conn)\n"
)


def serve(conn: Connection) -> None:
    """The child's loop: run the warm-up it is sent, then answer ``(fn, args)`` requests.

    Every request gets ``(True, fn(*args))`` or ``(False, "ErrorType: message")``; ``None``
    or a closed socket ends the loop.
    """
    warm_up = conn.recv()
    if warm_up is not None:
        warm_up()
    conn.send("ready")
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the parent is gone
            return
        if request is None:
            return
        fn, args = request
        try:
            reply = (True, fn(*args))
        except Exception as err:  # report and keep serving: one bad input must not cost a restart
            reply = (False, f"{type(err).__name__}: {err}")
        conn.send(reply)


class TimeoutWorker:
    """A lazily started child process that runs ``fn(*args)`` calls, each under a timeout.

    Calls are serialised by a lock, so one worker can be shared by threads. ``fn`` must be
    picklable by reference (a module-level function), so a monkeypatch in the parent does
    not reach the child.

    Args:
        warm_up: picklable; run once in each new child before it takes requests, e.g. to
            import heavy libraries so the first call's timeout measures only the call.
    """

    def __init__(self, warm_up: Callable[[], None] | None = None) -> None:
        self._warm_up = warm_up
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._conn: Connection | None = None
        # A fork (e.g. a DataLoader worker) inherits this object, but the child process
        # and socket belong to the parent: the forked copy must start its own.
        os.register_at_fork(after_in_child=self._forget)
        atexit.register(self.close)

    def call(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        """``fn(*args)`` evaluated in the child, waiting at most ``timeout_s`` seconds for it.

        Raises:
            TimeoutError: no reply within ``timeout_s``; the child has been killed.
            WorkerError: ``fn`` raised in the child, or the child died.
        """
        with self._lock:
            conn = self._ensure_started()
            try:
                conn.send((fn, args))
                answered = conn.poll(timeout_s)
                # poll() also wakes up when the child dies; recv() then raises EOFError.
                ok, value = conn.recv() if answered else (None, None)
            except (OSError, EOFError) as err:
                self._stop(kill=True)
                raise WorkerError(f"worker process died during the call: {err!r}") from err
            if not answered:
                self._stop(kill=True)
                raise TimeoutError(f"{fn.__qualname__} took longer than {timeout_s} s")
        if not ok:
            raise WorkerError(value)
        return value

    def start(self) -> None:
        """Start the child now unless it is running, so that no later call waits for it.

        Raises:
            WorkerError: it did not start within ``STARTUP_TIMEOUT_S``.
        """
        with self._lock:
            self._ensure_started()

    def close(self) -> None:
        """Stop the child (if any); a later :meth:`call` starts a new one."""
        with self._lock:
            self._stop(kill=False)

    def _ensure_started(self) -> Connection:
        if self._conn is not None and self._process.poll() is None:
            return self._conn
        self._stop(kill=True)
        parent_sock, child_sock = socket.socketpair()
        process = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, str(child_sock.fileno())],
            pass_fds=[child_sock.fileno()],
            stdin=subprocess.DEVNULL,
        )
        child_sock.close()
        conn = Connection(parent_sock.detach())
        self._process, self._conn = process, conn
        try:
            conn.send(list(sys.path))
            conn.send(self._warm_up)
            ready = conn.poll(STARTUP_TIMEOUT_S) and conn.recv() == "ready"
        except (OSError, EOFError):
            ready = False
        if not ready:
            self._stop(kill=True)
            raise WorkerError(f"worker process did not start within {STARTUP_TIMEOUT_S} s")
        logger.debug("started reward worker pid=%s", process.pid)
        return conn

    def _stop(self, kill: bool) -> None:
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if process is None:
            return
        if not kill:
            try:
                conn.send(None)
                process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                kill = True
        if kill:
            process.kill()
            process.wait()
        conn.close()

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._process = self._conn = None

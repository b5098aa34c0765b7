"""The worker-process side of pack's process engine (`engines.ProcessEngine`): what runs in a
spawned worker (its initializer, which ties it to the driver's life and leaves Ctrl-C to the
driver; the units of work it runs on the source it was given once), and the spawn context whose
workers start with SIGINT blocked, with `_sigint_deferred` around the pool's submits — so a
Ctrl-C never lands half-way through starting a worker. The driver side (the pool, progress,
naming a dead worker) is engines.py's.
"""
from __future__ import annotations

import contextlib
import multiprocessing.context as mpc
import os
import signal
import threading

from .task import fill_shard, load_chunk

_worker: dict = {}  # in a worker process: its source, progress queue, stop event


def _die_with(parent: int) -> None:
    """Make this worker die when the driver does (Linux: PR_SET_PDEATHSIG), even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the driver still stops its workers on its signals
        pass
    if os.getppid() != parent:  # the driver died before the line above
        os._exit(1)


def _process_init(source, progress, stop, parent):
    # Ctrl-C reaches the whole process group: the driver handles it (stops the workers, one
    # line, exit 130), so a worker ignores it instead of printing its own KeyboardInterrupt.
    # Started with SIGINT blocked (_WorkerProcess), it drops one that came meanwhile here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _die_with(parent)
    _worker.update(source=source, progress=progress, stop=stop)


def _process_load(chunk, options):
    return load_chunk(_worker["source"], chunk, options)


def _process_fill(task, options, partial):
    q, pending = _worker["progress"], [0]

    def tick(n):  # progress to the driver in steps, not per record
        pending[0] += n
        if pending[0] >= 16:
            q.put(pending[0])
            pending[0] = 0

    try:
        return fill_shard(task, _worker["source"], options, partial, progress=tick, stop=_worker["stop"])
    finally:
        if pending[0]:
            q.put(pending[0])


@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT blocked in this thread for the block. A process started in it inherits the mask:
    a Ctrl-C that lands while a worker starts stays pending there until its initializer
    ignores it, instead of raising KeyboardInterrupt in its imports."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@contextlib.contextmanager
def _sigint_deferred():
    """In the main thread, Ctrl-C's KeyboardInterrupt raised only when the block ends (and
    SIGINT blocked meanwhile, see `_sigint_blocked`): around the pool's `submit`, which may
    start a worker — interrupted half-way, the pool would not know a worker it started, and
    its shutdown would wait for it."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        with _sigint_blocked():  # (None: a handler set outside Python, which could not be put back)
            yield
        return
    got = []
    handler = signal.signal(signal.SIGINT, lambda signum, frame: got.append(frame))
    try:
        with _sigint_blocked():
            yield
    finally:
        signal.signal(signal.SIGINT, handler)
        if got and callable(handler):
            handler(signal.SIGINT, got[0])
        elif got and handler == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


class _WorkerProcess(mpc.SpawnProcess):
    """A spawned worker started with SIGINT blocked (`_sigint_blocked`)."""

    def start(self):
        with _sigint_blocked():
            super().start()


class _WorkerContext(mpc.SpawnContext):
    Process = _WorkerProcess

"""The Ray engine of `recordtool pack`: one Ray task per shard on an existing cluster.

The driver (pack) plans; here each `ShardTask` becomes a Ray task running `pack.fill_shard` —
the same function the local engine runs on threads — which writes its part file and its
finished-shard record into OUT/.partial on storage every node sees. A task whose worker dies
is retried by Ray (`MAX_RETRIES`); a bad image is a line in its result, never a failed task;
under on_error="raise" the first bad image stops the whole job with the file named. Tasks tell
a small actor how far they are, so the driver shows one progress bar for the whole cluster and
counts the tasks that were started again.

Ray is an optional dependency: `pip install 'recordtool[ray]'`.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time

from .errors import PackError

MAX_RETRIES = 3  # a shard task whose worker dies is run again this many times
TICK = 0.5  # seconds between progress reports of a task, and polls of the driver


def require():
    """Import Ray, or say how to install it."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise PackError("--engine ray needs Ray: pip install 'recordtool[ray]' (or pip install ray)") from None


@contextlib.contextmanager
def connected(address: str | None, cpus: int | None):
    """Connect to (or start) a cluster for the duration, unless this process already is
    connected (then that connection is used and left open).

    Args:
        address: None (RAY_ADDRESS if set, else "local"), "auto", "ray://HOST:PORT",
            "HOST:PORT", or "local" (a new instance on this machine).
        cpus: CPUs of a new local instance (default: all).
    """
    import ray

    if ray.is_initialized():
        yield
        return
    kw = {"logging_level": logging.WARNING, "log_to_driver": True}
    if address is None and not os.environ.get("RAY_ADDRESS"):
        address = "local"
    if address == "local":  # a fresh instance on this machine, with the CPUs asked for
        kw.update(num_cpus=cpus, include_dashboard=False)
    ray.init(address=address, **kw)
    try:
        yield
    finally:
        ray.shutdown()


def _progress_actor():
    import ray

    @ray.remote(num_cpus=0)
    class Progress:
        """Records done per shard (a retried shard starts again from 0) and attempts per shard."""

        def __init__(self):
            self.done, self.starts = {}, {}

        def start(self, k):
            self.starts[k] = self.starts.get(k, 0) + 1
            self.done[k] = 0

        def add(self, k, n):
            self.done[k] = self.done.get(k, 0) + n

        def poll(self):
            return sum(self.done.values()), sum(s - 1 for s in self.starts.values())

    return Progress.remote()


def _fill(source, task, options, partial, progress):
    """The Ray task: `fill_shard` with progress sent to the actor every TICK seconds."""
    from .pack import fill_shard

    progress.start.remote(task.number)
    state = {"n": 0, "t": time.monotonic()}

    def tick(n):
        state["n"] += n
        now = time.monotonic()
        if now - state["t"] >= TICK:
            progress.add.remote(task.number, state["n"])
            state["n"], state["t"] = 0, now

    try:
        done = fill_shard(task, source, options, partial, progress=tick)
    finally:
        source.close()
    if state["n"]:
        progress.add.remote(task.number, state["n"])
    return done


def run(tasks: list, source, options, partial: str, bar=None) -> tuple:
    """Fill `tasks`' shards as Ray tasks on the cluster this process is connected to (see
    `connected`); returns (their `ShardDone`s, number of retried tasks).

    Args:
        tasks: the `ShardTask`s still to do.
        source: the `Source` their items load from (shipped once, without its item list).
        options: the tasks' `Options`.
        partial: OUT/.partial, as every node can reach it (absolute path or URL).
        bar: a tqdm bar updated with the records done across the cluster.
    """
    import ray
    from ray.exceptions import RayTaskError

    remote = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(_fill)
    progress = _progress_actor()
    from .pack import light_source

    src = ray.put(light_source(source))
    window = max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
    queue = list(reversed(tasks))
    pending, results = {}, []
    shown = retried = 0

    def submit():
        while queue and len(pending) < window:
            t = queue.pop()
            pending[remote.remote(src, t, options, partial, progress)] = t

    def poll():
        nonlocal shown, retried
        done, retried = ray.get(progress.poll.remote())
        if bar is not None and done > shown:
            bar.update(done - shown)
            shown = done

    submit()
    lost = None
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=TICK)
            for ref in ready:
                task = pending.pop(ref)
                try:
                    results.append(ray.get(ref))
                except RayTaskError as e:  # the task raised: on_error="raise", or a bug — stop now
                    cause = getattr(e, "cause", None)
                    if isinstance(cause, Exception):
                        raise cause from None
                    raise PackError(f"{task.name}: shard task failed: {e}") from None
                except ray.exceptions.RayError as e:  # its worker died MAX_RETRIES + 1 times
                    first = str(e).splitlines()[0] if str(e) else ""
                    lost = lost or PackError(
                        f"{task.name}: shard task lost after {MAX_RETRIES} retries ({type(e).__name__}: {first}); "
                        "the shards finished so far are kept: run the same command again to resume")
                    queue.clear()  # submit nothing more, let the shards in flight finish for the re-run
            submit()
            poll()
        poll()
    except BaseException:
        for ref in pending:  # stop the rest of the job now
            ray.cancel(ref, force=True)
        raise
    finally:
        try:
            ray.kill(progress)
        except Exception:  # the connection is gone: so is the actor
            pass
    if lost is not None:
        raise lost
    if bar is not None:  # the last reports may not have reached the actor before its last poll
        bar.update(max(0, sum(len(t.items) for t in tasks) - shown))
    return results, retried

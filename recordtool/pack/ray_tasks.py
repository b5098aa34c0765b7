"""The Ray side of pack's Ray engine (`engines.RayEngine`): connecting to a cluster, the
remote functions, and their retries.

Planned packs (`shards=`) run one Ray task per shard (`task.fill_shard`, the same function
the other engines run), writing its part file and finished-shard record into OUT/.partial on
storage every node sees. By-size packs run Ray tasks over chunks of items (`task.load_chunk`),
whose fixed records come back to the driver, which writes the part files as the other
engines do — the same bytes.

Retries are the driver's, not Ray's (the remote functions have max_retries=0): a task whose
worker died (killed, out of memory, node lost) is submitted again by the driver, up to
MAX_RETRIES times, and counted there — so `Summary.retried` is exact however fast a worker
dies and however the progress reports fall. A task that raises (a bad image under
on_error="raise", a bug) is never retried: the job stops with its error.

Ray is an optional dependency: `pip install 'recordtool[ray]'`.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time

from ..errors import PackError, WorkerLost
from .task import fill_shard, light_source, load_chunk

MAX_RETRIES = 3  # a task whose worker dies is run again this many times
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


def cluster_cpus() -> int:
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _progress_actor():
    import ray

    @ray.remote(num_cpus=0)
    class Progress:
        """Records done per shard, counting only its latest attempt (a retried shard starts
        again from 0; a late report of a dead attempt is ignored)."""

        def __init__(self):
            self.done, self.attempt = {}, {}

        def add(self, k, attempt, n):
            if attempt > self.attempt.get(k, -1):
                self.attempt[k], self.done[k] = attempt, 0
            if attempt == self.attempt[k]:
                self.done[k] += n

        def poll(self):
            return sum(self.done.values())

    return Progress.remote()


def _fill(source, task, options, partial, progress, attempt):
    """The Ray task of a planned shard: `fill_shard`, progress sent every TICK seconds."""
    progress.add.remote(task.number, attempt, 0)
    state = {"n": 0, "t": time.monotonic()}

    def tick(n):
        state["n"] += n
        now = time.monotonic()
        if now - state["t"] >= TICK:
            progress.add.remote(task.number, attempt, state["n"])
            state["n"], state["t"] = 0, now

    try:
        done = fill_shard(task, source, options, partial, progress=tick)
    finally:
        source.close()
    if state["n"]:
        progress.add.remote(task.number, attempt, state["n"])
    return done


def _load(source, chunk, options):
    """The Ray task of a by-size pack: a chunk of items loaded and fixed."""
    try:
        return load_chunk(source, chunk, options)
    finally:
        source.close()


def _raised(e, what: str):
    """The error to stop the job with when a task raised (RayTaskError): its own cause."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, Exception):
        return cause
    return PackError(f"{what}: task failed: {e}")


def _lost(what: str, e, resumes: bool) -> WorkerLost:
    first = str(e).splitlines()[0] if str(e) else ""
    again = ("the shards finished so far are kept: run the same command again to resume" if resumes else
             "nothing was published: run the same command again (a pack without --shards starts over)")
    return WorkerLost(f"{what} lost after {MAX_RETRIES} retries, its Ray worker died each time "
                      f"({type(e).__name__}: {first}); {again}")


class Cluster:
    """The driver's side of the Ray engine while connected: the source shipped once, and the
    tasks it submits, run again when their worker dies (`retried` counts those)."""

    def __init__(self, source, options):
        import ray

        self.options = options
        self.src = ray.put(light_source(source))
        self.window = 2 * cluster_cpus()
        self.retried = 0
        self._load = ray.remote(num_cpus=1, max_retries=0)(_load)
        self._fill = ray.remote(num_cpus=1, max_retries=0)(_fill)
        self._chunks = set()  # by-size chunks not collected yet

    def load(self, chunk: list) -> "_Chunk":
        """A by-size chunk's (results, notes), to be collected with `.result()`."""
        c = _Chunk(self, chunk)
        self._chunks.add(c)
        return c

    def cancel(self) -> None:
        """Stop the chunks still in flight (the pack failed or was interrupted)."""
        import ray

        for c in self._chunks:
            with contextlib.suppress(Exception):
                ray.cancel(c.ref, force=True)
        self._chunks.clear()

    def fill(self, tasks: list, partial: str, bar=None) -> list:
        """Fill `tasks`' shards as Ray tasks; their `ShardDone`s (see module doc for retries).

        Args:
            tasks: the `ShardTask`s still to do.
            partial: OUT/.partial, as every node can reach it (absolute path or URL).
            bar: a tqdm bar updated with the records done across the cluster.
        """
        import ray
        from ray.exceptions import RayError, RayTaskError

        progress = _progress_actor()
        queue = list(reversed(tasks))
        pending, attempts, results = {}, {}, []
        shown = 0
        lost = None

        def submit(task):
            attempt = attempts.get(task.number, 0)
            pending[self._fill.remote(self.src, task, self.options, partial, progress, attempt)] = task

        def poll():
            nonlocal shown
            done = ray.get(progress.poll.remote())
            if bar is not None and done > shown:
                bar.update(done - shown)
                shown = done

        try:
            while queue or pending:
                while queue and len(pending) < self.window:
                    submit(queue.pop())
                ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=TICK)
                for ref in ready:
                    task = pending.pop(ref)
                    try:
                        results.append(ray.get(ref))
                    except RayTaskError as e:  # the task raised: on_error="raise", or a bug — stop now
                        raise _raised(e, task.name) from None
                    except RayError as e:  # its worker died
                        if attempts.get(task.number, 0) < MAX_RETRIES and lost is None:
                            attempts[task.number] = attempts.get(task.number, 0) + 1
                            self.retried += 1
                            submit(task)
                        else:
                            lost = lost or _lost(f"{task.name}: shard task", e, resumes=True)
                            queue.clear()  # submit nothing more, let the shards in flight finish for the re-run
                poll()
        except BaseException:
            for ref in pending:  # stop the rest of the job now
                ray.cancel(ref, force=True)
            raise
        finally:
            with contextlib.suppress(Exception):  # the connection is gone: so is the actor
                ray.kill(progress)
        if lost is not None:
            raise lost
        if bar is not None:  # the last reports may not have reached the actor before its last poll
            bar.update(max(0, sum(len(t.items) for t in tasks) - shown))
        return results


class _Chunk:
    """A by-size chunk in flight on the cluster; `result()` waits for it, submitting it again
    (counted) when its worker died."""

    def __init__(self, cluster: Cluster, chunk: list):
        self.cluster, self.chunk, self.attempt = cluster, chunk, 0
        self.ref = cluster._load.remote(cluster.src, chunk, cluster.options)

    def result(self) -> tuple:
        import ray
        from ray.exceptions import RayError, RayTaskError

        while True:
            try:
                out = ray.get(self.ref)
                self.cluster._chunks.discard(self)
                return out
            except RayTaskError as e:
                raise _raised(e, "a chunk of items") from None
            except RayError as e:
                if self.attempt >= MAX_RETRIES:
                    raise _lost("a chunk task", e, resumes=False) from None
                self.attempt += 1
                self.cluster.retried += 1
                self.ref = self.cluster._load.remote(self.cluster.src, self.chunk, self.cluster.options)

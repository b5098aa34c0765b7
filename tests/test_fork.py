"""A process forked while a Loader runs (a fork DataLoader worker, multiprocessing with 'fork')
gets no lock a producer thread held: the producers import nothing after they start, and every
lock they take is made anew in the child (recordtool.util.ForkLock). A dataset on object
storage forked while it is read: the child gets its locks, download queue and client anew,
and never takes or ends its parent's locks in the shard cache (a real S3 server on 127.0.0.1,
tests/s3server.py)."""
import fcntl
import multiprocessing as mp
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import recordtool
from conftest import jpeg_bytes, write
from recordtool.pack import pack

# the children run the recordtool this test imports (the installed wheel under scripts/test.sh,
# the tree in a developer's run): its parent folder first on their path, the folder they start
# in outside the tree (python -c puts it first)
HOME = os.path.dirname(os.path.dirname(os.path.abspath(recordtool.__file__)))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([HOME] + [p for p in os.environ.get("PYTHONPATH", "").split(
    os.pathsep) if p]))


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("fork")
    for i in range(12):
        write(str(root / "src" / f"c{i % 2}" / f"{i}.jpg"), jpeg_bytes(48, 40, seed=i))
    pack(str(root / "src"), str(root / "ds"), shards=2, progress=False)
    return str(root / "ds")


# a fresh process (nothing imported but recordtool): its first Loader starts, and the fork
# comes right after, while the producers make their first batches
_FORK_RIGHT_AFTER = textwrap.dedent("""
    import multiprocessing as mp
    import sys

    def child(root, q):
        import numpy as np
        np.random.default_rng(1).random(3)
        import recordtool
        ld = recordtool.Loader(root, batch_size=2, size=16, as_torch=False, threads=1, user_op=op)
        x, y = next(iter(ld))
        ld.close()
        q.put(len(y))

    if __name__ == "__main__":
        import recordtool
        from recordtool.ops import Cutout, ReferenceOp
        op = ReferenceOp(Cutout(4)) if sys.argv[2] == "batch" else Cutout(4)
        ld = recordtool.Loader(sys.argv[1], batch_size=2, size=16, as_torch=False, threads=1, user_op=op)
        it = iter(ld)
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(sys.argv[1], q))
        p.start()
        p.join(60)
        if p.is_alive():
            p.kill()
            print("child hung")
        else:
            print(f"child exit {p.exitcode}, batch of {q.get(timeout=5) if p.exitcode == 0 else None}")
        next(it)
        ld.close()
""")


@pytest.mark.parametrize("op", ["batch", "compiled"])
def test_fork_right_after_the_first_loader_starts(packed, op):
    """Forked right after a fresh process's first Loader starts, a child that uses numpy.random
    and its own Loader finishes (a hang is a child still alive after 60 s); several fresh
    processes, since the fork lands at a different moment of the producers' work each time."""
    if op == "compiled":
        pytest.importorskip("numba")
    for attempt in range(5 if op == "batch" else 3):
        p = subprocess.run([sys.executable, "-c", _FORK_RIGHT_AFTER, packed, op], capture_output=True, text=True,
                           timeout=300, cwd=os.path.dirname(packed), env=ENV)
        assert p.returncode == 0 and "child exit 0, batch of 2" in p.stdout, (attempt, p.stdout, p.stderr[-3000:])


_IMPORTS_WHILE_RUNNING = textwrap.dedent("""
    import sys
    import threading
    import recordtool
    from recordtool.ops import ColorJitter, Cutout, RandomGrayscale, ReferenceOp

    class Attempts:  # first on sys.meta_path: asked for every import not yet done, failed ones too
        names = []

        def find_spec(self, name, path=None, target=None):
            if threading.current_thread().name == "recordtool-loader":
                Attempts.names.append(name)
            return None

    sys.meta_path.insert(0, Attempts())
    ops = [None, ReferenceOp(Cutout(4)), ReferenceOp(RandomGrayscale(0.5))] + ([ColorJitter()] if sys.argv[2] == "compiled" else [])
    for op in ops:
        for train in (True, False):
            ld = recordtool.Loader(sys.argv[1], batch_size=3, size=16, as_torch=False, threads=2, train=train,
                                   user_op=op)
            before = set(sys.modules)
            for epoch in range(3):
                for _ in ld:
                    pass
            ld.close()
            print(sorted(set(sys.modules) - before), sorted(set(Attempts.names)))
            Attempts.names.clear()
""")


def test_producers_import_nothing_once_started(packed):
    """What the producers need is imported before they start, and they never try an import: a
    module imported on a producer thread holds the import system's lock for it while it loads —
    a failed import (`import cupy` where CuPy is absent) takes it each time it is tried — and a
    fork then leaves the child that lock."""
    numba = __import__("importlib").util.find_spec("numba") is not None
    p = subprocess.run([sys.executable, "-c", _IMPORTS_WHILE_RUNNING, packed, "compiled" if numba else "plain"],
                       capture_output=True, text=True, timeout=300, cwd=os.path.dirname(packed), env=ENV)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.splitlines() == ["[] []"] * (8 if numba else 6), p.stdout


def _child_takes(locks, q):
    q.put([lock.acquire(timeout=5) for lock in locks])


def test_locks_producers_take_are_unlocked_in_a_forked_child(packed):
    """Each lock a producer thread may hold — the compiled-op cache's, the CUDA kernel cache's,
    the op registry's, the decode pools', a dataset's shard-mapping lock — held at the fork is
    free in the child."""
    import recordtool
    from recordtool.decode import cpu
    from recordtool.ops import compile as op_compile
    from recordtool.ops import cuda, registry

    ds = recordtool.open(packed)
    locks = [op_compile._lock, cuda._lock, registry._lock, cpu._pool_lock, ds.shard_files.lock]
    for lock in locks:
        lock.acquire()
    try:
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=_child_takes, args=(locks, q))
        p.start()
        got = q.get(timeout=60)
        p.join(30)
    finally:
        for lock in locks:
            lock.release()
        ds.close()
    assert got == [True] * len(locks) and p.exitcode == 0


# ------------------------------------------------------------------ a dataset on object storage

@pytest.fixture(scope="module")
def s3_dataset(packed):
    """(URL, storage options) of the packed dataset on a real S3 server on 127.0.0.1."""
    pytest.importorskip("moto")
    s3fs = pytest.importorskip("s3fs")
    from s3server import S3

    server = S3()
    fs = s3fs.S3FileSystem(**server.options)
    fs.mkdir("forked")
    for name in sorted(os.listdir(packed)):
        fs.put_file(os.path.join(packed, name), f"forked/ds/{name}")
    yield "s3://forked/ds", server.options
    server.stop()


def _records(ds) -> list:
    return [(bytes(ds[i][0]), ds[i][1]) for i in range(len(ds))]


def _child_reads(ds, q):
    q.put(_records(ds))


def _holding_the_cache_lock(ds):
    """A thread inside the cache's lock until the returned event is set; (thread, event)."""
    inside, leave = threading.Event(), threading.Event()

    def hold():
        with ds.cache._locked():
            inside.set()
            leave.wait(120)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert inside.wait(60)
    return t, leave


def test_a_child_forked_while_a_remote_dataset_is_read_reads_it(packed, s3_dataset, tmp_path):
    """Forked while another thread is inside the shard cache's lock and this one holds the
    dataset's locks (its mapping, shard-pinning and plan locks, its download queue's), a child
    reads the whole dataset — its mapped shard as inherited, the other downloaded through a
    client of its own — and finishes (a hang: no records from it within 60 s)."""
    url, options = s3_dataset
    want = _records(recordtool.open(packed))
    ds = recordtool.open(url, cache_dir=str(tmp_path / "cache"), storage_options=options)
    assert bytes(ds[0][0]) == want[0][0]  # one shard mapped, the client used
    t, leave = _holding_the_cache_lock(ds)
    files = ds.shard_files
    locks = [files.lock, files.plan_lock] + list(files.mapping_locks) + [files.queue.mutex]
    for lock in locks:
        lock.acquire()
    try:
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=_child_reads, args=(ds, q))
        p.start()
    finally:
        for lock in locks:
            lock.release()
        leave.set()
        t.join()
    try:
        got = q.get(timeout=60)
    except queue.Empty:
        got = None
    p.join(30)
    if p.is_alive():  # (a child stuck on a lock: not left for the interpreter's exit to wait on)
        p.kill()
    assert got == want and p.exitcode == 0
    ds.close()


def _child_counts(ds, q):
    q.put(ds.cache.used())  # takes the cache's lock


def _waited_for(inode: int) -> bool:
    """Whether /proc/locks lists a process waiting for an flock on `inode` (the test's own
    cache's lock file: only its child can; pids are not compared, /proc may show another
    pid namespace's)."""
    with open("/proc/locks") as f:
        for line in f:
            t = line.split()
            if len(t) >= 7 and t[1] == "->" and t[2] == "FLOCK" and t[6].rsplit(":", 1)[-1] == str(inode):
                return True
    return False


def _locked_elsewhere(path: str) -> bool:
    """Whether an flock on `path` is held now (a file of its own cannot take it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="sees who waits for a lock through /proc/locks")
def test_a_forked_child_waits_for_its_parents_cache_lock_and_never_ends_it(s3_dataset, tmp_path):
    """The child of a process inside the cache's lock waits for it as any other process does,
    and never ends the parent's hold: an flock belongs to the open file, which a forked child
    shares with its parent unless it opens its own — it would enter at once, and its unlock
    would end the parent's hold, letting a third process in."""
    url, options = s3_dataset
    ds = recordtool.open(url, cache_dir=str(tmp_path / "cache"), storage_options=options)
    lock_file = os.path.join(ds.cache.dir, ".lock")
    t, leave = _holding_the_cache_lock(ds)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_counts, args=(ds, q))
    p.start()
    try:
        try:
            end = time.monotonic() + 60  # (how long a child stuck elsewhere gets to show up as waiting)
            waiting = entered = False
            while not (waiting or entered) and time.monotonic() < end:
                waiting = _waited_for(os.stat(lock_file).st_ino)
                entered = not p.is_alive()
                time.sleep(0.01)
            still_held = _locked_elsewhere(lock_file)
        finally:
            leave.set()
            t.join()
        assert waiting and not entered and still_held, (waiting, entered, still_held)
        assert q.get(timeout=60) == ds.cache.used()
        p.join(30)
        assert p.exitcode == 0
    finally:
        if p.is_alive():  # (a child stuck on a lock: not left for the interpreter's exit to wait on)
            p.kill()
    ds.close()


def _child_waits(conn):
    conn.recv()


def test_shards_a_forked_child_inherited_are_let_go_of_by_its_parent(s3_dataset, tmp_path):
    """A child forked while shards are mapped inherits their fds and mappings (it may read
    them); when the parent closes the dataset their pins end all the same (an explicit
    unlock), so the cache may evict them while the child lives."""
    url, options = s3_dataset
    ds = recordtool.open(url, cache_dir=str(tmp_path / "cache"), storage_options=options)
    _records(ds)  # every shard mapped and pinned
    other = recordtool.open(url, cache_dir=str(tmp_path / "cache"), storage_options=options)
    assert other.cache.pinned() == sum(s["bytes"] for s in ds.shards)
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe()
    p = ctx.Process(target=_child_waits, args=(there,))
    p.start()
    try:
        ds.close()
        assert other.cache.pinned() == 0
    finally:
        here.send("go")
        p.join(30)
    assert p.exitcode == 0
    other.close()

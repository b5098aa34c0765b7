"""A process forked while a Loader runs (a fork DataLoader worker, multiprocessing with 'fork')
gets no lock a producer thread held: the producers import nothing after they start, and every
lock they take is made anew in the child (recordtool.util.ForkLock)."""
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap

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
    locks = [op_compile._lock, cuda._lock, registry._lock, cpu._pool_lock, ds._lock]
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

"""Loader: rank cover, resume equivalence, errors surface, clean shutdown, user ops."""
import threading
import time
import traceback

import numpy as np
import pytest

import recordtool
from conftest import jpeg_bytes, write
from recordtool.loader import BatchKeys, Loader
from recordtool.pack import pack
from recordtool.ops import Cutout, RandomGrayscale, ReferenceOp


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    src = root / "src"
    for i in range(48):
        write(str(src / f"c{i % 3}" / f"{i}.jpg"), jpeg_bytes(64 + 8 * (i % 4), 48 + 4 * (i % 5), seed=i))
    pack(str(src), str(root / "out"), shards=3, progress=False)
    return str(root / "out")


def collect(loader):
    return [(np.asarray(x).copy(), np.asarray(y).copy()) for x, y in loader]


@pytest.mark.parametrize("world", [1, 3, 4])
def test_ranks_cover_every_sample_once(packed, world):
    seen = []
    for rank in range(world):
        ld = Loader(packed, batch_size=4, size=32, rank=rank, world_size=world, seed=5, as_torch=False)
        ids = np.concatenate(ld.batch_ids(0))
        assert len(ld) == len(ld.batch_ids(0))
        seen.append(ids)
    assert len({len(s) for s in seen}) == 1  # equal share per rank
    allx = np.concatenate(seen)
    assert len(set(allx.tolist())) == len(allx) == 48  # 48 divides by 1, 3 and 4: exact cover


def test_batches_match_labels_and_shapes(packed):
    ld = Loader(packed, batch_size=8, size=40, train=True, layout="NHWC", as_torch=False)
    ds = recordtool.open(packed)
    for (x, y), ids in zip(ld, ld.batch_ids(0)):
        assert x.shape == (8, 40, 40, 3) and x.dtype == np.float32
        assert y.tolist() == ds.labels[ids].tolist()
    ev = Loader(packed, batch_size=8, size=32, train=False, as_torch=False)
    x, _ = next(iter(ev))
    assert x.shape == (8, 3, 32, 32)
    ev.close()


def test_resume_mid_epoch_equals_uninterrupted(packed):
    full = Loader(packed, batch_size=5, size=32, seed=9, drop_last=False, as_torch=False, threads=1)
    full.set_epoch(2)
    ref = collect(full)
    part = Loader(packed, batch_size=5, size=32, seed=9, drop_last=False, as_torch=False, threads=3, producers=3)
    part.set_epoch(2)
    it = iter(part)
    first = [next(it) for _ in range(4)]
    state = part.state_dict()
    del it
    part.close()
    resumed = Loader(packed, batch_size=5, size=32, seed=9, drop_last=False, as_torch=False)
    resumed.load_state_dict(state)
    rest = collect(resumed)
    got = [(np.asarray(x), np.asarray(y)) for x, y in first] + rest
    assert len(got) == len(ref) == len(full)
    for (a, b), (c, d) in zip(got, ref):
        assert np.array_equal(a, c) and np.array_equal(b, d)
    assert resumed.state_dict()["epoch"] == 3 and resumed.state_dict()["batch"] == 0


def test_exception_in_pipeline_surfaces_with_cause(packed):
    def bad_op(batch):
        raise ZeroDivisionError("user op exploded")

    ld = Loader(packed, batch_size=4, size=32, user_op=bad_op, as_torch=False)
    with pytest.raises(recordtool.errors.OpError, match="bad_op raised ZeroDivisionError: user op exploded") as e:
        collect(ld)
    cause = e.value.__cause__  # the op's own exception, with its traceback
    assert isinstance(cause, ZeroDivisionError)
    assert any(f.name == "bad_op" for f in traceback.extract_tb(cause.__traceback__))


def test_clean_shutdown_no_leaked_threads(packed):
    before = set(threading.enumerate())
    ld = Loader(packed, batch_size=2, size=32, prefetch=2, as_torch=False)
    it = iter(ld)
    next(it)
    time.sleep(0.2)  # producer blocked on a full queue
    del it
    ld.close()
    del ld
    assert not _new_producers(before)


def test_user_ops_applied_and_reproducible(packed):
    gray = ReferenceOp(RandomGrayscale(p=1.0))  # array code: no Numba needed
    ld = Loader(packed, batch_size=8, size=32, layout="NHWC", user_op=gray, as_torch=False, mean=(0, 0, 0),
                std=(1, 1, 1))
    x, _ = next(iter(ld))
    assert np.allclose(x[..., 0], x[..., 1]) and np.allclose(x[..., 1], x[..., 2])
    ld.close()
    cut = ReferenceOp(Cutout(size=16))
    a = np.full((4, 32, 32, 3), 200, np.uint8)
    keys = BatchKeys(np.array([7, 3, 11, 5]), 2, 9)
    out = cut(a.copy(), keys)
    assert ((out == 0).all(axis=-1).sum(axis=(1, 2)) > 0).all()  # a square per image
    assert np.array_equal(out, cut(a.copy(), keys))  # same ids, same epoch: same squares
    assert not np.array_equal(out, cut(a.copy(), BatchKeys(keys.ids, 3, 9)))  # another epoch: others
    # the CPU's per-image slices zero exactly the square the GPU's mask formula does (also at edges)
    u = cut.draws(4, [102, 103], keys)
    cy, cx = (u[:, 0] * 32).astype(int)[:, None, None], (u[:, 1] * 32).astype(int)[:, None, None]
    yy, xx = np.arange(32)[None, :, None], np.arange(32)[None, None, :]
    mask = (np.abs(yy - cy) <= 8) & (np.abs(xx - cx) <= 8)
    ref = a.copy()
    ref[mask] = 0
    assert np.array_equal(out, ref)
    from recordtool.ops.examples import _zero_boxes  # what a CuPy batch gets: one mask

    assert np.array_equal(_zero_boxes(np, a.copy(), cut.op.batch_params(4, keys, 32, 32).astype(np.int64)), ref)


def test_torch_tensors_when_torch_is_installed(packed):
    torch = pytest.importorskip("torch")
    ld = Loader(packed, batch_size=4, size=32, dtype="float16")
    x, y = next(iter(ld))
    ld.close()
    assert isinstance(x, torch.Tensor) and x.dtype == torch.float16 and tuple(x.shape) == (4, 3, 32, 32)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.int64


def test_rank_from_environment(packed, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    ld = Loader(packed, batch_size=4, size=32, as_torch=False)
    assert (ld.rank, ld.world_size) == (1, 4) and len(ld) == 3  # 48 / 4 ranks / 4 per batch


def test_a_world_size_without_a_rank_is_refused_when_the_share_is_needed(packed, monkeypatch):
    """Lightning's DDP processes before fit(): WORLD_SIZE=2, no RANK, no process group. The
    Loader may be made (the group will tell it its rank); taking a share before that is a
    ConfigError naming RANK, never rank 0."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    ld = Loader(packed, batch_size=4, size=32, as_torch=False, threads=1)
    for use in (len, lambda x: x.rank, lambda x: next(iter(x)), lambda x: x.state_dict(), lambda x: x.batch_ids(0)):
        with pytest.raises(recordtool.errors.ConfigError, match="WORLD_SIZE=2 but not RANK"):
            use(ld)
    monkeypatch.setenv("RANK", "1")  # the launcher told it now: the share follows
    assert (ld.rank, ld.world_size, len(ld)) == (1, 2, 6)
    assert [i for _, _ in ld for i in [0]] and ld.state_dict()["rank"] == 1
    monkeypatch.setenv("RANK", "0")  # from the first batch on the Loader keeps its place
    assert (ld.rank, ld.world_size) == (1, 2)


@pytest.mark.parametrize("env,kw,match", [
    ({"RANK": "1"}, {}, "RANK=1 but not WORLD_SIZE"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, {}, r"RANK=2 is not in \[0, WORLD_SIZE=2\)"),
    ({"RANK": "one", "WORLD_SIZE": "2"}, {}, "RANK='one' is not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, {}, "WORLD_SIZE='0' is not an integer ≥ 1"),
    ({"RANK": "1", "WORLD_SIZE": "4"}, {"rank": 2}, "rank=2 given without world_size.*rank 1 of 4"),
    ({"RANK": "1", "WORLD_SIZE": "4"}, {"world_size": 2}, "world_size=2 given without rank.*4 process"),
    ({}, {"rank": 1}, "rank=1 given without world_size.*single process"),
    ({}, {"rank": 2, "world_size": 2}, r"rank 2 not in \[0, world_size=2\)"),
])
def test_an_inconsistent_placement_is_refused_not_guessed(packed, monkeypatch, env, kw, match):
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(recordtool.errors.ConfigError, match=match):
        Loader(packed, batch_size=4, size=32, as_torch=False, threads=1, **kw)


def test_both_given_are_the_callers_split_whatever_the_environment(packed, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")  # half a launcher's environment: not read when both are given
    ld = Loader(packed, batch_size=4, size=32, as_torch=False, threads=1, rank=0, world_size=1)
    assert (ld.rank, ld.world_size, len(ld)) == (0, 1, 12)
    monkeypatch.setenv("RANK", "1")
    assert Loader(packed, batch_size=4, size=32, as_torch=False, threads=1, rank=1).world_size == 2


def _new_producers(before: set) -> list:
    """The producer threads started since `before` (other tests' Loaders may still hold theirs
    until they are collected), each given time to end: stopping joins them, so a live one was
    never told to stop."""
    mine = [t for t in threading.enumerate() if t.name == "recordtool-loader" and t not in before]
    for t in mine:
        t.join(30)
    return [t for t in mine if t.is_alive()]


def test_ctrl_c_in_training_loop_stops_the_pipeline(packed):
    before = set(threading.enumerate())
    ld = Loader(packed, batch_size=2, size=32, prefetch=1, producers=2, as_torch=False)
    with pytest.raises(KeyboardInterrupt):
        for k, _ in enumerate(ld):
            if k == 2:
                raise KeyboardInterrupt  # what Ctrl-C does in the training loop
    assert not _new_producers(before)
    assert len(collect(ld)) == len(ld)  # and the loader still works afterwards


def _damaged_copy(packed, tmp_path, record):
    """A copy of the packed set whose record's image bytes start with zeros (damage after packing)."""
    import shutil

    out = tmp_path / "damaged"
    shutil.copytree(packed, out)
    ds = recordtool.open(str(out))
    c = ds.index.columns
    shard = out / ds.shards[int(c["shard"][record])]["name"]
    off = int(c["jpeg_offset"][record])
    ds.close()
    with open(shard, "r+b") as f:
        f.seek(off)
        f.write(b"\0" * 16)
    return str(out), shard.name, off


def test_undecodable_record_names_shard_and_offset(packed, tmp_path):
    from recordtool.loader import RecordError

    path, shard, off = _damaged_copy(packed, tmp_path, 7)
    ld = Loader(path, batch_size=8, size=32, seed=1, as_torch=False)
    with pytest.raises(RecordError) as e:
        for _ in ld:
            pass
    assert "record 7 (" in str(e.value) and shard in str(e.value) and f"offset {off}" in str(e.value)
    assert threading.active_count() < 50  # the producer stopped
    # warn: the epoch completes, the sample is zeros, the label stays, the record is listed
    ld = Loader(path, batch_size=8, size=32, seed=1, as_torch=False, on_error="warn", train=False,
                mean=(0, 0, 0), std=(1, 1, 1))
    with pytest.warns(RuntimeWarning, match=f"record 7 .*offset {off}"):
        batches = list(ld.__iter__())
    ds = recordtool.open(path)
    for (x, y), ids in zip(batches, ld.batch_ids(0)):
        assert y.tolist() == ds.labels[ids].tolist()
        if 7 in ids.tolist():
            assert float(np.abs(x[ids.tolist().index(7)]).max()) == 0.0
    assert list(ld.bad_records) == [7]


@pytest.mark.parametrize("op", [ReferenceOp(Cutout(size=12)), ReferenceOp(RandomGrayscale(p=0.5))])
def test_keyed_user_ops_give_the_same_batches_for_any_producers(packed, op):
    """A batch is a pure function of (seed, epoch, ids): keyed user ops get their keys with the
    call, so producer threads running batches at once cannot swap them (the op is shared)."""
    def run(producers, threads):
        ld = Loader(packed, batch_size=4, size=32, seed=3, user_op=op, producers=producers, threads=threads,
                    prefetch=1, as_torch=False, layout="NHWC", mean=(0, 0, 0), std=(1, 1, 1))
        ld.set_epoch(1)
        return [x.copy() for x, _ in ld]

    ref = run(1, 1)
    assert len(ref) == 12
    for producers, threads in ((4, 2), (3, 1), (6, 3)):
        got = run(producers, threads)
        assert all(np.array_equal(a, b) for a, b in zip(ref, got)), (producers, threads)


_EXIT_SCRIPT = """
import gc, sys
from recordtool.loader import Loader
how, path, device = sys.argv[1:4]
ld = Loader(path, batch_size=4, size=32, device=device, as_torch=False, producers=3, prefetch=2)
it = iter(ld)
for _ in range(3):
    next(it)
if how == "exhausted":
    for _ in it:
        pass
elif how == "closed":
    it.close()
elif how == "loader-closed":
    ld.close()
elif how == "collected":
    del it
    gc.collect()
elif how == "break":
    for k, _ in enumerate(ld):
        if k == 1:
            break
# "abandoned": the iterator stays referenced by this module while the interpreter exits
print("end of script", flush=True)
"""


@pytest.mark.parametrize("how", ["abandoned", "exhausted", "closed", "loader-closed", "collected", "break"])
def test_script_leaving_a_loader_exits_cleanly(packed, tmp_path, how):
    """`for step, batch in enumerate(loader): if step == N: break` and friends, then the script
    ends: exit code 0, whatever state the producer threads are in (was SIGABRT, 134)."""
    import subprocess
    import sys

    script = tmp_path / "leave.py"
    script.write_text(_EXIT_SCRIPT)
    for _ in range(3):  # the old crash depended on timing: several runs each
        p = subprocess.run([sys.executable, str(script), how, packed, "cpu"], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0 and "end of script" in p.stdout, (p.returncode, p.stderr[-2000:])
        assert "terminate called" not in p.stderr


def test_closed_loaders_give_their_native_pools_back(packed):
    """A pool's threads live for the process: a new Loader reuses the pools a closed one held
    instead of starting more threads (tune builds dozens of Loaders)."""
    ld = Loader(packed, batch_size=4, size=32, producers=2, as_torch=False)
    pools = set(ld.backend._pools)
    assert len(pools) == 2 and 0 not in pools
    ld.close()
    ld.backend.close()
    again = Loader(packed, batch_size=4, size=32, producers=2, as_torch=False)
    assert set(again.backend._pools) == pools

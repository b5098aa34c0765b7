"""The producers' look-ahead lanes (decode.gpu.ahead) and the stream's announcements of each
producer's next batch: the CPU path's pixels bit for bit, bounded, never waited on for work
not started, and the batch announced is the batch the same producer makes next."""
import os
import threading

import numpy as np
import pytest

from conftest import jpeg_bytes, packed_folder
from recordtool.decode import cpu
from recordtool.decode.gpu.ahead import KEEP, AheadLane
from recordtool.loader import stream as st
from recordtool.loader import Loader

SIZE = (24, 32)


def images(n, seed=0):
    bufs = [jpeg_bytes(40 + 16 * (k % 3), 36 + 8 * (k % 4), seed=seed + k, mode="CMYK" if k % 2 else "RGB")
            for k in range(n)]
    rng = np.random.default_rng(seed)
    windows = np.array([[rng.integers(0, 8), rng.integers(0, 8), 20 + rng.integers(0, 8), 24 + rng.integers(0, 8)]
                        for _ in range(n)], np.float64)
    return bufs, windows


def settle(lane):
    """Wait until the lane's worker has done what it holds (take cancels what it has not started)."""
    for _, jobs in lane._pending:
        for f in jobs.values():
            if not f.cancelled():
                f.exception(timeout=60)


def batch_decode(bufs, windows, threads=2):
    """The batch's own CPU share (GPUDecoder._decode_cpu's call)."""
    out = np.empty((len(bufs), *SIZE, 3), np.uint8)
    cpu.decode_crop_resize(bufs, windows, size=SIZE, threads=threads, out=out, on_error="skip", fallback=True,
                           errors=[])
    return out


def test_lane_gives_the_batch_decodes_pixels_at_their_positions():
    bufs, windows = images(6)
    ids = np.array([7, 3, 9, 12, 5, 8])
    lane = AheadLane(SIZE)
    sel = np.array([0, 2, 3, 5])  # the batch's CPU-routed images
    lane.ahead(4, ids[sel], [bufs[k] for k in sel], windows[sel], pixels=[10, 400, 20, 30])
    settle(lane)
    got = lane.take(4, ids)
    want = batch_decode(bufs, windows)
    assert sorted(got) == sel.tolist()
    for k in sel:
        assert np.array_equal(got[k], want[k]), k
    assert lane.taken == 4 and lane.take(4, ids) == {}  # taken once
    lane.close()


def test_a_record_twice_in_a_batch_gets_its_image_at_both_positions():
    bufs, windows = images(2)
    ids = np.array([5, 6, 5])  # a padded rank share repeats a record: same epoch, same window
    lane = AheadLane(SIZE)
    lane.ahead(0, ids[[0]], [bufs[0]], windows[[0]], pixels=[1])
    settle(lane)
    got = lane.take(0, ids)
    assert sorted(got) == [0, 2] and np.array_equal(got[0], got[2])
    lane.close()


def test_a_file_the_lane_cannot_decode_is_left_to_the_batch():
    bufs, windows = images(2)
    lane = AheadLane(SIZE)
    lane.ahead(0, np.array([1, 2]), [b"\xff\xd8 not a jpeg", bufs[1]], windows, pixels=[1, 1])
    settle(lane)
    got = lane.take(0, np.array([1, 2]))
    assert sorted(got) == [1]  # the batch decodes record 1 itself and names its error
    lane.close()


def test_the_lane_holds_two_batches_and_drops_stale_ones():
    bufs, windows = images(4)
    lane = AheadLane(SIZE)
    for e in range(KEEP + 1):  # a third announcement drops the oldest batch
        lane.ahead(e, np.array([10 * e]), [bufs[e]], windows[[e]], pixels=[1])
    assert len(lane._pending) == KEEP
    settle(lane)
    assert lane.take(0, np.array([0])) == {}
    # a later batch taken first: the ones held before it are stale (a discarded stream's)
    assert sorted(lane.take(2, np.array([20, 99]))) == [0] and len(lane._pending) == 0
    # another epoch's batch with the same records is not this one
    lane.ahead(5, np.array([3]), [bufs[3]], windows[[3]], pixels=[1])
    assert lane.take(6, np.array([3])) == {} and len(lane._pending) == 1
    lane.close()


def test_take_does_not_wait_for_images_the_lane_has_not_started():
    bufs, windows = images(3)
    lane = AheadLane(SIZE)
    release = threading.Event()
    blocker = lane._pool.submit(release.wait, 30)  # the lane's one worker is busy
    lane.ahead(0, np.array([1, 2, 3]), bufs, windows, pixels=[1, 2, 3])
    assert lane.take(0, np.array([1, 2, 3])) == {}  # all cancelled: the batch decodes them
    release.set()
    assert blocker.result(timeout=30) is True
    lane.close()


def test_the_lane_decodes_at_the_cpu_shares_low_priority():
    """Work done ahead yields the cores to the training loop as the CPU share's pools do."""
    lane = AheadLane(SIZE)
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    worker = lane._pool.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result(30)
    assert worker == min(19, base + cpu.BACKGROUND_NICE) and cpu.BACKGROUND_NICE > 0
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # the caller's own is kept
    lane.close()


def test_an_image_the_lane_is_decoding_is_handed_over_without_waiting():
    lane = AheadLane(SIZE)
    started, release = threading.Event(), threading.Event()

    def decoding():  # what the lane's worker is on when the batch is made
        started.set()
        release.wait(30)
        return np.full((*SIZE, 3), 7, np.uint8)

    lane._pending.append((0, {5: lane._pool.submit(decoding)}))
    assert started.wait(30)
    got = lane.take(0, np.array([4, 5]))  # returns at once
    assert list(got) == [1] and callable(got[1])
    release.set()
    assert (got[1]() == 7).all() and lane.taken == 1
    lane._pending.append((1, {6: lane._pool.submit(lambda: 1 / 0)}))  # a lane whose decode raised
    settle(lane)
    assert lane.take(1, np.array([6])) == {}
    lane.close()


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("ahead")
    return packed_folder(root, 30)


@pytest.mark.parametrize("continuous", [True, False])
@pytest.mark.parametrize("producers", [1, 3])
def test_each_producer_announces_the_batch_it_makes_next(packed, continuous, producers):
    ld = Loader(path=packed, batch_size=4, size=16, seed=1, as_torch=False, drop_last=False)
    recipe, lock = ld.backend.recipe, threading.Lock()
    announced, made = {}, {}  # slot → [(epoch, ids, windows)] in the order the slot saw them

    def ahead(ids, epoch, slot, drawn):
        with lock:
            announced.setdefault(slot, []).append((epoch, ids.copy(), drawn[0].copy()))

    def batcher(ids, epoch, slot, drawn):
        with lock:
            made.setdefault(slot, []).append((epoch, ids.copy(), drawn[0].copy()))
        return epoch

    per_epoch = len(ld)  # 8 batches, the last of 2
    s = st.BatchStream(batcher, ld.sampler, 4, False, per_epoch, 0, 1, producers=producers, depth=1,
                       continuous=continuous, draws=recipe.draws, ahead=ahead)
    batches = 2 * per_epoch if continuous else per_epoch - 1
    for _ in range(batches):
        s.take()
    s.close()
    ld.close()
    for slot, got in made.items():
        said = announced[slot]
        # what a slot announced before making batch k is the batch it made as k + 1
        for (e, ids, win), (e2, ids2, win2) in zip(said, got[1:]):
            assert e == e2 and np.array_equal(ids, ids2) and np.array_equal(win, win2)
            assert np.array_equal(win, recipe.draws(ids, e)[0])
        if not continuous:  # nothing past the end of the stream
            assert all(e == 0 for e, _, _ in said) and len(said) <= len(got)

"""The Loader's batch stream across epoch ends (loader/stream.py): the producers run on into the
next epoch, the next iteration takes their batches up, any other start discards them, and the
batches are those of a loader that starts every epoch from idle producers."""
import gc
import threading
import time

import numpy as np
import pytest

from conftest import jpeg_bytes, write
from recordtool.loader import Loader
from recordtool.pack import pack


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    src = root / "src"
    for i in range(40):
        write(str(src / f"c{i % 2}" / f"{i}.jpg"), jpeg_bytes(56 + 8 * (i % 3), 48 + 4 * (i % 4), seed=i))
    pack(str(src), str(root / "out"), shards=2, progress=False)
    return str(root / "out")


KW = dict(batch_size=8, size=32, seed=3, as_torch=False, with_ids=True)


def epoch_of(loader):
    return [(np.asarray(x).copy(), np.asarray(y).copy(), np.asarray(i).copy()) for x, y, i in loader]


def same(a, b):
    assert len(a) == len(b)
    for (x, y, i), (u, v, k) in zip(a, b):
        assert np.array_equal(i, k) and np.array_equal(y, v) and np.array_equal(x, u)


def fresh(epoch, start=0, **kw):
    ld = Loader(**{"path": kw.pop("path"), **KW, **kw, "continuous": False})
    ld.set_epoch(epoch)
    got = epoch_of(ld)[start:]
    ld.close()
    return got


class Counting:
    """A batch op that counts its calls (made on the producer threads: a lock guards the count)."""

    def __init__(self):
        self.calls, self.lock = 0, threading.Lock()

    def __call__(self, batch):
        with self.lock:
            self.calls += 1
        return batch


def wait_for(cond, seconds=20.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@pytest.mark.parametrize("producers", [1, 3])
def test_epochs_run_on_into_each_other_with_the_batches_of_fresh_starts(packed, producers):
    ld = Loader(packed, producers=producers, threads=2, **KW)
    for epoch in range(3):  # the loop leaves the loader at the next epoch; set_epoch agrees with it
        if epoch == 1:
            ld.set_epoch(1)
        same(epoch_of(ld), fresh(epoch, path=packed))
    assert ld.state_dict()["epoch"] == 3 and ld.state_dict()["batch"] == 0
    ld.close()


@pytest.mark.parametrize("continuous", [True, False])
def test_the_next_epoch_is_made_while_this_one_is_consumed(packed, continuous):
    """Each producer runs at most its queue's depth + the batch it holds ahead of the consumer:
    2 producers × (prefetch 1 + 1) = 4 batches of the next epoch, taken up by the next
    iteration (not made again); without `continuous` none."""
    op = Counting()
    ld = Loader(packed, producers=2, prefetch=1, user_op=op, continuous=continuous, **KW)
    n, lead = len(ld), (4 if continuous else 0)
    assert n == 5
    for epoch in range(2):
        same(epoch_of(ld), fresh(epoch, path=packed, user_op=Counting()))
        want = (epoch + 1) * n + lead
        assert wait_for(lambda: op.calls >= want), op.calls
        time.sleep(0.3)
        assert op.calls == want  # no more than the lead, and what was made ahead was not made again
    ld.close()


def test_any_other_start_discards_what_was_made_ahead(packed):
    ld = Loader(packed, producers=2, **KW)
    epoch_of(ld)  # epoch 0; the producers are now in epoch 1
    ld.set_epoch(5)
    same(epoch_of(ld), fresh(5, path=packed))
    it = iter(ld)  # epoch 6, left after two batches
    next(it), next(it)
    assert (ld.state_dict()["epoch"], ld.state_dict()["batch"]) == (6, 2)
    same(epoch_of(ld), fresh(7, path=packed))  # a new iteration goes on with the next epoch
    state = ld.state_dict()
    assert state["epoch"] == 8 and state["batch"] == 0
    it = iter(ld)
    next(it)
    mid = ld.state_dict()
    ld.load_state_dict(mid)  # resume where it stands: batches 1.. of epoch 8
    same(epoch_of(ld), fresh(8, start=1, path=packed))
    ld.close()


def test_resume_at_an_epoch_end_goes_on_with_the_next_epoch(packed):
    ld = Loader(packed, producers=2, **KW)
    it = iter(ld)
    for _ in range(len(ld)):
        next(it)
    state = ld.state_dict()  # the epoch is out: the next one is where it stands
    ld.close()
    resumed = Loader(packed, producers=3, **KW)
    resumed.load_state_dict(state)
    same(epoch_of(resumed), fresh(1, path=packed))
    resumed.close()


def test_two_iterators_the_second_goes_on_and_the_first_stops(packed):
    ld = Loader(packed, producers=2, **KW)
    a = iter(ld)
    next(a)
    b = iter(ld)
    first = next(b)  # epoch 0 was started: the new iteration runs epoch 1; the first one's producers stop
    with pytest.raises(RuntimeError, match="stopped"):
        next(a)
    same([first] + list(b), fresh(1, path=packed))
    ld.close()


def _loader_threads():
    return {t for t in threading.enumerate() if t.name == "recordtool-loader"}


def test_a_loader_dropped_after_an_epoch_stops_its_producers(packed):
    """The producers that ran on into the next epoch hold the batcher, not the Loader: dropping
    the Loader (no close()) collects it, and its stream's threads end."""
    before = _loader_threads()  # other tests' loaders may still be ending: only new threads count
    ld = Loader(packed, producers=3, **KW)
    epoch_of(ld)
    mine = _loader_threads() - before
    assert len(mine) == 3 and all(t.is_alive() for t in mine)  # blocked on their full queues
    del ld
    gc.collect()
    assert wait_for(lambda: not any(t.is_alive() for t in mine)), mine


def test_continuous_is_checked(packed):
    from recordtool.errors import ConfigError

    with pytest.raises(ConfigError, match="continuous"):
        Loader(packed, batch_size=8, continuous="yes")


def test_a_discarded_stream_holds_no_ring_slot(packed):
    """close() drops every batch the producers made ahead — the ones queued and the one each
    producer was waiting to queue — even while an iterator of that stream is still referenced
    (a second iteration's start, load_state_dict): the new stream has the whole ring."""
    ld = Loader(packed, producers=2, prefetch=1, **KW)
    a = iter(ld)
    next(a)  # dropped at once: only what the producers made ahead is held
    ring = ld.ring
    held = 2 * (1 + 1)  # producers × (prefetch + the batch each waits to queue)
    assert wait_for(lambda: ring.free == ring.slots - held), (ring.free, ring.slots)
    ld.close()
    assert a is not None and ring.free == ring.slots, (ring.free, ring.slots)
    del a


def test_a_loader_collected_on_its_own_producer_stops_without_closing_the_batcher(packed):
    """A collection can run Loader.__del__ on one of the stream's producers (the Loader in a
    reference cycle): the stream stops without that thread joining the others (it may hold a
    lock they wait for), and the batcher it may be using mid-batch is left to be collected."""
    box, done = [], threading.Event()

    def op(batch):  # a batch op runs on a producer thread: the collection's stand-in
        if box and not done.is_set():
            done.set()
            t = time.monotonic()
            box[0].__del__()
            box.append(time.monotonic() - t)
        return batch

    ld = Loader(packed, producers=2, user_op=op, **KW)
    box.append(ld)
    it = iter(ld)  # noqa: F841  (the epoch the producers run; the op stops it from inside)
    assert wait_for(done.is_set) and wait_for(lambda: len(box) == 2)
    assert box[1] < 5.0  # no join from a producer
    assert len(ld.backend._pools) == 2  # not closed under its producer
    assert ld._stream is None  # stopped
    ld.backend.close()


@pytest.mark.parametrize("train", [True, False])
def test_windows_and_flips_drawn_a_run_at_a_time_are_each_batchs_own(packed, train):
    """The stream draws the windows and flips of DRAW_RUN batches in one call (NumPy releases
    the GIL in each array operation; one call for many batches retakes it fewer times): every
    batch gets exactly what Recipe.draws gives for its ids alone, across epoch ends, with a
    short last batch, whatever the producer."""
    from recordtool.loader import stream as st

    ld = Loader(path=packed, **{**KW, "batch_size": 3}, train=train, drop_last=False)
    recipe, calls, lock = ld.backend.recipe, [], threading.Lock()

    def draws(ids, epoch):
        with lock:
            calls.append(len(ids))
        return recipe.draws(ids, epoch)

    def batcher(ids, epoch, slot, drawn):
        return epoch, ids.copy(), drawn

    per_epoch = len(ld)  # 14 batches of 40 records, the last of 1
    old = st.DRAW_RUN
    st.DRAW_RUN = 4
    try:
        s = st.BatchStream(batcher, ld.sampler, 3, False, per_epoch, 1, 2, producers=3, depth=2, continuous=True,
                           draws=draws)
        for t in range(3 * per_epoch):
            e, j, ids, (ee, ids2, (win, flips)) = s.take()
            want_w, want_f = recipe.draws(ids, e)
            assert ee == e and np.array_equal(ids, ids2) and len(win) == len(ids)
            assert np.array_equal(win, want_w) and np.array_equal(flips, want_f), (e, j)
        s.close()
    finally:
        st.DRAW_RUN = old
        ld.close()
    assert per_epoch == 14 and len(calls) < 3 * per_epoch / 2  # runs, not batches (a lagging producer may redraw one)


def test_run_ahead_waits_for_the_hand_out_steps_back():
    """RunAhead's bookkeeping (no GPU: events stood in for): before hand-out h it waits on the
    event recorded at hand-out h - steps — what the consumer's stream held then — and on none
    before `steps` hand-outs; an event is never waited on before it was recorded, nor recorded
    again while still to be waited on."""
    from recordtool.decode.gpu.handout import RunAhead

    class Event:
        def __init__(self):
            self.recorded_at = None  # the hand-out it marks

        def synchronize(self):
            waited.append(self.recorded_at)

    for steps in (1, 2, 3):
        pace = RunAhead.__new__(RunAhead)
        pace.steps, pace._handed = steps, 0
        pace._events = [Event() for _ in range(steps + 1)]
        handed = [0]

        def record(ev):
            ev.recorded_at = handed[0]

        pace._record = record
        waited = []
        for h in range(12):
            pace.before()
            pace.handed()
            handed[0] += 1
        assert waited == list(range(12 - steps)), steps  # hand-out h waited on hand-out h - steps
    with pytest.raises(ValueError):
        RunAhead(0, 0)


def test_the_epoch_iterator_paces_each_hand_out(packed):
    """The epoch iterator asks its backend to pace each take and hands each batch out through it,
    in that order, whatever the device: what `pace` adds to the stages adds up in the Loader's
    stage_seconds."""
    ld = Loader(packed, batch_size=4, size=32, as_torch=False)
    calls, handout = [], ld.backend.handout

    def pace(stages):
        calls.append("pace")
        stages["run_ahead"] = stages.get("run_ahead", 0.0) + 0.25

    def hand(made, as_torch):
        calls.append("handout")
        return handout(made, as_torch)

    ld.backend.pace, ld.backend.handout = pace, hand  # the instance's: the iterator calls them, no other
    n = sum(1 for _ in ld)
    assert n == len(ld) > 1 and calls == ["pace", "handout"] * n
    assert ld.stage_seconds["run_ahead"] == 0.25 * n
    ld.close()


def test_the_gpu_backend_paces_counts_and_hands_out_around_its_run_ahead():
    """GPUBackend's consumer side (no GPU: its RunAhead stood in for, a host batch complete
    already): `pace` waits on the RunAhead and adds the seconds under "run_ahead", `handout`
    marks the hand-out after the batch is arranged, `stats` reads the batch's BatchReport; with
    run_ahead=None nothing waits or is marked."""
    from recordtool.decode.backend import ProducedBatch
    from recordtool.decode.gpu.backend import GPUBackend
    from recordtool.decode.gpu.decoder import BatchReport
    from recordtool.decode.spec import Output

    calls = []

    class Pace:
        def before(self):
            calls.append("before")
            return 0.5

        def handed(self):
            calls.append("handed")

    g = object.__new__(GPUBackend)
    g.gpu_id, g.output, g._pace = 0, Output(8, memory_format="channels_last"), Pace()
    report = BatchReport(n=4, gpu=2, hybrid=1, cpu=1, overflow=1, ahead=1)
    made = ProducedBatch(np.zeros((4, 8, 8, 3), np.float32), np.arange(4), [], {}, report)
    stages = {"decode": 1.0}
    g.pace(stages)
    x, y = g.handout(made, as_torch=False)
    assert calls == ["before", "handed"] and stages == {"decode": 1.0, "run_ahead": 0.5}
    assert x.shape == (4, 3, 8, 8) and np.shares_memory(x, made.images) and y is made.labels  # arranged, no copy
    counts = g.stats(made)
    assert counts.decoded == {"gpu": 2, "hybrid": 1, "cpu": 1} and (counts.overflow, counts.ahead) == (1, 1)
    assert counts.report is report
    g._pace = None
    g.pace(stages)
    g.handout(made, as_torch=False)
    assert calls == ["before", "handed"] and stages == {"decode": 1.0, "run_ahead": 0.5}


def test_every_backend_has_the_whole_protocol(packed):
    """Both backends implement every method of decode.backend.Backend (an ABC: a missing one
    makes the class uninstantiable); the CPU's pace, announce and steering do nothing, by design,
    and it announces nothing — so the loader asks no backend whether it has a method."""
    import inspect

    from recordtool.decode.backend import Backend
    from recordtool.decode.cpu_backend import CPUBackend
    from recordtool.decode.gpu import GPUBackend

    for cls in (CPUBackend, GPUBackend):
        assert issubclass(cls, Backend) and not inspect.isabstract(cls), cls.__abstractmethods__
    ld = Loader(packed, batch_size=4, size=32, as_torch=False)
    b, stages = ld.backend, {}
    assert isinstance(b, CPUBackend) and b.announces is False
    b.pace(stages), b.consumer_waited(0.1, 0.2), b.announce(np.arange(4), 0, 0)
    assert stages == {} and ld.last_split is None
    next(iter(ld))
    assert ld.decoded == {} and ld.overflow == ld.ahead == 0 and ld.last_split is None
    ld.close()

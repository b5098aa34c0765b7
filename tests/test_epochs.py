"""Epochs as PyTorch users drive them: a loop left early, `set_epoch` (directly, on
`loader.sampler`, inside a running loop), resume, a state from another dataset, and the padding
a distributed evaluation leaves out. Lightning's own Trainer drives the Loader in
test_lightning.py."""
import numpy as np
import pytest

import recordtool
from conftest import packed_folder
from recordtool.errors import BadState, ConfigError
from recordtool.loader import Loader

N = 30


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("epochs")
    return packed_folder(root, N)


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """Another dataset of the same size and classes (other pixels)."""
    root = tmp_path_factory.mktemp("epochs_other")
    return packed_folder(root, N, seed=1000)


def loader(path, **kw):
    return Loader(path, **dict(dict(batch_size=4, size=16, seed=3, threads=1, as_torch=False, with_ids=True), **kw))


def ids(batch):
    return np.asarray(batch[2]).tolist()


@pytest.mark.parametrize("continuous", [True, False])
def test_a_loop_left_early_is_followed_by_the_next_epoch(packed, continuous):
    ld = loader(packed, continuous=continuous)
    want = [[b.tolist() for b in ld.batch_ids(e)] for e in range(3)]
    assert want[0] != want[1]
    for j, batch in enumerate(ld):  # the habit: a loop that stops after a few steps
        if j == 2:
            break
    assert ld.epoch == 0 and ld.state_dict()["batch"] == 3  # where the left epoch stands
    assert [ids(b) for b in ld] == want[1]  # the next iteration: epoch 1, whole, never epoch 0 again
    assert ld.epoch == 2
    it = iter(ld)  # started and left without a batch: nothing was taken, the epoch stays
    del it
    assert [ids(b) for b in ld] == want[2]


def test_set_epoch_chooses_the_next_iteration_also_through_the_sampler(packed):
    ld = loader(packed)
    want = [[b.tolist() for b in ld.batch_ids(e)] for e in range(6)]
    next(iter(ld))
    ld.sampler.set_epoch(4)  # DistributedSampler's habit (and Lightning's hook)
    assert ld.epoch == 4 and [ids(b) for b in ld] == want[4]
    ld.set_epoch(1)
    assert [ids(b) for b in ld] == want[1]
    assert len(ld.sampler) == 30 and list(ld.sampler) == ld.sampler.order.indices(2).tolist()


def test_an_iterator_runs_the_epoch_set_before_its_first_batch(packed):
    """Lightning's order: iter(loader), then set_epoch (and, resuming, load_state_dict), then
    the first batch — the epoch is the one set when the first batch is drawn."""
    ld = loader(packed)
    want = [[b.tolist() for b in ld.batch_ids(e)] for e in range(4)]
    it = iter(ld)
    ld.set_epoch(2)
    assert it.epoch == 2 and len(it) == len(ld)
    assert [ids(b) for b in it] == want[2]
    assert ld.epoch == 3

    a = loader(packed)
    it = iter(a)
    a.sampler.set_epoch(0)
    assert [ids(next(it)) for _ in range(2)] == want[0][:2]
    state = a.state_dict()
    assert (state["epoch"], state["batch"]) == (0, 2)  # the running epoch moves the Loader
    b = loader(packed)
    it = iter(b)
    b.load_state_dict(state)
    b.sampler.set_epoch(0)  # Lightning's resume: iter, load_state_dict, set_epoch of the saved epoch
    assert len(it) == len(b) - 2 and [ids(x) for x in it] == want[0][2:]
    assert b.state_dict()["epoch"] == 1


def test_set_epoch_inside_a_running_loop_holds(packed):
    ld = loader(packed)
    want = [[b.tolist() for b in ld.batch_ids(e)] for e in range(8)]
    got = []
    for j, b in enumerate(ld):
        got.append(ids(b))
        if j == 1:
            ld.set_epoch(7)  # torch's samplers keep it: the next epoch is 7
    assert got == want[0]  # the running loop finishes its own epoch
    assert ld.epoch == 7 and [ids(b) for b in ld] == want[7]


@pytest.mark.parametrize("bad", [-1, 1.7, "3", True, None, np.float64(2.0)])
def test_set_epoch_refuses_what_is_not_an_epoch(packed, bad):
    ld = loader(packed)
    with pytest.raises(ConfigError, match="epoch"):
        ld.set_epoch(bad)
    with pytest.raises(ConfigError, match="epoch"):
        ld.batch_ids(bad)
    assert ld.epoch == 0


def test_resume_mid_epoch_is_exact_and_set_epoch_of_its_epoch_keeps_it(packed):
    ld = loader(packed)
    full = [ids(b) for e in range(2) for b in ld]
    a = loader(packed)
    for j, b in enumerate(a):
        if j == 3:
            break
    a.set_epoch(1)
    it = iter(a)
    first = [ids(next(it)) for _ in range(2)]
    state = a.state_dict()
    assert (state["epoch"], state["batch"]) == (1, 2)
    b = loader(packed)
    b.load_state_dict(state)
    b.sampler.set_epoch(1)  # Lightning calls it after restoring the state: the batch stays
    rest = [ids(x) for x in b]
    assert first + rest == full[len(ld):]
    c = loader(packed)
    c.load_state_dict(state)
    c.set_epoch(0)  # another epoch: from its start
    assert [ids(x) for x in c] == full[:len(ld)]


def test_a_state_from_another_dataset_is_refused(packed, other):
    state = loader(packed).state_dict()
    assert isinstance(state["dataset"], str) and len(state["dataset"]) == 32
    assert loader(packed).state_dict()["dataset"] == state["dataset"]  # a fingerprint, not a run's
    ld = loader(other)
    with pytest.raises(BadState, match="another dataset"):
        ld.load_state_dict(state)
    for bad in (None, 7, state["dataset"][:-1]):
        with pytest.raises(BadState, match="dataset"):
            ld.load_state_dict(dict(state, dataset=bad))
    old = {k: v for k, v in state.items() if k != "dataset"}  # a state saved before it named the dataset
    ld.load_state_dict(old)


@pytest.mark.parametrize("world", [3, 4, 5])
def test_distributed_evaluation_counts_every_sample_once(packed, world):
    """The README's recipe: drop the last `padding` samples of a rank's last batch."""
    seen, labels = [], {}
    for rank in range(world):
        ev = loader(packed, train=False, rank=rank, world_size=world)
        assert ev.padding == (1 if N % world and rank >= N % world else 0)
        batches = list(ev)
        for j, (_, y, i) in enumerate(batches):
            keep = len(i) - (ev.padding if j == len(batches) - 1 else 0)
            seen += np.asarray(i)[:keep].tolist()
            labels.update(zip(np.asarray(i)[:keep].tolist(), np.asarray(y)[:keep].tolist()))
    assert sorted(seen) == list(range(N))  # each sample once, none twice
    truth = recordtool.open(packed).labels
    assert all(truth[i] == y for i, y in labels.items())
    assert loader(packed, train=True, rank=0, world_size=world).padding == 0  # drop_last: no padding

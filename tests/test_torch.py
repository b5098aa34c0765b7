"""The Loader and Dataset inside PyTorch training code, on the CPU: tensors without a copy
(as_torch, DLPack), a torch DataLoader over a Dataset, a DistributedDataParallel run over gloo
with two processes, and a Lightning `fit` with the Loader as its train loader. CI installs the
CPU build of torch (scripts/bootstrap.sh), so these run there."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import recordtool
from conftest import packed_folder
from recordtool.loader import Loader

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch")
    return packed_folder(root, 32, classes=4, w=48, h=40)


def test_as_torch_and_dlpack_share_the_batch_memory(packed):
    ld = Loader(packed, batch_size=8, size=16, train=False)
    x, y = next(iter(ld))
    assert isinstance(x, torch.Tensor) and x.dtype == torch.float32 and tuple(x.shape) == (8, 3, 16, 16)
    assert y.dtype == torch.int64 and y.tolist() == recordtool.open(packed).labels[:8].tolist()
    assert x.data_ptr() in {m.ctypes.data for m in ld.ring._mem}  # the ring's slot, no copy
    ld.close()
    ld = Loader(packed, batch_size=8, size=16, train=False, as_torch=False)
    a, _ = next(iter(ld))
    t = torch.from_dlpack(a)  # the numpy batch through DLPack: same memory, same values
    assert t.data_ptr() == a.ctypes.data and torch.equal(t, x)
    ld.close()


def _decode_batch(items):
    """collate_fn of a DataLoader over a Dataset: decode + centre crop in the worker (the JPEG
    bytes are views into the worker's own mapping; only tensors travel back)."""
    from recordtool.decode import center_windows, decode_crop_resize
    from recordtool.format.jpeg import probe

    bufs = [b for b, _ in items]
    sizes = np.array([(probe(b).width, probe(b).height) for b in bufs])
    win = center_windows(sizes[:, 0], sizes[:, 1], resize=32, crop=28)
    x = torch.from_numpy(decode_crop_resize(bufs, win, (28, 28), threads=1)).permute(0, 3, 1, 2)
    return x, torch.tensor([label for _, label in items])


def test_dataloader_over_a_dataset(packed):
    ds = recordtool.open(packed)
    # the parent decodes first, so its native pool threads exist when the workers are forked: a
    # child must not wait on them (they are not in the child; it hung before pools were renewed
    # after fork). DataLoader's timeout turns a hung worker into a failure.
    _decode_batch([ds[i] for i in range(4)])
    dl = torch.utils.data.DataLoader(ds, batch_size=5, shuffle=False, num_workers=2, collate_fn=_decode_batch,
                                     timeout=120)
    xs, ys = zip(*dl)
    assert [len(y) for y in ys] == [5] * 6 + [2]
    assert torch.cat(ys).tolist() == ds.labels.tolist() and xs[0].shape == (5, 3, 28, 28)
    assert xs[0].dtype == torch.uint8 and xs[0].float().std() > 1  # real pixels


DDP_SCRIPT = r'''
import json, os, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from recordtool.loader import Loader

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(4, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ld = Loader(sys.argv[1], batch_size=4, size=24, seed=3, threads=1, with_ids=True)
seen, losses = [], []
for epoch in range(2):
    ld.set_epoch(epoch)
    for x, y, ids in ld:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        seen.append([epoch] + [int(i) for i in ids])
        losses.append(float(loss))
params = float(sum(p.double().sum() for p in model.parameters()))
with open(os.path.join(sys.argv[2], f"rank{rank}.json"), "w") as f:
    json.dump({"rank": ld.rank, "world": ld.world_size, "seen": seen, "params": params, "losses": losses}, f)
dist.destroy_process_group()
'''


def test_ddp_gloo_two_processes(packed, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # --standalone: a rendezvous on a free port of this host (a fixed port collides with another run's)
    p = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", str(script), packed, str(tmp_path)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    r = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    assert [(x["rank"], x["world"]) for x in r] == [(0, 2), (1, 2)]  # rank and world from torch.distributed
    for epoch in range(2):
        ids = [i for x in r for s in x["seen"] if s[0] == epoch for i in s[1:]]
        assert sorted(ids) == list(range(32))  # the ranks' shares: every sample once per epoch
    assert len(r[0]["seen"]) == len(r[1]["seen"]) == 8  # same number of steps on each rank
    assert r[0]["params"] == r[1]["params"]  # gradients all-reduced: the replicas stayed equal
    assert all(np.isfinite(x["losses"]).all() for x in r)


def test_lightning_fit_with_the_loader(packed):
    L = pytest.importorskip("lightning")

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                                           torch.nn.Flatten(), torch.nn.Linear(4, 4))
            self.labels = []

        def training_step(self, batch, _):
            x, y = batch
            assert x.shape == (4, 3, 24, 24) and x.dtype == torch.float32
            self.labels.append(y.clone())
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    ld = Loader(packed, batch_size=4, size=24, seed=1, threads=1)
    model = Tiny()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, train_dataloaders=ld)
    assert trainer.global_step == 2 * len(ld) == 16  # every batch of both epochs trained on
    assert ld.epoch == 2  # the Loader moved on by itself at each epoch's end
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    ds = recordtool.open(packed)
    want = np.concatenate([ds.labels[np.concatenate(ld.batch_ids(e))] for e in range(2)])
    assert torch.cat(model.labels).tolist() == want.tolist()  # the batches the Loader promised, in order

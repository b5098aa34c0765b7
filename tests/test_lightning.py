"""Lightning's own Trainer driving the Loader, on the CPU and (where there is one) the GPU: fit
with validation, epochs cut short by `limit_train_batches`, resume from a mid-epoch checkpoint
and from the default ModelCheckpoint's end-of-epoch one, `validate` / `test` / `predict`; DDP
on the CPU (two processes, Lightning's own launcher) with Loaders made before `fit()`."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import recordtool
from conftest import packed_folder
from recordtool.loader import Loader

if os.environ.get("RECORDTOOL_TEST_INSTALLED") == "1":  # CI installs [test,torch]: missing, they fail, never skip
    import lightning as L
    import torch
else:
    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning")

N = 32


def _devices():
    try:
        import cupy

        ngpu = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, or no driver
        ngpu = 0
    return ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        ngpu == 0 or not torch.cuda.is_available(), reason="no CuPy or no CUDA device")])]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("lightning")
    return packed_folder(root, N, classes=4, w=44, h=40)


class Tiny(L.LightningModule):
    """Records the sample ids of every batch each stage sees."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                                       torch.nn.Flatten(), torch.nn.Linear(4, 4))
        self.seen = {"train": [], "val": [], "test": [], "predict": []}

    def _step(self, stage, batch):
        x, y, ids = batch
        self.seen[stage].append(np.asarray(ids).tolist())
        return torch.nn.functional.cross_entropy(self.net(x.float()), y.long())

    def training_step(self, batch, _):
        return self._step("train", batch)

    def validation_step(self, batch, _):
        self.log("val_loss", self._step("val", batch), batch_size=len(batch[1]))

    def test_step(self, batch, _):
        self._step("test", batch)

    def predict_step(self, batch, _):
        self.seen["predict"].append(np.asarray(batch[2]).tolist())
        return self.net(batch[0].float()).argmax(1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def trainer(device, tmp_path, **kw):
    kw = dict(dict(accelerator="gpu" if device == "cuda" else "cpu", devices=1, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                   default_root_dir=str(tmp_path)), **kw)
    return L.Trainer(**kw)


def loader(packed, device, **kw):
    return Loader(packed, **dict(dict(batch_size=4, size=24, seed=5, threads=1, with_ids=True, device=device), **kw))


@pytest.mark.parametrize("device", _devices())
def test_epochs_cut_short_by_limit_train_batches_move_on(packed, device, tmp_path):
    train = loader(packed, device)
    model = Tiny()
    trainer(device, tmp_path, max_epochs=3, limit_train_batches=3).fit(model, train_dataloaders=train)
    want = [b.tolist() for e in range(3) for b in train.batch_ids(e)[:3]]
    assert model.seen["train"] == want  # epoch e trained on epoch e's first 3 batches: no repeat
    assert train.epoch == 2


@pytest.mark.parametrize("device", _devices())
def test_fit_with_validation_then_validate_test_predict(packed, device, tmp_path):
    train = loader(packed, device)
    val = loader(packed, device, train=False)
    model = Tiny()
    t = trainer(device, tmp_path, max_epochs=2, num_sanity_val_steps=2)
    t.fit(model, train_dataloaders=train, val_dataloaders=val)
    every = [b.tolist() for b in val.batch_ids(0)]
    assert model.seen["val"] == every[:2] + every + every  # the sanity check's 2, then each epoch whole
    assert model.seen["train"] == [b.tolist() for e in range(2) for b in train.batch_ids(e)]
    assert "val_loss" in t.callback_metrics
    model.seen["val"] = []
    t.validate(model, dataloaders=val, verbose=False)
    t.test(model, dataloaders=val, verbose=False)
    out = t.predict(model, dataloaders=val)
    for stage in ("val", "test", "predict"):
        assert sorted(sum(model.seen[stage], [])) == list(range(N))  # every sample once
    assert sum(len(p) for p in out) == N


@pytest.mark.parametrize("device", _devices())
def test_resume_from_a_mid_epoch_checkpoint_is_exact(packed, device, tmp_path):
    steps = 2 * len(loader(packed, device))
    whole = Tiny()
    trainer(device, tmp_path / "a", max_epochs=2).fit(whole, train_dataloaders=loader(packed, device))
    assert len(whole.seen["train"]) == steps

    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ck"), every_n_train_steps=11, save_top_k=-1)
    first = Tiny()
    trainer(device, tmp_path / "b", max_epochs=2, max_steps=12, enable_checkpointing=True,
            callbacks=[ckpt]).fit(first, train_dataloaders=loader(packed, device))
    path = next((tmp_path / "ck").glob("*step=11*.ckpt"))  # epoch 1, 3 batches into it
    rest = Tiny()
    trainer(device, tmp_path / "c", max_epochs=2).fit(rest, train_dataloaders=loader(packed, device),
                                                     ckpt_path=str(path))
    assert first.seen["train"][:11] + rest.seen["train"] == whole.seen["train"]


@pytest.mark.parametrize("device", _devices())
def test_resume_from_the_default_end_of_epoch_checkpoint_runs_the_next_epochs(packed, device, tmp_path):
    """Lightning makes its iterator before it calls set_epoch (and, resuming, load_state_dict):
    the resumed fit must run epochs 1 and 2, not epoch 0 again."""
    train = loader(packed, device)
    want = [[b.tolist() for b in train.batch_ids(e)] for e in range(3)]
    whole = Tiny()
    trainer(device, tmp_path / "a", max_epochs=3).fit(whole, train_dataloaders=train)
    assert whole.seen["train"] == want[0] + want[1] + want[2]

    first = Tiny()
    trainer(device, tmp_path / "b", max_epochs=1, enable_checkpointing=True).fit(
        first, train_dataloaders=loader(packed, device))
    path, = (tmp_path / "b" / "checkpoints").glob("*.ckpt")  # the default ModelCheckpoint: epoch 0's end
    state = torch.load(path, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert (state["epoch"], state["batch"]) == (1, 0)  # saved where the Loader stands: epoch 0 done
    rest = Tiny()
    trainer(device, tmp_path / "c", max_epochs=3).fit(rest, train_dataloaders=loader(packed, device),
                                                     ckpt_path=str(path))
    assert first.seen["train"] == want[0]
    assert rest.seen["train"] == want[1] + want[2]


DDP_SCRIPT = r'''
import json, os, sys
import numpy as np
import torch
import lightning as L
from recordtool.loader import Loader


def loaders(data):
    return (Loader(data, batch_size=4, size=16, seed=5, threads=1, with_ids=True),
            Loader(data, batch_size=4, size=16, threads=1, with_ids=True, train=False))


class Tiny(L.LightningModule):
    """Writes, on each rank at the end of fit, the sample ids of every batch it trained and
    validated on, and its Loaders' rank and world size."""

    def __init__(self, out):
        super().__init__()
        self.out, self.net = out, torch.nn.Linear(3, 4)
        self.seen = {"train": [], "val": []}

    def _step(self, stage, batch):
        x, y, ids = batch
        self.seen[stage].append([self.current_epoch] + np.asarray(ids).tolist())
        return torch.nn.functional.cross_entropy(self.net(x.float().mean((2, 3))), y.long())

    def training_step(self, batch, _):
        return self._step("train", batch)

    def validation_step(self, batch, _):
        self._step("val", batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def on_fit_end(self):
        t = self.trainer
        train, val = t.train_dataloader, t.val_dataloaders
        with open(os.path.join(self.out, f"rank{t.global_rank}.json"), "w") as f:
            json.dump({"placement": [train.rank, train.world_size, val.rank, val.world_size],
                       "seen": self.seen}, f)


class Data(L.LightningDataModule):
    def __init__(self, data):
        super().__init__()
        self.data = data

    def train_dataloader(self):
        return loaders(self.data)[0]

    def val_dataloader(self):
        return loaders(self.data)[1]


if __name__ == "__main__":
    data, out, strategy, where = sys.argv[1:5]
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, default_root_dir=out)
    if where == "before_fit":  # the Loaders made at the top of the script, before fit() starts the ranks
        train, val = loaders(data)
        trainer.fit(Tiny(out), train_dataloaders=train, val_dataloaders=val)
    else:  # made by the LightningDataModule's hooks, in each rank's process
        trainer.fit(Tiny(out), datamodule=Data(data))
'''


def _run_ddp(packed, tmp_path, strategy, where):
    """The script above as Lightning runs it (its launcher starts the other rank: `ddp` runs the
    script again, `ddp_spawn` spawns), in a session of its own: a hang is killed whole at the
    timeout and fails the test."""
    script = tmp_path / "fit_ddp.py"
    script.write_text(DDP_SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    p = subprocess.Popen([sys.executable, str(script), packed, str(tmp_path), strategy, where], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"{strategy} fit did not end in 240 s (ranks waiting on each other):\n{out[-3000:]}")
    return p.returncode, out


@pytest.mark.parametrize("strategy,where", [("ddp", "before_fit"), ("ddp_spawn", "datamodule")])
def test_ddp_on_the_cpu_covers_every_sample_once_per_epoch(packed, tmp_path, strategy, where):
    """Two CPU processes under Lightning's own DDP launcher. With `ddp` the Loaders are made
    before fit(): the launched rank sees WORLD_SIZE=2 and no RANK there, the first process
    nothing; each learns its rank from the process group fit initialises."""
    rc, out = _run_ddp(packed, tmp_path, strategy, where)
    assert rc == 0, out[-4000:]
    r = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    assert [x["placement"] for x in r] == [[0, 2, 0, 2], [1, 2, 1, 2]]
    for stage in ("train", "val"):
        for epoch in range(2):
            per_rank = [[i for b in x["seen"][stage] if b[0] == epoch for i in b[1:]] for x in r]
            assert len(per_rank[0]) == len(per_rank[1]) == N // 2  # equal shares: no rank waits for the other
            assert sorted(per_rank[0] + per_rank[1]) == list(range(N))  # every sample once per epoch
    train = [[b[1:] for b in x["seen"]["train"]] for x in r]
    assert train[0][:4] != train[0][4:]  # epoch 1 is not epoch 0 again


def test_ddp_spawn_with_loaders_given_to_fit_is_refused_naming_ddp(packed, tmp_path):
    """ddp_spawn pickles what fit was given into the new processes; a Loader (threads, native
    pools, its ring) does not cross: NotADataset says to use strategy="ddp" or a DataModule."""
    rc, out = _run_ddp(packed, tmp_path, "ddp_spawn", "before_fit")
    assert rc != 0
    assert "NotADataset" in out and 'strategy="ddp_spawn"' in out and 'strategy="ddp"' in out, out[-3000:]

"""Lightning's own Trainer driving the Loader, on the CPU and (where there is one) the GPU: fit
with validation, epochs cut short by `limit_train_batches`, resume from a mid-epoch
checkpoint, `validate` / `test` / `predict`."""
import numpy as np
import pytest

import recordtool
from conftest import packed_folder
from recordtool.loader import Loader

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

N = 32


def _devices():
    try:
        import cupy

        ngpu = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, or no driver
        ngpu = 0
    return ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(ngpu == 0 or not torch.cuda.is_available(),
                                                                 reason="no CuPy or no CUDA device"))]


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

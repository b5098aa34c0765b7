"""The input pipelines `recordtool bench --train` compares (train_bench.py's docstring lists
them), each an endless iterator of (images, labels) batches, and `parse_options` for a
pipeline's ':k=v,…' options."""
from __future__ import annotations

import threading

import numpy as np


def endless(loader):
    epoch = 0
    while True:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def synthetic(batch: int, size: int, device: str, labels: str = "device"):
    """One batch reused. device: "cuda", "cpu" (numpy, the consumer form) or "cpu_torch".
    labels (cuda): "device" — made on the GPU once; "pageable" / "pinned" — copied up from a
    host array each step with non_blocking=True (a diagnostic: what a loader handing host
    labels costs the training loop; from pageable memory CUDA may wait for the stream)."""
    if device == "cpu":  # the CPU form needs no torch
        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((batch, 3, size, size), np.float32), rng.integers(0, 1000, batch)
        while True:
            yield x, y
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, size, size, generator=g)
    y = torch.randint(0, 1000, (batch,), generator=g)
    if device == "cuda":  # NCHW fp16 as the loaders give it: the step's channels_last copy is the same for all
        x = x.cuda().half()
        if labels != "device":
            if labels not in ("pageable", "pinned"):
                raise ValueError(f"labels must be device, pageable or pinned, not {labels!r}")
            host = y.numpy()
            while True:
                t = torch.from_numpy(host)
                yield x, (t.pin_memory() if labels == "pinned" else t).cuda(non_blocking=True)
        y = y.cuda()
    while True:
        yield x, y


def make_loader(packed: str, batch: int, size: int, device: str, options: dict):
    """The Loader of a pipeline; options are its keywords, and `op=NAME` a compiled per-image
    op by its registry name (recordtool.ops.by_name: jitter, cutout, grayscale)."""
    from ..loader import Loader

    kw = dict(batch_size=batch, size=size, device=device, dtype="float16" if device == "cuda" else "float32",
              as_torch=device == "cuda")
    options = dict(options)
    if "op" in options:
        from .. import ops

        options["user_op"] = ops.by_name(str(options.pop("op")))
    kw.update(options)
    return Loader(packed, **kw)


class Beside:
    """Takes one batch of a pipeline on a thread for each batch the training loop takes from
    `paced(...)` — the consumption a real run has — and drops it: the loop trains on synthetic
    data, so what changes is only the pipeline's cost to the process."""

    def __init__(self, it):
        self.it, self.stop, self.batches, self.error = it, threading.Event(), 0, None
        # its first batch before the training starts: the pipeline's start-up (decoders made and
        # warmed up, kernels compiled) is not what a training step pays in steady state
        next(self.it)
        self.ticks = threading.Semaphore(2)  # the loader may run 2 batches ahead, as a consumer lets it
        self.thread = threading.Thread(target=self._run, daemon=True, name="bench-beside")
        self.thread.start()

    def _run(self):
        try:
            while not self.stop.is_set():
                if not self.ticks.acquire(timeout=0.1):
                    continue
                next(self.it)
                self.batches += 1
        except BaseException as e:  # reported by close(): a run whose loader failed is no measurement
            self.error = e

    def paced(self, batches):
        for b in batches:
            self.ticks.release()
            yield b

    def close(self):
        self.stop.set()
        self.thread.join(timeout=60)
        if self.error is not None:
            raise RuntimeError(f"the pipeline beside failed: {type(self.error).__name__}: {self.error}") from self.error


def dali(files: str, batch: int, size: int, threads: int, hw_decoder_load: float, device: str, shard: int = 0,
          shards: int = 1, device_id: int = 0, op: str | None = None):
    """DALI's pipeline on the original files (peers.dali_random_resized_crop), with DALI's
    counterpart of a recordtool op (`op=NAME`, peers.dali_op) after the resize."""
    from nvidia.dali import fn, pipeline_def

    from .peers import dali_random_resized_crop, jpeg_files

    items = jpeg_files(files)
    gpu = device == "cuda"

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=device_id if gpu else None,
                  prefetch_queue_depth=2, seed=shard)
    def pipe():
        jpegs, label = fn.readers.file(files=[p for p, _ in items], labels=[int(y) for _, y in items],
                                       random_shuffle=True, name="reader", shard_id=shard, num_shards=shards)
        images = dali_random_resized_crop(jpegs, gpu, size, hw_decoder_load, op=str(op) if op else None)
        return images, label.gpu() if gpu else label

    p = pipe()
    p.build()
    if not gpu:  # the CPU form: DALI's own outputs, no torch
        def gen_cpu():
            while True:
                images, labels = p.run()
                yield images, labels
        return gen_cpu()
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    it = DALIGenericIterator([p], ["x", "y"], reader_name="reader", auto_reset=True)

    def gen():
        while True:
            for out in it:
                yield out[0]["x"], out[0]["y"].view(-1)
    return gen()


def torchvision_folder(files: str, batch: int, size: int, threads: int):
    import torch
    from torchvision import datasets, transforms

    from ..decode.spec import IMAGENET_MEAN, IMAGENET_STD

    tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    dl = torch.utils.data.DataLoader(datasets.ImageFolder(files, tf), batch_size=batch, shuffle=True,
                                     num_workers=threads, pin_memory=True, drop_last=True, persistent_workers=True,
                                     prefetch_factor=4)
    return endless(dl)


def parse_options(spec: str) -> dict:
    """'recordtool:split=gpu,producers=2,run_ahead=none' → {'split': 'gpu', 'producers': 2, 'run_ahead': None}."""
    out = {}
    for kv in filter(None, spec.split(",")):
        k, _, v = kv.partition("=")
        try:
            out[k] = int(v)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = {"true": True, "false": False, "none": None}.get(v.lower(), v)
    return out

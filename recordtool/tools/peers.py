"""The pipelines users would otherwise pick, run on the same images, batch and threads as ours
(`recordtool bench`, benchmarks/bench_gpu.py): NVIDIA DALI first, then a Pillow + torchvision-rule
RandomResizedCrop baseline, and on the GPU torchvision's and nvImageCodec's decoders.

Every peer produces what our Loader produces: RandomResizedCrop (area 0.08–1, ratio 3/4–4/3)
→ 224² bilinear → random horizontal flip → mean/std normalisation, NCHW (fp16 on the GPU,
float32 on the CPU). Rates are images/s of whole epochs after a warm-up epoch.
"""
from __future__ import annotations

import io
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from ..decode import random_windows
from ..decode.spec import IMAGENET_MEAN, IMAGENET_STD
from ..datasets import open_dataset
from ..reader import Dataset

DALI_LOADS = (0.65, 0.75, 0.9)  # hw_decoder_load values tried; the best is reported


def best_of(fn, repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


# ---------------------------------------------------------------- DALI

def dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401

        return True
    except Exception:
        return False


def is_jpeg(data) -> bool:
    return len(data) > 3 and data[0] == 0xFF and data[1] == 0xD8


def dali_op(name: str, images):
    """DALI's own op closest to recordtool.ops' `name` (bench --op), on uint8 HWC images after
    the resize: grayscale — fn.hsv with saturation 0 on a coin flip (p 0.2); cutout — fn.erase of
    a 56×56 square at a uniform anchor; jitter — fn.color_twist with brightness, contrast and
    saturation uniform in [0.6, 1.4] (DALI's contrast pivots on mid-grey, not the image mean)."""
    from nvidia.dali import fn, types

    if name == "grayscale":
        keep = fn.cast(fn.random.coin_flip(probability=0.8), dtype=types.FLOAT)
        return fn.hsv(images, saturation=keep)
    if name == "cutout":
        return fn.erase(images, anchor=fn.random.uniform(range=[0.0, 1.0], shape=[2]), shape=[56.0, 56.0],
                        axis_names="HW", normalized_anchor=True, normalized_shape=False, fill_value=0)
    if name == "jitter":
        return fn.color_twist(images, brightness=fn.random.uniform(range=[0.6, 1.4]),
                              contrast=fn.random.uniform(range=[0.6, 1.4]),
                              saturation=fn.random.uniform(range=[0.6, 1.4]))
    raise ValueError(f"no DALI op for {name!r}")


def dali_random_resized_crop(jpegs, gpu: bool, size: int, hw_decoder_load: float = 0.75, op: str | None = None):
    """DALI's stages of what our Loader makes, inside a pipeline definition: RandomResizedCrop
    decode (mixed on the GPU, with `hw_decoder_load` on its hardware decoder) → size² linear
    resize → the op's DALI counterpart (dali_op) → coin-flip mirror + mean/std normalise, CHW,
    fp16 on the GPU / float32 on the CPU. Shared by every DALI peer (bench, tune, train_bench)."""
    from nvidia.dali import fn, types

    kw = {"hw_decoder_load": hw_decoder_load} if gpu else {}
    images = fn.decoders.image_random_crop(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB,
                                           random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3],
                                           num_attempts=10, **kw)
    images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR)
    if op is not None:
        images = dali_op(op, images)
    return fn.crop_mirror_normalize(images, dtype=types.FLOAT16 if gpu else types.FLOAT, output_layout="CHW",
                                    mean=[m * 255 for m in IMAGENET_MEAN], std=[s * 255 for s in IMAGENET_STD],
                                    mirror=fn.random.coin_flip(probability=0.5))


def dali_rate(source, device: str, batch: int, threads: int, epochs: int = 2, hw_decoder_load: float = 0.75,
              size: int = 224, device_id: int = 0, seed: int = 0, op: str | None = None) -> dict:
    """DALI's RandomResizedCrop pipeline; img/s of the best timed epoch (the first warms up).

    Args:
        source: a `Dataset` (DALI decodes exactly our records' bytes, fed by external_source) or
            a list of (path, label) of JPEG files (fn.readers.file: DALI reads the files itself —
            "DALI on the original files"). DALI's decoder stops on a PNG named .JPEG: give files
            that start with the JPEG magic (see `jpeg_files`).
        device: "cuda" (decoders.image_random_crop device="mixed", fp16 output on the GPU) or "cpu"
            (everything on the CPU, device_id=None, float32 output).
        batch, threads: batch size and DALI's CPU threads (same as ours).
        epochs: epochs run, the first untimed.
        hw_decoder_load: share of images DALI gives its hardware decoder (cuda).
        size: output side.
        device_id: CUDA device.
        seed: DALI's seed.
        op: also run DALI's counterpart of this `recordtool bench --op` op after the resize (dali_op).
    """
    from nvidia.dali import fn, pipeline_def, types

    files = not isinstance(source, Dataset)
    n = len(source)
    steps = n // batch
    if steps == 0:
        raise ValueError(f"{n} images < one batch of {batch}")
    if not files:
        ds = source
        order = np.arange(steps * batch)
        labels = ds.index.label.astype(np.int32)

        def feed(info):
            j = info.iteration % steps
            ids = order[j * batch:(j + 1) * batch]
            return ([np.frombuffer(ds[int(i)][0], np.uint8) for i in ids],
                    [np.array([labels[i]], np.int32) for i in ids])

    gpu = device == "cuda"

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=device_id if gpu else None,
                  prefetch_queue_depth=2, seed=seed)
    def pipe():
        if files:
            jpegs, label = fn.readers.file(files=[p for p, _ in source], labels=[int(y) for _, y in source],
                                           random_shuffle=True, name="reader")
        else:
            jpegs, label = fn.external_source(source=feed, num_outputs=2, batch=True, batch_info=True,
                                              dtype=[types.UINT8, types.INT32])
        return dali_random_resized_crop(jpegs, gpu, size, hw_decoder_load, op), label

    p = pipe()
    p.build()
    rates = []
    for e in range(max(2, epochs)):
        t = time.perf_counter()
        for _ in range(steps):
            out = p.run()
        if gpu:
            out[0].as_tensor()  # the batch is complete
        dt = time.perf_counter() - t
        if e > 0:
            rates.append(steps * batch / dt)
    del p
    return {"img_s": max(rates), "epochs": rates, "hw_decoder_load": hw_decoder_load if gpu else None, "op": op,
            "images": steps * batch, "input": "files" if files else "recordtool records (external_source)"}


def dali_best(source, device: str, batch: int, threads: int, epochs: int = 2, device_id: int = 0,
              op: str | None = None) -> dict:
    """dali_rate at each of DALI_LOADS (cuda) or once (cpu); the best, with every try."""
    loads = DALI_LOADS if device == "cuda" else (None,)
    tries = []
    for load in loads:
        tries.append(dali_rate(source, device, batch, threads, epochs, load or 0.0, device_id=device_id, op=op))
    best = max(tries, key=lambda r: r["img_s"])
    return dict(best, tries=[{"hw_decoder_load": t["hw_decoder_load"], "img_s": t["img_s"]} for t in tries])


def jpeg_files(folder: str) -> list:
    """(path, label) of the JPEG files of an ImageNet-style folder, by their FF D8 magic (what
    DALI's decoders take), labels as ImageFolder gives them."""
    from ..sources.imagefolder import ImageFolderSource

    src = ImageFolderSource(folder)
    out = []
    for item in src.items:
        with open(item.path, "rb") as f:
            if is_jpeg(f.read(4)):
                out.append((item.path, item.label))
    return out


# ---------------------------------------------------------------- Pillow

_DS = None


def _init(path):
    global _DS
    _DS = open_dataset(path)


def _pil_rrc_chunk(args):
    """Baseline worker: Pillow decode → RandomResizedCrop window → resize (→ ToTensor-like float)."""
    from PIL import Image

    idx, win, to_tensor = args
    for i, (y, x, h, w) in zip(idx, win):
        im = Image.open(io.BytesIO(_DS[int(i)][0])).convert("RGB")
        im = im.crop((int(x), int(y), int(x + w), int(y + h))).resize((224, 224), Image.BILINEAR)
        if to_tensor:
            np.asarray(im, np.float32).transpose(2, 0, 1) / 255.0
    return len(idx)


def pil_rrc_rate(path, idx, win, procs: int, repeat: int = 1, to_tensor: bool = False) -> float:
    """The Pillow baseline in a pool of `procs` processes, img/s (workers started before timing)."""
    chunks = [(idx[s:s + 64], win[s:s + 64], to_tensor) for s in range(0, len(idx), 64)]
    with ProcessPoolExecutor(procs, initializer=_init, initargs=(path,)) as ex:
        list(ex.map(_pil_rrc_chunk, chunks[:procs]))
        return len(idx) / best_of(lambda: sum(ex.map(_pil_rrc_chunk, chunks)), repeat)


class _PilRecords:
    """torch Dataset for the baseline: record i → Pillow decode → window crop → resize → CHW float."""

    def __init__(self, path, order, win):
        self.path, self.order, self.win = path, order, win
        self.ds = None

    def __len__(self):
        return len(self.order)

    def __getitem__(self, k):
        import torch
        from PIL import Image

        if self.ds is None:  # opened in the worker process
            self.ds = open_dataset(self.path)
        data, label = self.ds[int(self.order[k])]
        y, x, h, w = (int(v) for v in self.win[k])
        im = Image.open(io.BytesIO(data)).convert("RGB")
        im = im.crop((x, y, x + w, y + h)).resize((224, 224), Image.BILINEAR)
        return torch.from_numpy(np.asarray(im, np.float32).transpose(2, 0, 1) / 255.0), label


def torch_dataloader_rate(path, order, win, batch_size, workers) -> float:
    """The Pillow baseline through a torch DataLoader (one worker process per thread)."""
    import torch

    dl = torch.utils.data.DataLoader(_PilRecords(path, order, win), batch_size=batch_size, num_workers=workers,
                                     persistent_workers=True, prefetch_factor=2)
    it = iter(dl)
    next(it)  # start the workers
    t = time.perf_counter()
    n = sum(x.shape[0] for x, _ in it)
    return n / (time.perf_counter() - t) if n else float("nan")


# ---------------------------------------------------------------- GPU decoders of torchvision, nvImageCodec

def _timed_batches(run, n, batch):
    """img/s of run(lo, hi) over [0, n) in batches, after one warm-up batch, GPU work included."""
    import torch

    run(0, batch)
    torch.cuda.synchronize()
    t = time.perf_counter()
    done = 0
    for s in range(0, n - batch + 1, batch):
        done += run(s, s + batch).shape[0]
    torch.cuda.synchronize()
    return done / (time.perf_counter() - t)


def torchvision_rate(ds, batch, n_max):
    import torch
    import torchvision
    from torchvision.io import decode_jpeg
    from torchvision.transforms.v2 import functional as F

    c = ds.index
    n = min(len(ds), n_max)
    mean = torch.tensor(IMAGENET_MEAN, device="cuda").view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device="cuda").view(3, 1, 1)
    skipped = 0

    def run(lo, hi):
        nonlocal skipped
        ids = np.arange(lo, hi)
        datas = [torch.frombuffer(bytearray(ds[int(i)][0]), dtype=torch.uint8) for i in ids]
        win = random_windows(c.width[ids], c.height[ids], ids, 0, 0)
        try:
            imgs = decode_jpeg(datas, device="cuda", mode=torchvision.io.ImageReadMode.RGB)
        except RuntimeError:  # e.g. "Unknown chroma subsampling" on grayscale: decode one by one
            imgs = []
            for d in datas:
                try:
                    imgs.append(decode_jpeg(d, device="cuda", mode=torchvision.io.ImageReadMode.RGB))
                except RuntimeError:
                    skipped += 1
                    imgs.append(None)
        out = []
        for im, (y, x, h, w) in zip(imgs, win):
            if im is None:
                continue
            r = F.resized_crop(im, int(y), int(x), int(h), int(w), [224, 224], antialias=True)
            out.append(((r.float() / 255 - mean) / std).half())
        return torch.stack(out)

    return _timed_batches(run, n, batch), skipped


def nvimgcodec_rate(ds, batch, n_max):
    import torch
    from nvidia import nvimgcodec
    from torchvision.transforms.v2 import functional as F

    c = ds.index
    n = min(len(ds), n_max)
    dec = nvimgcodec.Decoder()
    mean = torch.tensor(IMAGENET_MEAN, device="cuda").view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device="cuda").view(3, 1, 1)

    def run(lo, hi):
        ids = np.arange(lo, hi)
        imgs = dec.decode([bytes(ds[int(i)][0]) for i in ids])
        win = random_windows(c.width[ids], c.height[ids], ids, 0, 0)
        out = []
        for im, (y, x, h, w) in zip(imgs, win):
            if im is None:
                continue
            t = torch.as_tensor(im, device="cuda").permute(2, 0, 1)
            r = F.resized_crop(t, int(y), int(x), int(h), int(w), [224, 224], antialias=True)
            out.append(((r.float() / 255 - mean) / std).half())
        return torch.stack(out)

    return _timed_batches(run, n, batch)


def gpu_peers(ds, batch: int, n_max: int = 4096) -> dict:
    """torchvision's and nvImageCodec's GPU decoders on the same records: img/s, or why not run."""
    out = {}
    for name, fn in (("torchvision_gpu", torchvision_rate), ("nvimgcodec", nvimgcodec_rate)):
        try:
            out[name] = fn(ds, batch, n_max)
        except Exception as e:  # missing package or failing peer: reported, not fatal
            out[name] = f"{type(e).__name__}: {e}"
    return out

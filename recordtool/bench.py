"""`recordtool bench`: throughput per stage and end to end on the user's data, against a plain
Pillow baseline measured in the same run on the same cores."""
from __future__ import annotations

import io
import os
import resource
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from .decode import decode_crop_resize, random_windows
from .decode.ops import IMAGENET_MEAN, IMAGENET_STD
from .loader import Loader
from .reader import Dataset

_DS = None


def _init(path):
    global _DS
    _DS = Dataset(path)


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


def best_of(fn, repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


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
            self.ds = Dataset(self.path)
        data, label = self.ds[int(self.order[k])]
        y, x, h, w = (int(v) for v in self.win[k])
        im = Image.open(io.BytesIO(data)).convert("RGB")
        im = im.crop((x, y, x + w, y + h)).resize((224, 224), Image.BILINEAR)
        return torch.from_numpy(np.asarray(im, np.float32).transpose(2, 0, 1) / 255.0), label


def _torch_dataloader_baseline(path, order, win, batch_size, workers) -> float:
    import torch

    dl = torch.utils.data.DataLoader(_PilRecords(path, order, win), batch_size=batch_size, num_workers=workers,
                                     persistent_workers=True, prefetch_factor=2)
    it = iter(dl)
    next(it)  # start the workers
    t = time.perf_counter()
    n = sum(x.shape[0] for x, _ in it)
    return n / (time.perf_counter() - t) if n else float("nan")


def run(path: str, device: str = "cpu", batch_size: int = 256, threads: int | None = None, epochs: int = 2,
        images: int | None = None, seed: int = 0, progress: bool = True) -> dict:
    ds = Dataset(path)
    threads = threads or os.cpu_count() or 1
    order = ds.sampler(seed=seed).indices(0)
    if images:
        order = order[:images]
    n = len(order)
    r = {"path": path, "device": device, "records": n, "threads": threads, "batch_size": batch_size,
         "cores": os.cpu_count()}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=5, desc="bench", unit="stage")

    def step(name):
        if bar is not None:
            bar.set_postfix_str(name)
            bar.update(1)

    # 1. read only
    t = time.perf_counter()
    nbytes = sum(len(bytes(ds[int(i)][0])) for i in order)
    dt = time.perf_counter() - t
    r["read"] = {"records_s": n / dt, "mb_s": nbytes / dt / 1e6}
    step("read")

    # 2. decode + crop + resize alone
    ix = ds.index
    win = random_windows(ix.width[order], ix.height[order], order, seed, 0)
    bufs = [ds[int(i)][0] for i in order]
    if device == "cpu":
        out = np.empty((batch_size, 224, 224, 3), np.uint8)
        t = time.perf_counter()
        for s in range(0, n, batch_size):
            e = min(n, s + batch_size)
            decode_crop_resize(bufs[s:e], win[s:e], threads=threads, out=out[: e - s], on_error="skip")
        r["decode"] = {"img_s": n / (time.perf_counter() - t)}
    else:
        from .decode.gpu import GPUDecoder, route

        dec = GPUDecoder(max_batch=batch_size, dtype="uint8", layout="NHWC", cpu_threads=max(1, threads - 2))
        routes = route(ix.chroma, ix.progressive, ix.colorspace)
        dec.warmup(ix.jpeg_length, ix.width, ix.height, routes=routes)
        hw = routes[order]
        flips = np.zeros(n, bool)
        dec(bufs[:batch_size], win[:batch_size], flips[:batch_size], hw[:batch_size])
        t = time.perf_counter()
        for s in range(0, n, batch_size):
            e = min(n, s + batch_size)
            dec(bufs[s:e], win[s:e], flips[s:e], hw[s:e])
        r["decode"] = {"img_s": n / (time.perf_counter() - t), "split": dict(dec.last)}
        dec.close()
    step("decode")

    # 3. full loader, epochs, per-batch latency
    ld = Loader(ds, batch_size=batch_size, device=device, threads=threads, seed=seed, dtype="float16"
                if device == "cuda" else "float32")
    lat, done, dt = [], 0, 0.0
    for epoch in range(epochs):
        ld.set_epoch(epoch)
        t0 = last = time.perf_counter()
        count = 0
        for k, (x, _) in enumerate(ld):
            if device == "cuda":
                _sync(x)
            now = time.perf_counter()
            if epoch > 0 or epochs == 1:  # the first epoch warms up (threads, buffers, kernel build)
                lat.append(now - last)
            last = now
            count += x.shape[0]
            if images and (k + 1) * batch_size >= n:
                break
        if epoch > 0 or epochs == 1:
            done += count
            dt += time.perf_counter() - t0
    ld.close()
    lat = np.array(lat)
    r["loader"] = {"img_s": done / dt, "batches": int(len(lat)), "timed_epochs": max(1, epochs - 1),
                   "p50_ms": float(np.percentile(lat, 50) * 1e3),
                   "p99_ms": float(np.percentile(lat, 99) * 1e3)}
    if ld.last_split:
        r["loader"]["split"] = {k: v for k, v in ld.last_split.items() if k != "errors"}
    step("loader")

    # 4. baseline: Pillow + RandomResizedCrop + ToTensor through a torch DataLoader (a process
    #    pool when torch is absent), one worker per thread
    try:
        r["baseline_pil"] = {"img_s": _torch_dataloader_baseline(path, order, win, batch_size, threads),
                             "via": "torch DataLoader"}
    except ImportError:
        r["baseline_pil"] = {"img_s": pil_rrc_rate(path, order, win, threads, to_tensor=True), "via": "process pool"}
    step("baseline")
    if device == "cuda":
        r["peers"] = gpu_peers(ds, batch_size)
    r["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    r["loader_over_baseline"] = r["loader"]["img_s"] / r["baseline_pil"]["img_s"]
    step("done")
    if bar is not None:
        bar.close()
    return r


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


def torchvision_peer(ds, batch, n_max):
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


def nvimgcodec_peer(ds, batch, n_max):
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
    """The GPU peers that import here, each on the same records: img/s, or why it did not run."""
    out = {}
    for name, fn in (("torchvision_gpu", torchvision_peer), ("nvimgcodec", nvimgcodec_peer)):
        try:
            out[name] = fn(ds, batch, n_max)
        except Exception as e:  # missing package or failing peer: reported, not fatal
            out[name] = f"{type(e).__name__}: {e}"
    return out


def _sync(x):
    try:
        import torch

        if isinstance(x, torch.Tensor):
            torch.cuda.synchronize()
            return
    except ImportError:
        pass
    import cupy

    cupy.cuda.Device().synchronize()


def table(r: dict) -> str:
    base = r["baseline_pil"]["img_s"]
    rows = [
        ("read only", f"{r['read']['records_s']:,.0f} rec/s", f"{r['read']['mb_s']:,.0f} MB/s"),
        ("decode+crop+resize", f"{r['decode']['img_s']:,.0f} img/s", f"{r['decode']['img_s'] / base:.2f}x baseline"),
        ("full loader", f"{r['loader']['img_s']:,.0f} img/s", f"{r['loader_over_baseline']:.2f}x baseline"),
        ("  batch latency", f"p50 {r['loader']['p50_ms']:.1f} ms", f"p99 {r['loader']['p99_ms']:.1f} ms"),
        ("baseline: Pillow+RRC+ToTensor", f"{base:,.0f} img/s",
         f"{r['baseline_pil'].get('via', '')}, {r['threads']} processes"),
        ("peak RSS", f"{r['peak_rss_mb']:,.0f} MB", ""),
    ]
    for name, v in r.get("peers", {}).items():
        if isinstance(v, str):
            rows.append((f"peer: {name}", "not run", v[:60]))
        else:
            rate = v[0] if isinstance(v, tuple) else v
            rows.append((f"peer: {name}", f"{rate:,.0f} img/s", f"loader {r['loader']['img_s'] / rate:.2f}x"))
    if "split" in r["loader"]:
        s = r["loader"]["split"]
        rows.append(("CPU/GPU split", f"cpu {s['cpu']}/{s['n']}", f"share {s['cpu'] / max(1, s['n']):.2f}"))
    head = (f"recordtool bench {r['path']}: {r['records']} records, device {r['device']}, "
            f"{r['threads']} threads, batch {r['batch_size']}")
    return head + "\n" + "\n".join(f"  {a:<32} {b:>18}  {c}" for a, b, c in rows)


def plot(r: dict, path: str) -> None:
    """Stage throughputs side by side, as a PNG (Pillow only: no plotting dependency)."""
    from PIL import Image, ImageDraw

    bars = [("read (rec/s)", r["read"]["records_s"]), ("decode (img/s)", r["decode"]["img_s"]),
            ("loader (img/s)", r["loader"]["img_s"]), ("Pillow baseline", r["baseline_pil"]["img_s"])]
    W, H, pad = 720, 360, 40
    im = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(im)
    top = max(v for _, v in bars)
    bw = (W - 2 * pad) // len(bars)
    for k, (name, v) in enumerate(bars):
        x0 = pad + k * bw + 10
        h = int((H - 3 * pad) * np.log10(v + 1) / np.log10(top + 1))
        d.rectangle([x0, H - pad - h, x0 + bw - 20, H - pad], fill=(70, 110, 180) if k < 3 else (180, 120, 60))
        d.text((x0, H - pad + 5), name, fill="black")
        d.text((x0, H - pad - h - 14), f"{v:,.0f}", fill="black")
    d.text((pad, 10), f"recordtool bench: {r['records']} records, {r['device']}, {r['threads']} threads "
           "(log scale)", fill="black")
    im.save(path)

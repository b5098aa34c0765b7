"""End-to-end training throughput: one torchvision model trained with each input pipeline in
turn, in one process run — the number users see (`recordtool bench --train ARCH`).

Pipelines (same model, batch, output side, optimiser and threads):
  synthetic        one random batch reused: the GPU's (or CPU's) own ceiling
  recordtool       the `Loader` on the packed dataset, defaults (variants: `recordtool:split=gpu`)
  synthetic+recordtool  synthetic batches while the Loader runs beside on a thread, its batches
                   dropped: what the Loader's mere presence costs the training loop (a diagnostic)
  dali             NVIDIA DALI on the original files: readers.file → decoders.image_random_crop
                   (mixed) → resize → crop_mirror_normalize (fp16) → DALIGenericIterator
  torchvision      ImageFolder + RandomResizedCrop + DataLoader(threads workers)

Each pipeline is run `repeats` times, interleaved (all pipelines once, then again), so a drift
of the machine shows in every pipeline's spread instead of favouring one. A run: a fresh model
and optimiser, `warmup` untimed steps, then `steps` timed steps; img/s = images / wall time of
the timed steps (GPU work included: synchronised at both ends). "wait" is the host's time
blocked in the pipeline's `next()` per step — the training loop starved.

The CPU form (`device="cpu"`) replaces the model by a consumer that spends `consumer_ms` of CPU
per batch in Python (holding the GIL, as an eager training step's dispatch does), for machines
without a GPU.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

ARCH_SIZES = {"resnet50": 224, "resnet18": 176}
PIPELINES = ("synthetic", "recordtool", "synthetic+recordtool", "dali", "torchvision")


@dataclass
class Run:
    pipeline: str
    img_s: float
    wait_ms: float  # mean host wait per timed step
    steps: int
    error: str | None = None
    cores: dict = field(default_factory=dict)  # thread group → cores busy during the timed steps


def _threads_cpu() -> dict:
    """{native thread id: (group, CPU seconds)} of this process, from /proc (Linux; else {}).
    Python threads are grouped by their name without its number, others by their OS name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                st = f.read()
        except OSError:
            continue
        comm, rest = st[st.index("(") + 1:st.rindex(")")], st[st.rindex(")") + 2:].split()
        name = names.get(int(tid), "native:" + comm)
        group = name.rstrip("0123456789").rstrip("_-") or name
        out[int(tid)] = (group, (int(rest[11]) + int(rest[12])) / tick)
    return out


def _cores(before: dict, after: dict, seconds: float) -> dict:
    """Cores busy per thread group between two _threads_cpu() snapshots, busiest first."""
    groups: dict = {}
    for tid, (group, cpu) in after.items():
        groups[group] = groups.get(group, 0.0) + cpu - before.get(tid, (group, 0.0))[1]
    total = sum(groups.values())
    out = {g: round(c / seconds, 2) for g, c in sorted(groups.items(), key=lambda kv: -kv[1]) if c > 0}
    out["total"] = round(total / seconds, 2)
    return out


@dataclass
class Result:
    arch: str
    size: int
    batch: int
    device: str
    runs: list = field(default_factory=list)

    def by_pipeline(self) -> dict:
        out: dict = {}
        for r in self.runs:
            out.setdefault(r.pipeline, []).append(r)
        return out

    def summary(self) -> dict:
        """pipeline → {median, min, max, spread (max/min), wait_ms, vs_synthetic, vs_dali}."""
        rows = {}
        for name, runs in self.by_pipeline().items():
            rates = [r.img_s for r in runs if r.error is None]
            if not rates:
                rows[name] = {"error": runs[-1].error}
                continue
            rows[name] = {"median": statistics.median(rates), "min": min(rates), "max": max(rates),
                          "spread": max(rates) / min(rates), "runs": rates,
                          "wait_ms": statistics.median(r.wait_ms for r in runs if r.error is None)}
        for ref in ("synthetic", "dali"):
            base = rows.get(ref, {}).get("median")
            for row in rows.values():
                if base and "median" in row:
                    row["vs_" + ref] = row["median"] / base
        return rows


# ---------------------------------------------------------------- models and the training step

def _model(arch: str, device, compile_: bool):
    import torch
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(num_classes=1000).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    step_model = torch.compile(model) if compile_ else model
    return step_model, opt


def _train(batches, arch: str, steps: int, warmup: int, compile_: bool) -> tuple:
    """Train `arch` on cuda with bf16 autocast and channels_last on `batches` (an iterator of
    (x, y) on the GPU); returns (img/s, mean wait ms per timed step)."""
    import torch

    dev = torch.device("cuda", torch.cuda.current_device())
    model, opt = _model(arch, dev, compile_)
    seen, wait, t0, cpu0 = 0, 0.0, None, None
    for step in range(warmup + steps):
        if step == warmup:
            torch.cuda.synchronize()
            t0, cpu0 = time.perf_counter(), _threads_cpu()
            wait = 0.0
        tw = time.perf_counter()
        x, y = next(batches)
        wait += time.perf_counter() - tw
        x = x.to(dev, non_blocking=True)
        if not x.is_contiguous(memory_format=torch.channels_last):
            x = x.contiguous(memory_format=torch.channels_last)
        y = y.to(dev, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y.long() % 1000)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= warmup:
            seen += x.shape[0]
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return seen / dt, wait / steps * 1e3, _cores(cpu0, _threads_cpu(), dt)


def _consume_cpu(batches, steps: int, warmup: int, consumer_ms: float) -> tuple:
    """The CPU form: each batch costs the consumer `consumer_ms` of CPU in Python (GIL held)."""
    seen, wait, t0, cpu0 = 0, 0.0, None, None
    for step in range(warmup + steps):
        if step == warmup:
            t0, wait, cpu0 = time.perf_counter(), 0.0, _threads_cpu()
        tw = time.perf_counter()
        x, _ = next(batches)
        wait += time.perf_counter() - tw
        end = time.thread_time() + consumer_ms / 1e3
        k = 0
        while time.thread_time() < end:  # pure-Python work, like a training step's dispatch
            k += 1
        if step >= warmup:
            seen += len(x)
    dt = time.perf_counter() - t0
    return seen / dt, wait / steps * 1e3, _cores(cpu0, _threads_cpu(), dt)


# ---------------------------------------------------------------- pipelines (endless iterators)

def _forever(loader):
    epoch = 0
    while True:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def _synthetic(batch: int, size: int, device: str):
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
        x, y = x.cuda().half(), y.cuda()
    while True:
        yield x, y


def _loader(packed: str, batch: int, size: int, device: str, options: dict):
    from .loader import Loader

    kw = dict(batch_size=batch, size=size, device=device, dtype="float16" if device == "cuda" else "float32",
              as_torch=device == "cuda")
    kw.update(options)
    return Loader(packed, **kw)


class _Beside:
    """Takes one batch of a pipeline on a thread for each batch the training loop takes from
    `paced(...)` — the consumption a real run has — and drops it: the loop trains on synthetic
    data, so what changes is only the pipeline's cost to the process."""

    def __init__(self, it):
        self.it, self.stop, self.batches = it, threading.Event(), 0
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

    error = None

    def paced(self, batches):
        for b in batches:
            self.ticks.release()
            yield b

    def close(self):
        self.stop.set()
        self.thread.join(timeout=60)
        if self.error is not None:
            raise RuntimeError(f"the pipeline beside failed: {type(self.error).__name__}: {self.error}") from self.error


def _dali(files: str, batch: int, size: int, threads: int, hw_decoder_load: float, device: str):
    from nvidia.dali import fn, pipeline_def, types

    from .decode.ops import IMAGENET_MEAN, IMAGENET_STD
    from .peers import jpeg_files

    items = jpeg_files(files)
    gpu = device == "cuda"

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0 if gpu else None, prefetch_queue_depth=2,
                  seed=0)
    def pipe():
        jpegs, label = fn.readers.file(files=[p for p, _ in items], labels=[int(y) for _, y in items],
                                       random_shuffle=True, name="reader")
        kw = {"hw_decoder_load": hw_decoder_load} if gpu else {}
        images = fn.decoders.image_random_crop(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3],
                                               num_attempts=10, **kw)
        images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT16 if gpu else types.FLOAT, output_layout="CHW",
                                          mean=[m * 255 for m in IMAGENET_MEAN], std=[s * 255 for s in IMAGENET_STD],
                                          mirror=fn.random.coin_flip(probability=0.5))
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


def _torchvision(files: str, batch: int, size: int, threads: int):
    import torch
    from torchvision import datasets, transforms

    from .decode.ops import IMAGENET_MEAN, IMAGENET_STD

    tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    dl = torch.utils.data.DataLoader(datasets.ImageFolder(files, tf), batch_size=batch, shuffle=True,
                                     num_workers=threads, pin_memory=True, drop_last=True, persistent_workers=True,
                                     prefetch_factor=4)
    return _forever(dl)


def _options(spec: str) -> dict:
    """'recordtool:split=gpu,producers=2' → {'split': 'gpu', 'producers': 2}."""
    out = {}
    for kv in filter(None, spec.split(",")):
        k, _, v = kv.partition("=")
        try:
            out[k] = int(v)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = {"true": True, "false": False}.get(v.lower(), v)
    return out


# ---------------------------------------------------------------- the benchmark

def run(packed: str, files: str | None = None, arch: str = "resnet18", size: int | None = None, batch: int = 256,
        steps: int = 50, warmup: int = 15, repeats: int = 3, pipelines=("synthetic", "recordtool", "dali"),
        threads: int | None = None, device: str = "cuda", compile_: bool = False, consumer_ms: float = 60.0,
        dali_load: float = 0.75, log=print) -> Result:
    """Train with each pipeline `repeats` times, interleaved; see the module docstring.

    Args:
        packed: the recordtool dataset.
        files: the original ImageNet-style folder (DALI and torchvision read it); None skips them.
        arch: torchvision model name (resnet50, resnet18, …).
        size: output side (default: 224 for resnet50, 176 for resnet18, else 224).
        batch: images per step.
        steps, warmup: timed and untimed steps per run.
        repeats: runs per pipeline.
        pipelines: names from PIPELINES; "recordtool:k=v,…" is the Loader with those options.
        threads: CPU threads for every pipeline (DALI's num_threads, DataLoader workers; the
            Loader's default unless given as an option).
        device: "cuda" (train the model) or "cpu" (a consumer spending consumer_ms per batch).
        compile_: torch.compile the model.
        consumer_ms: the CPU form's work per batch.
        dali_load: DALI's hw_decoder_load.
        log: where each finished run is reported.
    """
    threads = threads or os.cpu_count()
    size = size or ARCH_SIZES.get(arch, 224)
    res = Result(arch if device == "cuda" else f"consumer {consumer_ms:g} ms", size, batch, device)
    for rep in range(repeats):
        for name in pipelines:
            base, _, spec = name.partition(":")
            it, beside, closer = None, None, None
            opts = _options(spec)
            # diagnostic pseudo-option: the interpreter's GIL switch interval during this run
            envs = {k[4:]: str(opts.pop(k)) for k in list(opts) if k.startswith("env.")}
            old_env = {k: os.environ.get(k) for k in envs}
            os.environ.update(envs)
            switch, old_switch = opts.pop("switch", None), sys.getswitchinterval()
            if switch is not None:
                sys.setswitchinterval(float(switch))
            try:
                if base == "synthetic":
                    it = _synthetic(batch, size, device)
                elif base == "recordtool":
                    ld = _loader(packed, batch, size, device, opts)
                    it, closer = _forever(ld), ld.close
                elif base == "synthetic+recordtool":
                    ld = _loader(packed, batch, size, device, opts)
                    beside = _Beside(_forever(ld))
                    it, closer = beside.paced(_synthetic(batch, size, device)), ld.close
                elif base == "dali":
                    if files is None:
                        raise ValueError("dali needs the original files (--files)")
                    it = _dali(files, batch, size, threads, dali_load, device)
                elif base == "torchvision":
                    if files is None:
                        raise ValueError("torchvision needs the original files (--files)")
                    it = _torchvision(files, batch, size, threads)
                else:
                    raise ValueError(f"unknown pipeline {name!r} (one of {', '.join(PIPELINES)})")
                if device == "cuda":
                    rate, wait, cores = _train(it, arch, steps, warmup, compile_)
                else:
                    rate, wait, cores = _consume_cpu(it, steps, warmup, consumer_ms)
                if beside is not None:
                    b, beside = beside, None
                    b.close()  # raises what failed beside
                    cores["beside_batches"] = b.batches
                r = Run(name, rate, wait, steps, cores=cores)
            except Exception as e:  # a peer that cannot run here is reported, not fatal
                r = Run(name, float("nan"), float("nan"), 0, f"{type(e).__name__}: {e}")
            finally:
                sys.setswitchinterval(old_switch)
                for k, v in old_env.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
                if beside is not None:
                    beside.close()
                if closer is not None:
                    closer()
                del it
                _release(device)
            res.runs.append(r)
            log(f"  run {rep + 1}/{repeats} {name:<28} " + (f"{r.img_s:9,.0f} img/s  wait {r.wait_ms:6.1f} ms/step"
                                                           f"  cores {r.cores}"
                                                           if r.error is None else f"failed: {r.error}"))
    return res


def _release(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def table(res: Result) -> str:
    lines = [f"training throughput: {res.arch} @{res.size}, batch {res.batch}, {res.device}; "
             f"img/s median of {len(res.by_pipeline().get('synthetic', res.runs[:1]))} run(s) (min–max)",
             f"{'pipeline':<30}{'img/s':>9}{'min–max':>19}{'max/min':>9}{'× synth':>9}{'× DALI':>8}{'wait ms':>9}"]
    for name, row in res.summary().items():
        if "error" in row:
            lines.append(f"{name:<30} failed: {row['error']}")
            continue
        lines.append(f"{name:<30}{row['median']:9,.0f}{row['min']:10,.0f}–{row['max']:<8,.0f}{row['spread']:9.2f}"
                     f"{row.get('vs_synthetic', float('nan')):9.2f}{row.get('vs_dali', float('nan')):8.2f}"
                     f"{row['wait_ms']:9.1f}")
    return "\n".join(lines)


def write_json(res: Result, path: str) -> None:
    with open(path, "w") as f:
        json.dump({"config": {k: v for k, v in asdict(res).items() if k != "runs"},
                   "runs": [asdict(r) for r in res.runs], "summary": res.summary(),
                   "commit": os.environ.get("RECORDTOOL_COMMIT")}, f, indent=1, default=float)


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packed")
    ap.add_argument("--files", help="original ImageNet-style folder (DALI, torchvision)")
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--size", type=int)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pipelines", default="synthetic,recordtool,dali")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--consumer-ms", type=float, default=60.0)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    res = run(a.packed, a.files, a.arch, a.size, a.batch, a.steps, a.warmup, a.repeats,
              [p for p in a.pipelines.split(";" if ";" in a.pipelines else ",") if p], a.threads, a.device,
              a.compile, a.consumer_ms)
    print(table(res))
    if a.json:
        write_json(res, a.json)


if __name__ == "__main__":
    main()

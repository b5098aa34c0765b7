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

A pipeline's options after ':' are the Loader's keywords, plus two for measurements:
`env.NAME=VALUE` sets an environment variable for that run (the loader's RECORDTOOL_GPU_*
switches) and `switch=SECONDS` the interpreter's GIL switch interval.

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

def _tiny(num_classes: int = 1000):
    """A small CNN ("tiny"): the DDP mode's model for CPU runs and tests, where torchvision's
    ResNets would take minutes a step on two cores."""
    import torch.nn as nn

    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                         nn.Linear(128, num_classes))


def _model(arch: str, device, compile_: bool, ddp: bool = False):
    import torch

    torch.manual_seed(0)
    if arch == "tiny":
        model = _tiny()
    else:
        import torchvision

        model = getattr(torchvision.models, arch)(num_classes=1000)
    model = model.to(device).to(memory_format=torch.channels_last)
    if ddp:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    step_model = torch.compile(model) if compile_ else model
    return step_model, opt


def _train(batches, arch: str, steps: int, warmup: int, compile_: bool, device: str = "cuda",
           ddp: bool = False) -> tuple:
    """Train `arch` with channels_last (bf16 autocast on cuda) on `batches` (an iterator of
    (x, y)); returns (img/s, mean wait ms per timed step, cores busy per thread group)."""
    import torch

    cuda = device == "cuda"
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model, opt = _model(arch, dev, compile_, ddp)
    seen, wait, t0, cpu0 = 0, 0.0, None, None
    for step in range(warmup + steps):
        if step == warmup:
            sync()
            t0, cpu0 = time.perf_counter(), _threads_cpu()
            wait = 0.0
        tw = time.perf_counter()
        x, y = next(batches)
        wait += time.perf_counter() - tw
        x = x.to(dev, non_blocking=True)
        if not x.is_contiguous(memory_format=torch.channels_last):
            x = x.contiguous(memory_format=torch.channels_last)
        y = y.to(dev, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = torch.nn.functional.cross_entropy(model(x), y.long() % 1000)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= warmup:
            seen += x.shape[0]
    sync()
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
    """One batch reused. device: "cuda", "cpu" (numpy, the consumer form) or "cpu_torch"."""
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
    from ..loader import Loader

    kw = dict(batch_size=batch, size=size, device=device, dtype="float16" if device == "cuda" else "float32",
              as_torch=device == "cuda")
    kw.update(options)
    return Loader(packed, **kw)


class _Beside:
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


def _dali(files: str, batch: int, size: int, threads: int, hw_decoder_load: float, device: str, shard: int = 0,
          shards: int = 1, device_id: int = 0):
    from nvidia.dali import fn, pipeline_def

    from .peers import dali_random_resized_crop, jpeg_files

    items = jpeg_files(files)
    gpu = device == "cuda"

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=device_id if gpu else None,
                  prefetch_queue_depth=2, seed=shard)
    def pipe():
        jpegs, label = fn.readers.file(files=[p for p, _ in items], labels=[int(y) for _, y in items],
                                       random_shuffle=True, name="reader", shard_id=shard, num_shards=shards)
        images = dali_random_resized_crop(jpegs, gpu, size, hw_decoder_load)
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

    from ..decode.spec import IMAGENET_MEAN, IMAGENET_STD

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


# ---------------------------------------------------------------- DDP: one rank per GPU (torchrun)

def digest(x) -> tuple:
    """Exact integer checksum of a batch's bits (on its device)."""
    import torch

    v = torch.as_tensor(x).contiguous()
    v = v.view(torch.int16 if v.element_size() == 2 else torch.int32).to(torch.int64).flatten()
    w = torch.arange(v.numel(), device=v.device, dtype=torch.int64) % 65521 + 1
    return int(v.sum().item()), int((v * w).sum().item())


def batches_of(loader, limit=None) -> list:
    """(ids, labels, digest) of each batch of a `with_ids` Loader's epoch (the first `limit`)."""
    import numpy as np
    import torch

    out = []
    for k, (x, y, ids) in enumerate(loader):
        out.append((np.asarray(ids).tolist(), torch.as_tensor(y).cpu().tolist(), digest(x)))
        if limit is not None and k + 1 >= limit:
            break
    return out


def cover(id_lists, n: int, pad: int) -> tuple:
    """(exact, ok, counts) for the sample ids every rank saw in one epoch: exact = each of the n
    samples once; ok = exact, or DistributedSampler-style padding of `pad` repeats with none
    missing; counts = how often each sample was seen."""
    import numpy as np

    union = np.concatenate([np.asarray(x, np.int64) for x in id_lists]) if id_lists else np.zeros(0, np.int64)
    counts = np.bincount(union, minlength=n)
    exact = bool((counts == 1).all())
    return exact, bool(exact or (pad > 0 and (counts >= 1).all() and counts.sum() == n + pad)), counts


def resume_matches(packed: str, epoch: int, **kw) -> tuple:
    """A Loader(packed, **kw) stopped a third into `epoch`, its state_dict loaded into a new
    Loader: (the batches equal an uninterrupted run's, batches in the epoch, batches before
    the stop). kw must include with_ids=True and a bit-identical split."""
    from ..loader import Loader

    def run(limit=None, state=None):
        ld = Loader(packed, **kw)
        ld.set_epoch(epoch)
        if state is not None:
            ld.load_state_dict(state)
        out = batches_of(ld, limit)
        st = ld.state_dict()
        ld.close()
        ld.batcher.close()
        return out, st

    ref, _ = run()
    k = max(1, len(ref) // 3)
    got, state = run(k)
    rest, _ = run(state=state)
    return got + rest == ref, len(ref), k


def ddp_run(packed: str, files: str | None, arch: str, size: int | None, batch: int, steps: int, warmup: int,
            repeats: int, pipelines, threads: int | None, device: str, pin: bool = True, log=print) -> dict:
    """The DDP form, in each process torchrun starts: the model wrapped in DistributedDataParallel,
    one rank per GPU (NCCL; gloo on CPU), each pinned to its share of the cores (`pin`), the
    Loader on its rank's share, DALI on its shard of the files. Every run's img/s and wait are
    gathered per rank; then two checks on the Loader: every sample once per epoch across ranks,
    and a mid-epoch resume on every rank equal to the uninterrupted run. Returns rank 0's
    report (other ranks: {})."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from ..loader import Loader

    cuda = device == "cuda"
    local = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    if pin and local_world > 1 and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        share = max(1, len(cpus) // local_world)
        os.sched_setaffinity(0, cpus[local * share:(local + 1) * share])
    if cuda:
        torch.cuda.set_device(local % torch.cuda.device_count())
        import cupy

        cupy.cuda.Device(local % torch.cuda.device_count()).use()
    backend = "nccl" if cuda and local_world <= torch.cuda.device_count() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    size = size or ARCH_SIZES.get(arch, 224)
    report: dict = {"world": world, "backend": backend, "device": device, "arch": arch, "size": size, "batch": batch,
                    "threads_per_rank": threads, "runs": []}
    for rep in range(repeats):
        for name in pipelines:
            base, _, spec = name.partition(":")
            it, ld, err = None, None, None
            try:
                if base == "synthetic":
                    it = _synthetic(batch, size, "cuda" if cuda else "cpu_torch")
                elif base == "recordtool":
                    ld = _loader(packed, batch, size, device, dict(_options(spec), as_torch=True))
                    it = _forever(ld)
                elif base == "dali":
                    if files is None:
                        raise ValueError("dali needs the original files (--files)")
                    it = _dali(files, batch, size, threads, 0.75, device, rank, world, local)
                else:
                    raise ValueError(f"unknown pipeline {name!r} in the DDP form (synthetic, recordtool, dali)")
                dist.barrier()
                rate, wait, cores = _train(it, arch, steps, warmup, False, device, ddp=True)
            except Exception as e:  # reported per rank, never a number
                rate, wait, cores, err = float("nan"), float("nan"), {}, f"{type(e).__name__}: {e}"
            finally:
                if ld is not None:
                    ld.close()
                    ld.batcher.close()
                del it
                _release(device)
            per_rank = [None] * world
            dist.all_gather_object(per_rank, {"img_s": rate, "wait_ms": wait, "cores": cores, "error": err})
            ok = [r for r in per_rank if r["error"] is None]
            row = {"pipeline": name, "repeat": rep, "ranks": per_rank,
                   "total_img_s": sum(r["img_s"] for r in ok) if len(ok) == world else float("nan")}
            report["runs"].append(row)
            if rank == 0:
                log(f"  run {rep + 1}/{repeats} {name:<24} total {row['total_img_s']:10,.0f} img/s; per rank "
                    + ", ".join(f"{r['img_s']:,.0f} (wait {r['wait_ms']:.1f} ms)" if r["error"] is None
                                else f"failed: {r['error']}" for r in per_rank))
    # every sample once per epoch across ranks, and a mid-epoch resume identical on every rank
    kw = dict(batch_size=batch, size=size, device=device, drop_last=False, with_ids=True, as_torch=True,
              dtype="float16" if cuda else "float32", split="gpu" if cuda else "auto")
    ld = Loader(packed, **kw)
    ids = np.concatenate([np.asarray(i) for _, _, i in ld]) if len(ld) else np.zeros(0, np.int64)
    n, pad = len(ld.ds), world * len(ld.sampler) - len(ld.ds)  # DistributedSampler-style padding
    ld.close()
    ld.batcher.close()
    gathered = [None] * world
    dist.all_gather_object(gathered, ids.tolist())
    covered = cover(gathered, n, pad)[1]
    flags = [None] * world
    dist.all_gather_object(flags, resume_matches(packed, 1, **kw)[0])
    report["every_sample_once"] = covered
    report["resume_identical"] = [bool(f) for f in flags]
    dist.barrier()
    dist.destroy_process_group()
    return report if rank == 0 else {}


def ddp_table(report: dict) -> str:
    lines = [f"DDP training throughput: {report['arch']} @{report['size']}, batch {report['batch']} per rank, "
             f"{report['world']} ranks ({report['device']}, {report['backend']}, {report['threads_per_rank']} "
             f"threads/rank)", f"{'pipeline':<26}{'total img/s':>13}{'per rank (median of runs)':>40}"]
    rows: dict = {}
    for r in report["runs"]:
        rows.setdefault(r["pipeline"], []).append(r)
    for name, runs in rows.items():
        totals = [r["total_img_s"] for r in runs if r["total_img_s"] == r["total_img_s"]]
        if not totals:
            err = next((x["error"] for r in runs for x in r["ranks"] if x["error"]), "failed")
            lines.append(f"{name:<26} failed: {err}")
            continue
        per = [statistics.median(r["ranks"][k]["img_s"] for r in runs) for k in range(report["world"])]
        waits = [statistics.median(r["ranks"][k]["wait_ms"] for r in runs) for k in range(report["world"])]
        lines.append(f"{name:<26}{statistics.median(totals):13,.0f}   "
                     + ", ".join(f"{p:,.0f} (wait {w:.1f} ms)" for p, w in zip(per, waits)))
    lines.append(f"every sample once per epoch across ranks: {report['every_sample_once']}; "
                 f"mid-epoch resume identical on every rank: {report['resume_identical']}")
    return "\n".join(lines)


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
    ap.add_argument("--ddp", action="store_true",
                    help="the DDP form, under torchrun: one rank per GPU, each pinned to its share of the cores")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="--ddp: leave the ranks' cores unpinned")
    a = ap.parse_args(argv)
    if a.ddp:
        report = ddp_run(a.packed, a.files, a.arch, a.size, a.batch, a.steps, a.warmup, a.repeats,
                         [p for p in a.pipelines.split(";") if p], a.threads, a.device, a.pin)
        if report:
            print(ddp_table(report))
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(dict(report, commit=os.environ.get("RECORDTOOL_COMMIT")), f, indent=1, default=float)
            if not (report["every_sample_once"] and all(report["resume_identical"])):
                sys.exit(1)
        return
    res = run(a.packed, a.files, a.arch, a.size, a.batch, a.steps, a.warmup, a.repeats,
              [p for p in a.pipelines.split(";" if ";" in a.pipelines else ",") if p], a.threads, a.device,
              a.compile, a.consumer_ms)
    print(table(res))
    if a.json:
        write_json(res, a.json)


if __name__ == "__main__":
    main()

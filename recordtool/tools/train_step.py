"""The training side of `recordtool bench --train` (train_bench.py, and train_ddp.py's DDP form):
the model, the timed training step and its CPU form, and the per-thread CPU accounting. Nothing
here knows which pipeline feeds it."""
from __future__ import annotations

import os
import threading
import time

ARCH_SIZES = {"resnet50": 224, "resnet18": 176}


def threads_cpu() -> dict:
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


def cores_busy(before: dict, after: dict, seconds: float) -> dict:
    """Cores busy per thread group between two threads_cpu() snapshots, busiest first."""
    groups: dict = {}
    for tid, (group, cpu) in after.items():
        groups[group] = groups.get(group, 0.0) + cpu - before.get(tid, (group, 0.0))[1]
    total = sum(groups.values())
    out = {g: round(c / seconds, 2) for g, c in sorted(groups.items(), key=lambda kv: -kv[1]) if c > 0}
    out["total"] = round(total / seconds, 2)
    return out


def tiny_model(num_classes: int = 1000):
    """A small CNN ("tiny"): the DDP mode's model for CPU runs and tests, where torchvision's
    ResNets would take minutes a step on two cores."""
    import torch.nn as nn

    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                         nn.Linear(128, num_classes))


def make_model(arch: str, device, compile_: bool, ddp: bool = False):
    import torch

    torch.manual_seed(0)
    if arch == "tiny":
        model = tiny_model()
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


def train_step(model, opt, x, y, cuda: bool = True) -> None:
    """One SGD step on (x, y): bf16 autocast on cuda, cross-entropy on labels mod 1000; queued,
    not waited for (the host runs ahead as an eager loop does)."""
    import torch

    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
        loss = torch.nn.functional.cross_entropy(model(x), y.long() % 1000)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def train(batches, arch: str, steps: int, warmup: int, compile_: bool, device: str = "cuda",
           ddp: bool = False) -> tuple:
    """Train `arch` with channels_last (bf16 autocast on cuda) on `batches` (an iterator of
    (x, y)); returns (img/s, mean wait ms per timed step, cores busy per thread group)."""
    import torch

    cuda = device == "cuda"
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model, opt = make_model(arch, dev, compile_, ddp)
    seen, wait, t0, cpu0 = 0, 0.0, None, None
    for step in range(warmup + steps):
        if step == warmup:
            sync()
            t0, cpu0 = time.perf_counter(), threads_cpu()
            wait = 0.0
        tw = time.perf_counter()
        x, y = next(batches)
        wait += time.perf_counter() - tw
        x = x.to(dev, non_blocking=True)
        if not x.is_contiguous(memory_format=torch.channels_last):
            x = x.contiguous(memory_format=torch.channels_last)
        y = y.to(dev, non_blocking=True)
        train_step(model, opt, x, y, cuda)
        if step >= warmup:
            seen += x.shape[0]
    sync()
    dt = time.perf_counter() - t0
    return seen / dt, wait / steps * 1e3, cores_busy(cpu0, threads_cpu(), dt)


def consume_cpu(batches, steps: int, warmup: int, consumer_ms: float) -> tuple:
    """The CPU form: each batch costs the consumer `consumer_ms` of CPU in Python (GIL held)."""
    seen, wait, t0, cpu0 = 0, 0.0, None, None
    for step in range(warmup + steps):
        if step == warmup:
            t0, wait, cpu0 = time.perf_counter(), 0.0, threads_cpu()
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
    return seen / dt, wait / steps * 1e3, cores_busy(cpu0, threads_cpu(), dt)


def release(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()

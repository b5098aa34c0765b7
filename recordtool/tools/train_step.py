"""The training side of `recordtool bench --train` (train_bench.py, and train_ddp.py's DDP form):
the model, the timed training step and its CPU form, and the per-thread CPU accounting. Nothing
here knows which pipeline feeds it."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

ARCH_SIZES = {"resnet50": 224, "resnet18": 176}


def stat_cpu_seconds(stat: str, tick: float) -> float:
    """User + system CPU seconds from a /proc/<pid>/stat or /proc/self/task/<tid>/stat line
    (fields 14 and 15; the command name, in parentheses, may hold spaces)."""
    rest = stat[stat.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / tick


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
        comm = st[st.index("(") + 1:st.rindex(")")]
        name = names.get(int(tid), "native:" + comm)
        group = name.rstrip("0123456789").rstrip("_-") or name
        out[int(tid)] = (group, stat_cpu_seconds(st, tick))
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


def process_cpu(foreign=frozenset()) -> float:
    """CPU seconds of this process — every thread, those already ended included — and of its live
    child processes (a DataLoader's workers) but the `foreign` ones: what "cores busy" divides by
    the wall time."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for pid in set(child_pids()) - foreign:
        try:
            with open(f"/proc/{pid}/stat") as f:
                total += stat_cpu_seconds(f.read(), tick)
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
    return total


def child_pids() -> list:
    """This process's live child processes, from /proc (Linux; else [])."""
    pids = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return pids
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids += [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            continue
    return pids


def process_affinity(foreign=frozenset()) -> list | None:
    """The union of the CPUs every thread of this process and of its child processes but the
    `foreign` ones (started before the measurement: not pinned, not the pipeline's) may run on
    (sorted; None where the system does not say): what a pinned run really ran on, including
    the threads and processes the pipeline started itself."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = set(os.sched_getaffinity(0))
    try:
        ids = [int(t) for t in os.listdir("/proc/self/task")] + sorted(set(child_pids()) - foreign)
    except OSError:
        ids = []
    for i in ids:
        try:
            cpus |= os.sched_getaffinity(i)
        except OSError:  # ended meanwhile
            continue
    return sorted(cpus)


def memory_mib() -> dict:
    """This process's resident set now, MiB: {"rss": VmRSS, "anon": RssAnon} ({} off
    Linux). Sampled during the timed steps: getrusage's maxrss is the peak of the whole process
    life, every earlier pipeline's. "anon" leaves out pages of mapped files: a Loader reads its
    shards through mmap, so every shard page it has touched counts in VmRSS while it stays
    mapped, though the page cache holds those pages anyway and the kernel takes them back under
    pressure; a pipeline that read()s its files holds the same pages in the page cache outside
    its RSS. RssShmem is left out too: it counts files on tmpfs (shards staged in /dev/shm) as
    well as shared memory. "anon" is the private memory the pipelines allocated, the figure to
    compare between them."""
    got = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key = line.partition(":")[0]
                if key in ("VmRSS", "RssAnon"):
                    got[key] = int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return {}
    out = {}
    if "VmRSS" in got:
        out["rss"] = got["VmRSS"]
    if "RssAnon" in got:
        out["anon"] = got["RssAnon"]
    return out


def gpu_used_mib(device: str) -> float | None:
    """Device memory this process holds (MiB): NVML's per-process figure through nvidia-smi; where
    it does not list this pid (no nvidia-smi, another pid namespace), the device's used memory
    (total − free) from the CUDA library already loaded (torch, else CuPy), which counts other
    processes on the GPU too. None in the CPU form or where neither answers."""
    if device != "cuda":
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        for line in out.splitlines():
            pid, _, mib = line.partition(",")
            if pid.strip() == str(os.getpid()):
                return float(mib)
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    try:  # only a library this process already uses: importing one here would make a CUDA context
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            free, total = torch.cuda.mem_get_info()
            return (total - free) / 2**20
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            free, total = cupy.cuda.runtime.memGetInfo()
            return (total - free) / 2**20
    except Exception:  # a measurement, never the reason a run fails
        pass
    return None


class Probe:
    """What a pipeline costs beside its img/s, over the timed steps: cores busy (the process's and
    its children's CPU seconds / wall), the device memory the process holds (read once the clock
    has stopped, the pipeline still running: nvidia-smi takes a while, and a pipeline that kept
    filling its queue meanwhile would start the timed steps ahead), the host's peak RSS and peak
    anonymous RSS (memory_mib, sampled on a thread every `every` s) and the CPUs the process's
    threads were allowed (process_affinity, at the end)."""

    def __init__(self, device: str, every: float = 0.05, foreign=frozenset()):
        self.device, self.every, self.foreign = device, every, foreign
        self.report: dict = {}

    def start(self) -> None:
        self.peak, self.stop_ev = memory_mib(), threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True, name="bench-probe")
        self.cpu0, self.t0 = process_cpu(self.foreign), time.perf_counter()
        self.thread.start()

    def _sample(self) -> None:
        while not self.stop_ev.wait(self.every):
            self._keep_peak()

    def _keep_peak(self) -> None:
        for key, v in memory_mib().items():
            self.peak[key] = max(v, self.peak.get(key, v))

    def stop(self) -> dict:
        wall, cpu = time.perf_counter() - self.t0, process_cpu(self.foreign) - self.cpu0
        self.stop_ev.set()
        self.thread.join()
        self._keep_peak()
        rss, anon = self.peak.get("rss"), self.peak.get("anon")
        gpu = gpu_used_mib(self.device)
        self.report = {"cores_busy": round(cpu / wall, 2) if wall > 0 else None,
                       "gpu_mib": round(gpu) if gpu is not None else None,
                       "rss_mib": round(rss) if rss is not None else None,
                       "anon_mib": round(anon) if anon is not None else None,
                       "affinity": process_affinity(self.foreign)}
        return self.report


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
           ddp: bool = False, probe: Probe | None = None) -> tuple:
    """Train `arch` with channels_last (bf16 autocast on cuda) on `batches` (an iterator of
    (x, y)); returns (img/s, mean wait ms per timed step, cores busy per thread group). A
    `probe` is started and stopped around the timed steps."""
    import torch

    cuda = device == "cuda"
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model, opt = make_model(arch, dev, compile_, ddp)
    seen, wait, t0, cpu0 = 0, 0.0, None, None
    for step in range(warmup + steps):
        if step == warmup:
            sync()
            if probe is not None:
                probe.start()
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
    cores = cores_busy(cpu0, threads_cpu(), dt)
    if probe is not None:
        probe.stop()
    return seen / dt, wait / steps * 1e3, cores


def consume_cpu(batches, steps: int, warmup: int, consumer_ms: float, probe: Probe | None = None) -> tuple:
    """The CPU form: each batch costs the consumer `consumer_ms` of CPU in Python (GIL held)."""
    seen, wait, t0, cpu0 = 0, 0.0, None, None
    for step in range(warmup + steps):
        if step == warmup:
            if probe is not None:
                probe.start()
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
    cores = cores_busy(cpu0, threads_cpu(), dt)
    if probe is not None:
        probe.stop()
    return seen / dt, wait / steps * 1e3, cores


def release(device: str) -> None:
    """Between two runs: what the last pipeline freed given back to the device and the host —
    torch's cache and CuPy's default pools (the Loader's buffers) — so that the next run's
    memory readings are its own."""
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            cupy.get_default_memory_pool().free_all_blocks()
            cupy.get_default_pinned_memory_pool().free_all_blocks()

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

A pipeline's options after ':' are the Loader's keywords, `op=NAME` a compiled user op by its
registry name (recordtool.ops.by_name) — `dali:op=NAME` runs DALI's counterpart of that op
(peers.dali_op: fn.color_twist for jitter), `synthetic:labels=pageable|pinned` copies the
synthetic labels up from the host each step (what host labels cost) — plus two for measurements,
each for that run only: `switch=SECONDS` the interpreter's GIL switch interval, and
`host_wait=auto|spin|yield|block` how every host thread waits for the GPU (decode.gpu.
set_host_wait_policy: CUDA's scheduling flags, process-wide, which the Loader never sets).

Each pipeline is run `repeats` times, interleaved (all pipelines once, then again), so a drift
of the machine shows in every pipeline's spread instead of favouring one. A run: a fresh model
and optimiser, `warmup` untimed steps, then `steps` timed steps; img/s = images / wall time of
the timed steps (GPU work included: synchronised at both ends). "wait" is the host's time
blocked in the pipeline's `next()` per step — the training loop starved.

The node's share: a GPU of a 4–8-GPU node gets 8–16 of the host's cores, shared with its training
loop. `cores=N` pins the whole process — every thread it has and, by inheritance, every thread and
DataLoader worker a pipeline starts — to the first N CPUs of its affinity for the measurement, and
`threads` follows N. DALI is run at each `hw_decoder_load` of `dali_load` (on cuda by default the
sweep 0.65/0.75/0.9/0.99, as a user would tune it), each its own pipeline `dali:load=0.99`, and the
ratio to DALI is against the best of them. Beside img/s each run reports the cores busy (the
process's and its children's CPU seconds / wall of the timed steps), the device memory the process
holds (the pipeline's share: minus what the synthetic pipeline's model and optimiser hold) and
the host's peak RSS and its anonymous part (without mapped files' pages: the Loader's mmapped
shards count in RSS, a peer's read() files do not), all during the timed steps (train_step.Probe).

The CPU form (`device="cpu"`) replaces the model by a consumer that spends `consumer_ms` of CPU
per batch in Python (holding the GIL, as an eager training step's dispatch does), for machines
without a GPU.

Modules: train_pipelines.py (the pipelines), train_step.py (the model, the step, the CPU
accounting), train_ddp.py (the DDP form, `--ddp`), train_report.py (the results: `Run`, `Result`,
`table`, `write_json`); this one runs the pipelines in turn (`run`, `main`).
"""
from __future__ import annotations

import contextlib
import json
import os
import sys

from .. import checks
from ..errors import ConfigError
from .train_pipelines import Beside, dali, endless, make_loader, parse_options, synthetic, torchvision_folder
from .train_report import Result, Run, best_dali, table, write_json  # noqa: F401  (the command's names)
from .train_step import ARCH_SIZES, Probe, child_pids, consume_cpu, release, train

PIPELINES = ("synthetic", "recordtool", "synthetic+recordtool", "dali", "torchvision")
# hw_decoder_load values DALI is tried at on cuda (MLPerf's submissions use 0.99); on the CPU the
# value means nothing and DALI runs once
DALI_LOADS = (0.65, 0.75, 0.9, 0.99)


def node_cpus(cores: int | None) -> list:
    """The first `cores` CPUs of this process's affinity (all of them for None), sorted: the
    node's share a run is pinned to. ConfigError naming --cores for 0, a non-integer or more
    than the process may use."""
    avail = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    if cores is None:
        return avail if avail is not None else list(range(os.cpu_count() or 1))
    n = checks.bounded_int("--cores", cores, 1)
    if avail is None:
        raise ConfigError("--cores: this system cannot pin a process to cores")
    if n > len(avail):
        raise ConfigError(f"--cores {n}: this process may use only {len(avail)} core(s)")
    return avail[:n]


@contextlib.contextmanager
def pinned(cpus: list):
    """Every thread of this process allowed only `cpus` for the block (threads and processes
    started meanwhile inherit it from their starter), each thread's own affinity restored after.
    sched_setaffinity(0) alone would pin the calling thread only."""
    if not hasattr(os, "sched_setaffinity"):
        yield
        return
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    old = {}
    for tid in tids:
        try:
            old[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
        except OSError:  # a thread that ended meanwhile
            continue
    try:
        yield
    finally:
        for tid, mask in old.items():
            try:
                os.sched_setaffinity(tid, mask)
            except OSError:
                continue


def dali_loads(value, device: str = "cuda") -> tuple:
    """DALI's hw_decoder_load values to run: a number, a sequence or '0.65,0.99' (each in 0..1);
    None: DALI_LOADS on cuda, none on the CPU (where the value means nothing). ConfigError
    naming --dali-load otherwise."""
    if value is None:
        return DALI_LOADS if device == "cuda" else ()
    if isinstance(value, str):
        try:
            value = [float(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise ConfigError(f"--dali-load: comma-separated numbers in 0..1 expected, not {value!r}") from None
    elif not isinstance(value, (list, tuple)):
        value = [value]
    if not value:
        raise ConfigError("--dali-load: no value given")
    return tuple(dict.fromkeys(checks.bounded_float("--dali-load", v, 0.0, 1.0) for v in value))


def with_loads(pipelines, loads: tuple) -> list:
    """Each DALI pipeline without its own `load=` once per load: 'dali' → 'dali:load=0.65', …;
    'dali:op=jitter' → 'dali:op=jitter,load=0.65', …; the others as they are."""
    out = []
    for name in pipelines:
        base, _, spec = name.partition(":")
        if base != "dali" or not loads or "load" in parse_options(spec):
            out.append(name)
        else:
            out += [f"dali:{spec + ',' if spec else ''}load={x:g}" for x in loads]
    return out


def require_gpu() -> None:
    """DeviceUnavailable unless torch can train on a GPU here (the cuda form trains a model with
    torch): checked once before the runs, so a machine without one gets one line."""
    from ..errors import DeviceUnavailable

    try:
        import torch
    except ImportError as e:
        raise DeviceUnavailable(f"--device cuda trains a torch model, and torch does not import here ({e}); "
                                "use --device cpu (the CPU form)") from None
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise DeviceUnavailable(f"--device cuda: torch {torch.__version__} ({build}) sees no GPU here; use "
                                "--device cpu (the CPU form: --consumer-ms of CPU work per batch instead of a model)")


def counted(it, taken: list):
    """`it`, counting the items taken in taken[0]."""
    for x in it:
        taken[0] += 1
        yield x


def run(packed: str, files: str | None = None, arch: str = "resnet18", size: int | None = None, batch: int = 256,
        steps: int = 50, warmup: int = 15, repeats: int = 3, pipelines=("synthetic", "recordtool", "dali"),
        threads: int | None = None, device: str = "cuda", compile_: bool = False, consumer_ms: float = 60.0,
        dali_load=None, log=print, cores: int | None = None) -> Result:
    """Train with each pipeline `repeats` times, interleaved; see the module docstring.

    Args:
        packed: the recordtool dataset.
        files: the original ImageNet-style folder (DALI and torchvision read it); None skips them.
        arch: torchvision model name (resnet50, resnet18, …).
        size: output side (default: 224 for resnet50, 176 for resnet18, else 224).
        batch: images per step.
        steps, warmup: timed and untimed steps per run.
        repeats: runs per pipeline.
        pipelines: names from PIPELINES; "recordtool:k=v,…" is the Loader with those options,
            "dali:load=X" DALI at that hw_decoder_load.
        threads: CPU threads for every pipeline (DALI's num_threads, DataLoader workers; the
            Loader's default unless given as an option); default: `cores`.
        device: "cuda" (train the model) or "cpu" (a consumer spending consumer_ms per batch).
        compile_: torch.compile the model.
        consumer_ms: the CPU form's work per batch.
        dali_load: DALI's hw_decoder_load, or several (each a pipeline of its own, see dali_loads;
            default: DALI_LOADS on cuda).
        log: where each finished run is reported.
        cores: pin the process to the first this many CPUs of its affinity while it measures
            (default: all of them); see node_cpus.
    """
    cpus = node_cpus(cores)
    pipelines = with_loads(pipelines, dali_loads(dali_load, device))
    threads = threads or len(cpus)
    size = size or ARCH_SIZES.get(arch, 224)
    res = Result(arch if device == "cuda" else f"consumer {consumer_ms:g} ms", size, batch, device, len(cpus), cpus,
                 threads)
    foreign = frozenset(child_pids())  # processes this one had started before: no pipeline's, never pinned
    with pinned(cpus) if cores is not None else contextlib.nullcontext():
        _runs(res, packed, files, arch, size, batch, steps, warmup, repeats, pipelines, threads, device, compile_,
              consumer_ms, log, foreign)
    return res


def _runs(res, packed, files, arch, size, batch, steps, warmup, repeats, pipelines, threads, device, compile_,
          consumer_ms, log, foreign=frozenset()) -> None:
    """run()'s runs, interleaved, appended to res.runs; `foreign`: child processes that are not
    the pipelines' (left out of their cores busy and affinity)."""
    for rep in range(repeats):
        for name in pipelines:
            base, _, spec = name.partition(":")
            it, beside, closer, ld, taken, probe = None, None, None, None, [0], Probe(device, foreign=foreign)
            opts = parse_options(spec)
            # diagnostic pseudo-options: the interpreter's GIL switch interval and how host threads
            # wait for the GPU during this run
            switch, old_switch = opts.pop("switch", None), sys.getswitchinterval()
            host_wait, waits_set = opts.pop("host_wait", None), None  # waits_set: the GPU whose policy was set
            if switch is not None:
                sys.setswitchinterval(float(switch))
            try:
                if host_wait is not None:
                    if device != "cuda":
                        raise ValueError("host_wait is a cuda pipeline's option")
                    import torch

                    from ..decode.gpu import set_host_wait_policy

                    set_host_wait_policy(torch.cuda.current_device(), str(host_wait))
                    waits_set = torch.cuda.current_device()
                if base == "synthetic":
                    it = synthetic(batch, size, device, **opts)  # labels=pageable|pinned: a diagnostic
                elif base == "recordtool":
                    ld = make_loader(packed, batch, size, device, opts)
                    it, closer = counted(endless(ld), taken), ld.close
                elif base == "synthetic+recordtool":
                    ld = make_loader(packed, batch, size, device, opts)
                    beside = Beside(endless(ld))
                    it, closer = beside.paced(synthetic(batch, size, device)), ld.close
                elif base == "dali":
                    if files is None:
                        raise ValueError("dali needs the original files (--files)")
                    load = checks.bounded_float("dali's load", opts.pop("load", 0.75), 0.0, 1.0)
                    it = dali(files, batch, size, threads, load, device, op=opts.pop("op", None))
                    if opts:
                        raise ValueError(f"dali takes only op=NAME and load=X, not {', '.join(opts)}")
                elif base == "torchvision":
                    if files is None:
                        raise ValueError("torchvision needs the original files (--files)")
                    it = torchvision_folder(files, batch, size, threads)
                else:
                    raise ValueError(f"unknown pipeline {name!r} (one of {', '.join(PIPELINES)})")
                if device == "cuda":
                    rate, wait, cores = train(it, arch, steps, warmup, compile_, probe=probe)
                else:
                    rate, wait, cores = consume_cpu(it, steps, warmup, consumer_ms, probe=probe)
                if ld is not None and taken[0]:  # where the producers' time per batch went (diagnostic)
                    cores["loader_stage_ms_per_batch"] = {k: round(1e3 * v / taken[0], 3)
                                                          for k, v in ld.stage_seconds.items()}
                    if ld.decoded:  # where the images were decoded (the split the Loader chose)
                        cores["decoded"] = dict(ld.decoded)
                        cores["ahead"] = ld.ahead  # of the CPU share, images decoded ahead (decode.gpu.ahead)
                        cores["split"] = split_state(ld)
                if beside is not None:
                    b, beside = beside, None
                    b.close()  # raises what failed beside
                    cores["beside_batches"] = b.batches
                r = Run(name, rate, wait, steps, cores=cores, **probe.report)
            except Exception as e:  # a peer that cannot run here is reported, not fatal
                r = Run(name, float("nan"), float("nan"), 0, f"{type(e).__name__}: {e}")
            finally:
                sys.setswitchinterval(old_switch)
                if beside is not None:
                    beside.close()
                if closer is not None:
                    closer()
                del it
                ld = closer = None  # the Loader freed before release() gives the pools back
                release(device)
                if waits_set is not None:  # CUDA's default again, as the library leaves it
                    from ..decode.gpu import set_host_wait_policy

                    set_host_wait_policy(waits_set, "auto")
            res.runs.append(r)
            log(f"  run {rep + 1}/{repeats} {name:<28} " + (f"{r.img_s:9,.0f} img/s  wait {r.wait_ms:6.1f} ms/step"
                                                           f"  cores busy {r.cores_busy}  GPU {r.gpu_mib} MiB"
                                                           f"  RSS {r.rss_mib} MiB (anon {r.anon_mib})  cores {r.cores}"
                                                           if r.error is None else f"failed: {r.error}"))


def split_state(ld) -> dict:
    """A cuda Loader's split after its last batch: the planner's balanced CPU share, its rates
    (img/s per producer) and the consumer-steered share of the second side (plan.Demand)."""
    r, demand = ld.last_split, getattr(ld.backend, "demand", None)
    out = {"balanced_cpu": round(r.cpu_fraction, 3), "gpu_rate": r.gpu_rate and round(r.gpu_rate),
           "cpu_rate": r.cpu_rate and round(r.cpu_rate)}
    if demand is not None:
        out.update(first=demand.first, allowed=round(demand.allowed, 3))
    return out



def main(argv=None) -> int | None:
    """The command line; returns the DDP form's exit code (None for the one-process form)."""
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
    ap.add_argument("--threads", type=int, help="CPU threads of each pipeline (default: --cores)")
    ap.add_argument("--cores", type=int,
                    help="pin the process to the first N cores of its affinity, a GPU's share of a node "
                         "(default: all it may use)")
    ap.add_argument("--dali-load", help="DALI's hw_decoder_load, comma-separated: each its own pipeline "
                                        f"(default on cuda: {','.join(map(str, DALI_LOADS))}; best is the reference)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--consumer-ms", type=float, default=60.0)
    ap.add_argument("--json")
    ap.add_argument("--ddp", action="store_true",
                    help="the DDP form, under torchrun: one rank per GPU, each pinned to its share of the cores")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="--ddp: leave the ranks' cores unpinned")
    a = ap.parse_args(argv)
    if a.ddp and (a.cores is not None or a.dali_load is not None):
        ap.error("--cores and --dali-load are the one-process form's (--ddp pins each rank to its share)")
    if a.ddp:
        from .train_ddp import ddp_run, ddp_table

        report = ddp_run(a.packed, a.files, a.arch, a.size, a.batch, a.steps, a.warmup, a.repeats,
                         [p for p in a.pipelines.split(";") if p], a.threads, a.device, a.pin)
        if report:
            print(ddp_table(report))
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(dict(report, commit=os.environ.get("RECORDTOOL_COMMIT")), f, indent=1, default=float)
            if not (report["every_sample_once"] and all(report["resume_identical"])):
                return 1
        return 0
    try:
        node_cpus(a.cores), dali_loads(a.dali_load, a.device)  # refused before any pipeline starts
    except ConfigError as e:
        ap.error(str(e))
    res = run(a.packed, a.files, a.arch, a.size, a.batch, a.steps, a.warmup, a.repeats,
              [p for p in a.pipelines.split(";" if ";" in a.pipelines else ",") if p], a.threads, a.device,
              a.compile, a.consumer_ms, a.dali_load, cores=a.cores)
    print(table(res))
    if a.json:
        write_json(res, a.json)
    if res.all_failed():
        raise SystemExit(res.all_failed())  # exit status 1, the line on stderr


if __name__ == "__main__":
    code = main()
    if code is not None:  # the DDP form's rank (train_ddp.end_rank says why it ends so)
        from .train_ddp import end_rank

        end_rank(code)

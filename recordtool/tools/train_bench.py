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
synthetic labels up from the host each step (what host labels cost) — plus two for measurements:
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

Modules: train_pipelines.py (the pipelines), train_step.py (the model, the step, the CPU
accounting), train_ddp.py (the DDP form, `--ddp`); this one runs the pipelines in turn and
reports (`run`, `table`, `write_json`, `main`).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass, field

from .train_pipelines import (Beside, dali, endless, make_loader, option_env, parse_options, synthetic,
                              torchvision_folder)
from .train_step import ARCH_SIZES, consume_cpu, release, train

PIPELINES = ("synthetic", "recordtool", "synthetic+recordtool", "dali", "torchvision")


@dataclass
class Run:
    pipeline: str
    img_s: float
    wait_ms: float  # mean host wait per timed step
    steps: int
    error: str | None = None
    cores: dict = field(default_factory=dict)  # thread group → cores busy during the timed steps


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


def counted(it, taken: list):
    """`it`, counting the items taken in taken[0]."""
    for x in it:
        taken[0] += 1
        yield x


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
            it, beside, closer, ld, taken = None, None, None, None, [0]
            opts = parse_options(spec)
            with option_env(opts):  # env.NAME=VALUE pseudo-options, set for this run
                # diagnostic pseudo-option: the interpreter's GIL switch interval during this run
                switch, old_switch = opts.pop("switch", None), sys.getswitchinterval()
                if switch is not None:
                    sys.setswitchinterval(float(switch))
                try:
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
                        it = dali(files, batch, size, threads, dali_load, device, op=opts.pop("op", None))
                        if opts:
                            raise ValueError(f"dali takes only op=NAME, not {', '.join(opts)}")
                    elif base == "torchvision":
                        if files is None:
                            raise ValueError("torchvision needs the original files (--files)")
                        it = torchvision_folder(files, batch, size, threads)
                    else:
                        raise ValueError(f"unknown pipeline {name!r} (one of {', '.join(PIPELINES)})")
                    if device == "cuda":
                        rate, wait, cores = train(it, arch, steps, warmup, compile_)
                    else:
                        rate, wait, cores = consume_cpu(it, steps, warmup, consumer_ms)
                    if ld is not None and taken[0]:  # where the producers' time per batch went (diagnostic)
                        cores["loader_stage_ms_per_batch"] = {k: round(1e3 * v / taken[0], 3)
                                                              for k, v in ld.stage_seconds.items()}
                        if ld.decoded:  # where the images were decoded (the split the Loader chose)
                            cores["decoded"] = dict(ld.decoded)
                            cores["split"] = split_state(ld)
                    if beside is not None:
                        b, beside = beside, None
                        b.close()  # raises what failed beside
                        cores["beside_batches"] = b.batches
                    r = Run(name, rate, wait, steps, cores=cores)
                except Exception as e:  # a peer that cannot run here is reported, not fatal
                    r = Run(name, float("nan"), float("nan"), 0, f"{type(e).__name__}: {e}")
                finally:
                    sys.setswitchinterval(old_switch)
                    if beside is not None:
                        beside.close()
                    if closer is not None:
                        closer()
                    del it
                    release(device)
            res.runs.append(r)
            log(f"  run {rep + 1}/{repeats} {name:<28} " + (f"{r.img_s:9,.0f} img/s  wait {r.wait_ms:6.1f} ms/step"
                                                           f"  cores {r.cores}"
                                                           if r.error is None else f"failed: {r.error}"))
    return res


def split_state(ld) -> dict:
    """A cuda Loader's split after its last batch: the planner's balanced CPU share, its rates
    (img/s per producer) and the consumer-steered share of the second side (plan.Demand)."""
    r, demand = ld.last_split, getattr(ld.batcher, "demand", None)
    out = {"balanced_cpu": round(r.cpu_fraction, 3), "gpu_rate": r.gpu_rate and round(r.gpu_rate),
           "cpu_rate": r.cpu_rate and round(r.cpu_rate)}
    if demand is not None:
        out.update(first=demand.first, allowed=round(demand.allowed, 3))
    return out


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
    res = run(a.packed, a.files, a.arch, a.size, a.batch, a.steps, a.warmup, a.repeats,
              [p for p in a.pipelines.split(";" if ";" in a.pipelines else ",") if p], a.threads, a.device,
              a.compile, a.consumer_ms)
    print(table(res))
    if a.json:
        write_json(res, a.json)


if __name__ == "__main__":
    code = main()
    if code is not None:  # the DDP form's rank (train_ddp.end_rank says why it ends so)
        from .train_ddp import end_rank

        end_rank(code)

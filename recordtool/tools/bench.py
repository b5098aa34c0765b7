"""`recordtool bench`: throughput per stage and end to end of the code users run — the `Loader`
— on the user's data, with DALI and a Pillow baseline measured in the same run on the same
images, batch and threads (recordtool.tools.peers)."""
from __future__ import annotations

import resource
import time

import numpy as np

from . import peers
from ..decode import decode_crop_resize, random_windows
from ..util import cores
from ..loader import Loader
from ..decode.device import parse_device, resolve
from .peers import best_of, pil_rrc_rate  # noqa: F401  (scripts import them from here)
from ..datasets import open_dataset


def share_world(records: int, images: int | None, batch_size: int) -> int:
    """The world size whose rank 0 share is about `images` of `records` (at least one batch):
    a benchmark on fewer images runs whole epochs of that share, since an epoch left early
    would start every epoch from idle producers."""
    return max(1, min(records // images, records // batch_size)) if images else 1


def loader_epochs(ld: Loader, epochs: int, images: int | None = None) -> dict:
    """Run `epochs` epochs of a Loader; rate of the timed ones (all after the first, which warms
    up threads, buffers and the kernel build) in images per wall second and per second of this
    process's CPU time, each epoch's too, batch latencies, CPU cores busy, stage seconds.

    Leaves no producer running (`ld.close()`): a continuous Loader's producers would otherwise go
    on into the next epoch — up to producers × (prefetch + 1) batches — while whatever is timed
    next (another Loader's round, the decode stage alone) runs, and be counted against that."""
    try:
        return _loader_epochs(ld, epochs, images)
    finally:
        ld.close()


def _loader_epochs(ld: Loader, epochs: int, images: int | None) -> dict:
    device = ld.device
    lat, rates, per_cpu, done, dt, cpu_s = [], [], [], 0, 0.0, 0.0
    limit = -(-images // ld.batch_size) if images else None
    for epoch in range(epochs):
        ld.set_epoch(epoch)
        timed = epoch > 0 or epochs == 1
        if timed and not rates:
            ld.stage_seconds.clear()
        t0 = last = time.perf_counter()
        c0 = time.process_time()
        count = 0
        for k, (x, _) in enumerate(ld):
            if device == "cuda":
                _sync(x)
            now = time.perf_counter()
            if timed:
                lat.append(now - last)
            last = now
            count += x.shape[0]
            if limit and k + 1 >= limit:
                break
        if timed:
            t, c = time.perf_counter() - t0, time.process_time() - c0
            done += count
            dt += t
            cpu_s += c
            rates.append(count / t)
            per_cpu.append(count / c if c > 0 else float("nan"))
    lat = np.array(lat) if lat else np.zeros(1)
    r = {"img_s": done / dt, "best_epoch_img_s": max(rates), "epochs_img_s": rates,
         "epochs_img_per_cpu_s": per_cpu, "batches": int(len(lat)),
         "timed_epochs": len(rates), "p50_ms": float(np.percentile(lat, 50) * 1e3),
         "p99_ms": float(np.percentile(lat, 99) * 1e3), "cores_busy": cpu_s / dt,
         "stage_ms_per_image": {k: 1e3 * v / max(done, 1) for k, v in ld.stage_seconds.items()},
         "ring_spills": ld.ring.spills}
    if ld.last_split is not None:
        r["split"] = ld.last_split.as_dict()
    return r


OPS = ("grayscale", "cutout", "jitter")  # recordtool.ops.registry's names of the ops bench --op measures


def bench_ops(name: str):
    """(compiled per-image op, the same op as a batch op) for `--op`: the op `recordtool.ops.by_name`
    gives (grayscale — RandomGrayscale(0.2), cutout — Cutout(56), jitter — ColorJitter(0.4, 0.4,
    0.4)); the batch op is the op's reference as array code on the whole batch (`ReferenceOp`: on
    the GPU for grayscale and cutout, through the host for jitter). (op_costs runs the compiled op
    checked first: `op.with_checks()`.)"""
    from .. import ops

    name = ops.registry.lookup(name).name
    if name not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, not {name!r}")
    op = ops.by_name(name)
    return op, ops.ReferenceOp(op)


def op_costs(plain: Loader, name: str, epochs: int, images: int | None = None) -> dict:
    """The Loader `plain` beside the same Loader with the op `name` compiled and as a batch op:
    after a warm-up epoch each, the timed epochs go round-robin over the three (none, compiled,
    batch), so a change in machine load hits all three alike; a cost per round (1 − rate with
    the op / rate without it, of that round) gives the spread.

    Before anything is timed, the compiled op runs one epoch compiled with Numba's bounds
    checks (`with_checks`): an op that indexes past its image stops the benchmark with an
    OpError naming it, instead of writing into the decoder's memory in the timed epochs. The
    timed op is the unchecked one (what training runs; the checks cost several times its speed)."""
    compiled, batch_op = bench_ops(name)
    ds, kw = plain.ds, dict(batch_size=plain.batch_size, device=plain.device, threads=plain.threads, seed=plain.seed,
                            producers=plain.producers, output=plain.output, rank=plain.rank,
                            world_size=plain.world_size)
    checked = Loader(ds, user_op=compiled.with_checks(), **kw)
    try:
        loader_epochs(checked, 1, images)
    finally:
        checked.close()
    loaders = {"none": plain, "compiled": Loader(ds, user_op=compiled, **kw), "batch": Loader(ds, user_op=batch_op, **kw)}
    try:
        for ld in loaders.values():
            loader_epochs(ld, 1, images)  # warm-up
        rounds = {k: [] for k in loaders}
        for _ in range(max(1, epochs - 1)):
            for k, ld in loaders.items():
                rounds[k].append(loader_epochs(ld, 1, images))
    finally:
        for k in ("compiled", "batch"):
            loaders[k].close()
    out: dict = {"name": name, "rounds": len(rounds["none"]), "checked_first": True}
    for k, rs in rounds.items():
        rates = [x["img_s"] for x in rs]
        cpu_ms = [1e3 * x["cores_busy"] / x["img_s"] for x in rs]
        out[k] = {"img_s": float(np.mean(rates)), "epochs_img_s": rates, "cpu_ms_per_image": cpu_ms,
                  "stage_ms_per_image": rs[-1]["stage_ms_per_image"]}
    out["fused_pass"] = fused_pass_cost(ds, compiled, plain.seed)
    for k in ("compiled", "batch"):
        cost = [1 - a / b for a, b in zip(out[k]["epochs_img_s"], out["none"]["epochs_img_s"])]
        cpu = [a / b - 1 for a, b in zip(out[k]["cpu_ms_per_image"], out["none"]["cpu_ms_per_image"])]
        out[k + "_cost"] = float(np.median(cost))
        out[k + "_cost_range"] = [float(min(cost)), float(max(cost))]
        out[k + "_cpu_cost"] = float(np.median(cpu))
    return out


def fused_pass_cost(ds, op, seed: int, n: int = 256, repeat: int = 3) -> dict:
    """CPU time per image of the fused decode pass the CPU Loader runs (decode → resize → op →
    mirror → normalize, `decode_crop_resize_normalize`) on one thread, with and without the
    compiled op, alternated `repeat` times (best of each): the thread's own CPU time, which
    other processes on the machine change much less than they change a rate."""
    from ..decode.cpu import apply_op, decode_crop_resize, decode_crop_resize_normalize
    from ..decode.spec import Output, TrainCrop
    from ..decode.recipe import Recipe

    ids = ds.sampler(seed=seed).indices(0)[:n]
    b = Recipe(ds, Output(224), seed, TrainCrop()).inputs(ids, 0)
    params = op.batch_params(len(ids), b.keys, 224, 224)
    out = np.empty((len(ids), 3, 224, 224), np.float32)
    best = {"none": float("inf"), "compiled": float("inf")}
    for _ in range(repeat):
        for key, native in (("none", None), ("compiled", op.native(params))):
            t = time.thread_time()
            decode_crop_resize_normalize(b.buffers, b.windows, b.flips, out=out, threads=1, pool=-1,
                                         on_error="skip", op=native)
            best[key] = min(best[key], time.thread_time() - t)
    raw = decode_crop_resize(b.buffers, b.windows, threads=1, pool=-1, on_error="skip")
    alone = float("inf")  # the op by itself on the decoded images: the same C function, one thread
    for _ in range(repeat + 2):
        img = raw.copy()
        t = time.thread_time()
        apply_op(img, op.native(params), threads=1, pool=-1)
        alone = min(alone, time.thread_time() - t)
    return {"images": len(ids), "none_ms_per_image": 1e3 * best["none"] / len(ids),
            "compiled_ms_per_image": 1e3 * best["compiled"] / len(ids), "cost": best["compiled"] / best["none"] - 1,
            "op_alone_ms_per_image": 1e3 * alone / len(ids)}


def run(path: str, device: str = "cpu", batch_size: int = 256, threads: int | None = None, epochs: int = 2,
        images: int | None = None, seed: int = 0, progress: bool = True, dali: bool = True,
        dali_files: str | None = None, baseline: bool = True, producers: int | None = None,
        op: str | None = None) -> dict:
    """Measure read, the decode stage alone, the full Loader, and the peers.

    Args:
        path: dataset directory.
        device: "cpu" or "cuda".
        batch_size: images per batch (all pipelines).
        threads: CPU threads (ours, DALI's, baseline processes); default: cores.
        epochs: Loader (and DALI) epochs; the first warms up, the rest are timed.
        images: use only this many records (default all); the Loader runs whole epochs of a
            share of about that many (rank 0 of len // images ranks).
        seed: loader seed.
        progress: tqdm bar over the stages.
        dali: run DALI when it imports (best of hw_decoder_load 0.65/0.75/0.9 on cuda).
        dali_files: also run DALI reading this ImageNet-style folder's JPEG files itself (the
            original files, e.g. before a transcoding pack).
        baseline: run the Pillow baseline.
        producers: Loader producer threads (default: the Loader's).
        op: also run the Loader with this op (OPS, or an alias recordtool.ops.by_name knows)
            compiled (recordtool.ops) and as a batch op,
            epochs interleaved with the Loader without it (op_costs), and DALI with its
            counterpart (peers.dali_op).
    """
    if device != "cpu":  # before any work: a GPU this process cannot use is named at once
        resolve(parse_device(device))
    if op:  # one name for the op, its DALI counterpart and the report
        from ..ops.registry import lookup

        op = lookup(op).name
    ds = open_dataset(path)
    threads = threads or cores()
    order = ds.sampler(seed=seed).indices(0)
    if images:
        order = order[:images]
    n = len(order)
    r = {"path": path, "device": device, "records": n, "threads": threads, "batch_size": batch_size,
         "cores": cores(), "mean_jpeg_kb": float(ds.index.jpeg_length[order].mean() / 1e3)}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=6, desc="bench", unit="stage")

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

    # 2. the full Loader (its backend also gives the decode stage alone, below). With fewer
    #    images than records, whole epochs of a share of them (rank 0 of len // images ranks):
    #    an epoch left early would start every epoch from idle producers
    world = share_world(len(ds), images, batch_size)
    ld = Loader(ds, batch_size=batch_size, device=device, threads=threads, seed=seed, producers=producers,
                dtype="float16" if device == "cuda" else "float32", rank=0, world_size=world)
    r["loader"] = loader_epochs(ld, epochs)
    r["loader"].update(producers=ld.producers, records_per_epoch=len(ld.sampler))
    if op:
        r["op"] = op_costs(ld, op, epochs)
    step("loader")

    # 3. the decode stage alone, on the same objects: CPU — the fused decode at all threads
    #    (uint8, no pipeline); cuda — one producer slot's GPUDecoder, batches back to back
    ix = ds.index
    win = random_windows(ix.width[order], ix.height[order], order, seed, 0)
    bufs = [ds[int(i)][0] for i in order]
    if device == "cpu":
        out = np.empty((batch_size, 224, 224, 3), np.uint8)

        def decode_all():
            for s in range(0, n, batch_size):
                e = min(n, s + batch_size)
                decode_crop_resize(bufs[s:e], win[s:e], threads=threads, out=out[: e - s], on_error="skip")

        decode_all()
        r["decode"] = {"img_s": n / best_of(decode_all, 2)}
    else:
        backend = ld.backend
        batches = [order[s:s + batch_size] for s in range(0, n - batch_size + 1, batch_size)]
        backend.make(batches[0], 0, 0)
        t = time.perf_counter()
        for b in batches:
            backend.make(b, 0, 0)  # the batch goes back to the ring as soon as it is dropped
        r["decode"] = {"img_s": len(batches) * batch_size / (time.perf_counter() - t),
                       "split": backend.decoder(0).last.as_dict()}
    ld.close()
    del ld
    step("decode")

    # 4. DALI, same images (our records' bytes), batch and threads; and on the original files
    if dali:
        if peers.dali_available():
            try:
                r["dali"] = peers.dali_best(ds, device, batch_size, threads, epochs)
            except Exception as e:  # a failing peer is reported, not fatal
                r["dali"] = {"error": f"{type(e).__name__}: {e}"}
            if op:
                try:
                    r["dali_op"] = peers.dali_best(ds, device, batch_size, threads, epochs, op=op)
                    if "img_s" in r["dali"]:
                        r["dali_op"]["cost"] = 1 - r["dali_op"]["img_s"] / r["dali"]["img_s"]
                except Exception as e:
                    r["dali_op"] = {"error": f"{type(e).__name__}: {e}"}
            if dali_files:
                try:
                    r["dali_files"] = peers.dali_best(peers.jpeg_files(dali_files), device, batch_size, threads,
                                                      epochs)
                except Exception as e:
                    r["dali_files"] = {"error": f"{type(e).__name__}: {e}"}
        else:
            r["dali"] = {"error": "nvidia.dali does not import (pip install nvidia-dali-cuda130)"}
    step("dali")

    # 5. baseline: Pillow + RandomResizedCrop + ToTensor through a torch DataLoader (a process
    #    pool when torch is absent), one worker per thread
    if baseline:
        try:
            r["baseline_pil"] = {"img_s": peers.torch_dataloader_rate(path, order, win, batch_size, threads),
                                 "via": "torch DataLoader"}
        except ImportError:
            r["baseline_pil"] = {"img_s": pil_rrc_rate(path, order, win, threads, to_tensor=True),
                                 "via": "process pool"}
    step("baseline")
    if device == "cuda":
        r["peers"] = peers.gpu_peers(ds, batch_size)
    r["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ours = r["loader"]["img_s"]
    if "img_s" in r.get("dali", {}):
        r["loader_over_dali"] = ours / r["dali"]["img_s"]
    if "img_s" in r.get("dali_files", {}):
        r["loader_over_dali_files"] = ours / r["dali_files"]["img_s"]
    if device == "cpu":
        r["loader_over_decode_stage"] = ours / r["decode"]["img_s"]
    if baseline:
        r["loader_over_baseline"] = ours / r["baseline_pil"]["img_s"]
    step("done")
    if bar is not None:
        bar.close()
    return r


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
    ours = r["loader"]["img_s"]
    rows = [("read only", f"{r['read']['records_s']:,.0f} rec/s", f"{r['read']['mb_s']:,.0f} MB/s")]
    for key, name in (("dali", "DALI (same records)"), ("dali_files", "DALI (original files)")):
        d = r.get(key)
        if d is None:
            continue
        if "img_s" in d:
            load = f", hw_decoder_load {d['hw_decoder_load']}" if d.get("hw_decoder_load") is not None else ""
            rows.append((name, f"{d['img_s']:,.0f} img/s", f"loader {ours / d['img_s']:.2f}x{load}"))
        else:
            rows.append((name, "not run", d["error"][:70]))
    rows += [
        ("recordtool Loader", f"{ours:,.0f} img/s",
         f"best epoch {r['loader']['best_epoch_img_s']:,.0f}; {r['loader']['producers']} producers, "
         f"{r['loader']['cores_busy']:.1f} cores busy"),
        ("  batch latency", f"p50 {r['loader']['p50_ms']:.1f} ms", f"p99 {r['loader']['p99_ms']:.1f} ms"),
        ("decode stage alone", f"{r['decode']['img_s']:,.0f} img/s",
         f"loader = {100 * ours / r['decode']['img_s']:.0f} % of it"),
    ]
    if "op" in r:
        o = r["op"]
        for key, what in (("compiled", "compiled per-image op"), ("batch", "batch op")):
            lo, hi = o[key + "_cost_range"]
            rows.append((f"  + {o['name']}: {what}", f"{o[key]['img_s']:,.0f} img/s",
                         f"costs {100 * o[key + '_cost']:.1f} % of the rate without it (rounds {100 * lo:.1f}.."
                         f"{100 * hi:.1f} %; CPU time per image +{100 * o[key + '_cpu_cost']:.1f} %)"))
        f = o["fused_pass"]
        rows.append(("  fused pass, 1 thread (CPU time)", f"{f['none_ms_per_image']:.3f} ms/img",
                     f"with the compiled op {f['compiled_ms_per_image']:.3f} ms/img: +{100 * f['cost']:.1f} %; "
                     f"the op alone {f['op_alone_ms_per_image']:.4f} ms/img"))
        d = r.get("dali_op", {})
        if "img_s" in d:
            cost = f"costs {100 * d['cost']:.1f} % of DALI's rate" if "cost" in d else ""
            rows.append((f"  DALI + {o['name']} (its own op)", f"{d['img_s']:,.0f} img/s", cost))
        elif d:
            rows.append((f"  DALI + {o['name']}", "not run", d["error"][:70]))
    stages = r["loader"].get("stage_ms_per_image", {})
    if stages:
        rows.append(("  producer ms/image", " ".join(f"{k} {v:.3f}" for k, v in stages.items()), ""))
    if "baseline_pil" in r:
        b = r["baseline_pil"]
        rows.append(("Pillow+RRC+ToTensor baseline", f"{b['img_s']:,.0f} img/s",
                     f"loader {ours / b['img_s']:.2f}x ({b.get('via', '')}, {r['threads']} processes)"))
    for name, v in r.get("peers", {}).items():
        if isinstance(v, str):
            rows.append((f"peer: {name}", "not run", v[:60]))
        else:
            rate = v[0] if isinstance(v, tuple) else v
            rows.append((f"peer: {name}", f"{rate:,.0f} img/s", f"loader {ours / rate:.2f}x"))
    if "split" in r["loader"]:
        s = r["loader"]["split"]
        rows.append(("CPU/GPU split (last batch)", f"cpu {s['cpu']}/{s['n']}",
                     f"engines {s['gpu']}, hybrid {s['hybrid']}, share {s['cpu_fraction']:.2f}"))
    rows.append(("peak RSS", f"{r['peak_rss_mb']:,.0f} MB", f"ring spills {r['loader']['ring_spills']}"))
    head = (f"recordtool bench {r['path']}: {r['records']} records ({r['mean_jpeg_kb']:.0f} KB mean), device "
            f"{r['device']}, {r['threads']} threads, batch {r['batch_size']}")
    return head + "\n" + "\n".join(f"  {a:<30} {b:>18}  {c}" for a, b, c in rows)


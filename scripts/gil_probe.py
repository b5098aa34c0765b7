"""How much a training loop's Python costs its input pipeline: the Loader and DALI on the same
data, each consumed by a loop that takes a batch, then runs `busy_ms` of pure Python holding
the GIL (as an eager training step's Python does between its kernel launches) — against the
same loop without that work.

A producer thread that gives the GIL up (in a native call, a CUDA call, a NumPy operation on a
large array) and wants it back while the consumer runs Python gets it at the latest after the
interpreter's switch interval (`sys.getswitchinterval()`, 5 ms by default). A pipeline whose
batch needs k GIL re-acquisitions then makes a batch up to k × interval slower. The consumer's
Python per batch bounds the rate at batch / busy_ms (the "ideal" column); the probe reports
each pipeline's rate alone, with the busy consumer at the default switch interval and at a
tenth of it, and from the first two an estimate of k:

    k ≈ (seconds per batch per producer with the busy consumer − alone) / switch interval

    python scripts/gil_probe.py PACKED --device cuda --busy-ms 10 --files FOLDER --json OUT.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # after PYTHONPATH: a tree on it (an older build) is what runs

import recordtool  # noqa: E402
from recordtool import Loader  # noqa: E402
from recordtool.tools import peers  # noqa: E402
from recordtool.tools.bench import loader_epochs, share_world  # noqa: E402
from recordtool.tools.train_pipelines import parse_options  # noqa: E402


def spin(ms: float) -> None:
    """Run pure Python for `ms` milliseconds (the GIL is given up only when the interpreter
    forces a switch)."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        x = 0
        for i in range(200):
            x += i


def run(packed: str, device: str, batch: int, epochs: int, images: int | None, busy_ms: float, dali: bool,
        variants=(), files: str | None = None) -> dict:
    """Each pipeline alone, with the busy consumer, and with it at a tenth of the switch interval.

    Args:
        variants: Loader keyword sets ('split=gpu,hybrid=false'), each one more pipeline.
        files: the original JPEG folder: DALI reads it with fn.readers.file (no Python in its
            pipeline, as in training); without it DALI is fed our records by a Python external_source.
    """
    ds = recordtool.open(packed)
    default = sys.getswitchinterval()
    out: dict = {"device": device, "batch": batch, "busy_ms": busy_ms, "interval_s": default, "records": len(ds),
                 "pipelines": [], "ideal_img_s": batch / (busy_ms / 1e3) if busy_ms else None}
    loaders = {}
    for spec in ("",) + tuple(variants):  # fewer images: whole epochs of a share of the records
        loaders["recordtool" + (":" + spec if spec else "")] = Loader(
            ds, batch_size=batch, device=device, dtype="float16" if device == "cuda" else "float32", as_torch=False,
            rank=0, world_size=share_world(len(ds), images, batch), **parse_options(spec))
    pipes = {name: ((lambda ms, ld=ld: loader_epochs(ld, epochs, consume=(lambda _: spin(ms)) if ms else None)
                     ["img_s"]), ld.producers) for name, ld in loaders.items()}
    if dali and peers.dali_available():
        threads = loaders["recordtool"].threads
        source = peers.jpeg_files(files) if files else ds
        pipes["dali" + (" (files)" if files else " (records, Python feed)")] = (
            lambda ms: peers.dali_rate(source, device, batch, threads, epochs,
                                       consume=(lambda _: spin(ms)) if ms else None)["img_s"], 1)
    out["producers"] = loaders["recordtool"].producers
    cases = (("alone", 0.0, default), ("busy", busy_ms, default), ("busy_fast_switch", busy_ms, default / 10))
    try:
        for name, (fn, workers) in pipes.items():
            row = {}
            for case, ms, interval in cases:
                sys.setswitchinterval(interval)
                try:
                    row[case] = fn(ms)
                except Exception as e:  # a peer that cannot run here is reported
                    row[case + "_error"] = f"{type(e).__name__}: {e}"
                finally:
                    sys.setswitchinterval(default)
            if "alone" in row and "busy" in row:
                ideal = min(row["alone"], out["ideal_img_s"] or float("inf"))
                row["of_ideal"] = row["busy"] / ideal
                # time per batch beyond what the slower of pipeline and consumer sets, per producer
                extra = workers * batch * (1 / row["busy"] - 1 / ideal)
                row["gil_waits_per_batch"] = max(0.0, extra / default)
            out[name] = row
            out["pipelines"].append(name)
    finally:
        for ld in loaders.values():
            ld.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("packed")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--images", type=int, default=None)
    ap.add_argument("--busy-ms", type=float, default=10.0, help="the consumer's pure Python per batch")
    ap.add_argument("--no-dali", action="store_true")
    ap.add_argument("--files", help="the original JPEG folder, for DALI's fn.readers.file")
    ap.add_argument("--variant", action="append", default=[], help="Loader keywords, e.g. split=gpu (repeatable)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    r = run(a.packed, a.device, a.batch, a.epochs, a.images, a.busy_ms, not a.no_dali, a.variant, a.files)
    ideal = r["ideal_img_s"]
    print(f"GIL probe: {r['device']}, batch {r['batch']}, consumer's Python {r['busy_ms']:g} ms/batch "
          f"(alone it would take {ideal or float('inf'):,.0f} img/s), switch interval {1e3 * r['interval_s']:g} ms, "
          f"recordtool producers {r['producers']}")
    print(f"{'pipeline':28}{'alone':>10}{'busy':>10}{'fast switch':>13}{'of ideal':>10}{'GIL waits/batch':>17}")
    for name in r["pipelines"]:
        row = r[name]
        cells = "".join(f"{row[c]:10,.0f}" if c in row else f"{'err':>10}" for c in ("alone", "busy"))
        fast = f"{row['busy_fast_switch']:13,.0f}" if "busy_fast_switch" in row else f"{'err':>13}"
        ratio = f"{row['of_ideal']:10.2f}" if "of_ideal" in row else f"{'':>10}"
        k = f"{row['gil_waits_per_batch']:17.1f}" if "gil_waits_per_batch" in row else ""
        print(f"{name:28}{cells}{fast}{ratio}{k}")
        for key, v in row.items():
            if key.endswith("_error"):
                print(f"  {name} {key}: {v[:200]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

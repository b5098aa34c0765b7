"""How much a busy Python thread — what a training loop's thread is — slows an input pipeline
that needs the GIL: the Loader and DALI on the same records, alone and beside such a thread.

A thread that wants the GIL while another runs Python gets it at the latest after the
interpreter's switch interval (`sys.getswitchinterval()`, 5 ms by default); a pipeline whose
batch needs k GIL acquisitions on a producer then takes up to k × interval longer per batch.
The probe reports each pipeline's rate alone, beside the busy thread at the default switch
interval and at a tenth of it, and from the two an estimate of k per batch:

    k ≈ (seconds per batch per producer beside − alone) / switch interval

The busy thread runs `spin` (pure Python: it gives the GIL up only when forced) or `dispatch`
(a loop of short calls that release and retake the GIL, as eager PyTorch's op dispatch does).

    python scripts/gil_probe.py PACKED --device cuda --busy spin --json OUT.json
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import recordtool  # noqa: E402
from recordtool import Loader  # noqa: E402
from recordtool.tools import peers  # noqa: E402
from recordtool.tools.bench import loader_epochs  # noqa: E402
from recordtool.tools.train_pipelines import parse_options  # noqa: E402


class Busy:
    """A thread running Python until stopped (see the module's docstring for the kinds)."""

    def __init__(self, kind: str):
        self.kind, self.stop, self.loops = kind, threading.Event(), 0
        libc = ctypes.CDLL(None)
        self._call = libc.getpid  # a ctypes CDLL call: releases and retakes the GIL
        self.thread = threading.Thread(target=self._run, daemon=True, name="gil-probe-busy")

    def _run(self):
        n, call, stop = 0, self._call, self.stop
        while not stop.is_set():
            if self.kind == "dispatch":
                for _ in range(100):
                    call()
            else:
                x = 0
                for i in range(2000):
                    x += i
            n += 1
        self.loops = n

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def run(packed: str, device: str, batch: int, epochs: int, images: int | None, busy: str, dali: bool,
        variants=(), files: str | None = None) -> dict:
    """Each pipeline alone, beside the busy thread, and beside it at a tenth of the switch
    interval. variants: Loader keyword sets ('split=gpu,hybrid=false'), each a pipeline.
    files: the original JPEG folder: DALI reads it with fn.readers.file (no Python in its
    pipeline, as in training); without it DALI is fed our records by a Python external_source."""
    ds = recordtool.open(packed)
    out: dict = {"device": device, "batch": batch, "busy": busy, "interval_s": sys.getswitchinterval(),
                 "records": len(ds), "pipelines": []}
    loaders = {}
    for spec in ("",) + tuple(variants):
        loaders["recordtool" + (":" + spec if spec else "")] = Loader(
            ds, batch_size=batch, device=device, dtype="float16" if device == "cuda" else "float32", as_torch=False,
            **parse_options(spec))
    default = sys.getswitchinterval()
    cases = (("alone", None, default), ("beside", busy, default), ("beside_fast_switch", busy, default / 10))
    pipes = {name: (lambda ld=ld: loader_epochs(ld, epochs, images)["img_s"], ld.producers)
             for name, ld in loaders.items()}
    if dali and peers.dali_available():
        threads = loaders["recordtool"].threads
        source = peers.jpeg_files(files) if files else ds
        pipes["dali" + (" (files)" if files else " (records, Python feed)")] = (
            lambda: peers.dali_rate(source, device, batch, threads, epochs)["img_s"], 1)
    out["producers"] = loaders["recordtool"].producers
    try:
        for name, (fn, workers) in pipes.items():
            row = {}
            for case, kind, interval in cases:
                sys.setswitchinterval(interval)
                try:
                    if kind is None:
                        row[case] = fn()
                    else:
                        with Busy(kind):
                            row[case] = fn()
                except Exception as e:  # a peer that cannot run here is reported
                    row[case + "_error"] = f"{type(e).__name__}: {e}"
                finally:
                    sys.setswitchinterval(default)
            if "alone" in row and "beside" in row:
                extra = workers * batch * (1 / row["beside"] - 1 / row["alone"])  # s per batch per worker
                row["ratio_beside"] = row["beside"] / row["alone"]
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
    ap.add_argument("--busy", default="spin", choices=("spin", "dispatch"))
    ap.add_argument("--no-dali", action="store_true")
    ap.add_argument("--files", help="the original JPEG folder, for DALI's fn.readers.file")
    ap.add_argument("--variant", action="append", default=[], help="Loader keywords, e.g. split=gpu (repeatable)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    r = run(a.packed, a.device, a.batch, a.epochs, a.images, a.busy, not a.no_dali, a.variant, a.files)
    print(f"GIL probe: {r['device']}, batch {r['batch']}, busy thread '{r['busy']}', switch interval "
          f"{1e3 * r['interval_s']:g} ms, recordtool producers {r['producers']}")
    print(f"{'pipeline':28}{'alone':>10}{'beside':>10}{'fast switch':>13}{'ratio':>8}{'GIL waits/batch':>17}")
    for name in r["pipelines"]:
        row = r[name]
        cells = [f"{row[c]:10,.0f}" if c in row else f"{'err':>10}" for c in ("alone", "beside")]
        fast = f"{row['beside_fast_switch']:13,.0f}" if "beside_fast_switch" in row else f"{'err':>13}"
        ratio = f"{row['ratio_beside']:8.2f}" if "ratio_beside" in row else f"{'':>8}"
        k = f"{row['gil_waits_per_batch']:17.1f}" if "gil_waits_per_batch" in row else ""
        print(f"{name:28}{''.join(cells)}{fast}{ratio}{k}")
        for key, v in row.items():
            if key.endswith("_error"):
                print(f"  {name} {key}: {v[:200]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One table of `recordtool bench --op` runs (their --json files): per op and device, the Loader
without the op, the compiled op's cost (median of the interleaved rounds, and their range), the
batch op's, the fused pass's CPU time with and without the op, and DALI without → with its own
op. `scripts/device_run.sh` step `ops` prints it last; BENCHMARKS.md's rows are built from it.

    python scripts/ops_table.py OUT/bench_op_*.json
"""
from __future__ import annotations

import argparse
import json
import sys


def _pct(x) -> str:
    return f"{100 * x:.1f} %"


def row(r: dict) -> list:
    """The table's cells of one bench --op JSON (a run without "op" is named, not measured)."""
    o = r.get("op")
    if not o:
        return [r.get("path", "?"), r.get("device", "?"), "no --op in this run", "", "", "", ""]
    lo, hi = o["compiled_cost_range"]
    blo, bhi = o["batch_cost_range"]
    f = o["fused_pass"]
    d, dop = r.get("dali", {}), r.get("dali_op", {})
    if "img_s" in d and "img_s" in dop:
        dali = f"{d['img_s']:,.0f} → {dop['img_s']:,.0f} ({_pct(1 - dop['img_s'] / d['img_s'])})"
    else:
        dali = (dop.get("error") or d.get("error") or "not run")[:50]
    rates = ", ".join(f"{x:,.0f}" for x in o["none"]["epochs_img_s"])
    return [o["name"], r["device"], rates,
            f"**{_pct(o['compiled_cost'])}** ({_pct(lo)} … {_pct(hi)})",
            f"{_pct(o['batch_cost'])} ({_pct(blo)} … {_pct(bhi)})",
            f"{f['none_ms_per_image']:.3f} → {f['compiled_ms_per_image']:.3f} ({f['cost'] * 100:+.1f} %); "
            f"op alone {f['op_alone_ms_per_image']:.4f}",
            dali]


HEADER = ["op", "device", "Loader, no op (img/s per round)", "compiled op: cost (median; rounds)",
          "batch op: cost (median; rounds)", "fused pass 1 thread, ms/img: no op → with op", "DALI no op → its op (img/s)"]


def table(runs: list) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row(r)) + " |" for r in runs]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", help="recordtool bench --op ... --json files")
    a = ap.parse_args(argv)
    runs = []
    for path in a.json:
        try:
            with open(path) as f:
                runs.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"{path}: {e}", file=sys.stderr)
    print(table(runs))
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())

"""What `recordtool tune` makes of its measurements (tune.py's `run`): the measure candidates are
ranked by, the recommendation, the table (plots.py draws the same measure)."""
from __future__ import annotations

import numpy as np


def _measure(devices) -> tuple:
    """(device, row key) the recommendation ranks by: on the GPU (when measured) its Loader's
    images per second; on the CPU its images per CPU-second — the work an image costs, which
    holds still when other processes share the cores (wall-clock img/s does not)."""
    dev = list(devices)[-1]
    return (dev, "img_s") if dev == "cuda" else (dev, "img_per_cpu_s")


def measure_name(devices) -> str:
    dev, key = _measure(devices)
    return f"{dev} Loader images per second" if key == "img_s" else f"{dev} Loader images per CPU-second"


def values(row: dict, devices) -> list:
    """The per-epoch values of the measure (their median is `speed`)."""
    dev, key = _measure(devices)
    return row.get(dev, {}).get("epochs_" + key, [])


def speed(row: dict, devices) -> float:
    """The candidate's measure (median over the timed epochs, see _measure); NaN when that
    loader failed (such a candidate is never recommended)."""
    dev, key = _measure(devices)
    return row.get(dev, {}).get(key, float("nan"))


def spread(row: dict, devices) -> float:
    dev, key = _measure(devices)
    return row.get(dev, {}).get(key + "_spread", float("nan"))


def _epochs(row: dict, devices) -> list:
    """The candidate's timed epochs of the measure; its median alone where they were not kept."""
    v = [float(x) for x in values(row, devices)]
    return v or [speed(row, devices)]


def recommend(r: dict) -> str | None:
    """Of the candidates with median PSNR ≥ r["min_psnr"], those as fast as the fastest within
    its spread over the epochs — whose fastest epoch is at least the fastest candidate's slowest
    one, so that the two ranges of epochs overlap (measurements that close do not tell the
    candidates apart; one slower than every epoch of the fastest is slower) — and of those the
    most faithful (highest median PSNR). None when no candidate reaches min_psnr."""
    devs = r["devices"]
    ok = [c for c in r["candidates"] if c["psnr_median"] >= r["min_psnr"] and speed(c, devs) > 0]
    if not ok:
        return None
    best = max(ok, key=lambda c: speed(c, devs))
    floor = min(_epochs(best, devs))
    near = [c for c in ok if max(_epochs(c, devs)) >= floor]
    return max(near, key=lambda c: (c["psnr_median"], speed(c, devs)))["name"]


def table(r: dict) -> str:
    devs = r["devices"]
    base = r["candidates"][0] if r["candidates"] and r["candidates"][0]["max_side"] is None else None
    head = (f"{'candidate':<12} {'preset':<9} {'shrunk':>6} {'MB':>7} {'pack rec/s':>10} "
            + " ".join(f"{d + ' img/s':>16}" for d in devs) + f" {'img/CPU-s':>15}"
            + f" {'vs as-is':>8} {'PSNR med':>8} {'PSNR p5':>7} {'SSIM med':>8} {'SSIM p5':>7}")
    lines = [f"recordtool tune: {r['images']} images, {r['size']}² RandomResizedCrop, batch {r['batch_size']}, "
             f"{r['threads']} threads; rates: median of {max(1, r['epochs'] - 1)} epochs after a warm-up, ± their "
             f"range / 2; img/CPU-s: images per second of this process's CPU time, {devs[0]} loader", head]

    def rate(m: dict, key: str, width: int) -> str:
        if key not in m:
            return f"{'failed':>{width}}"
        sp = m.get(key + "_spread", float("nan"))
        return f"{m[key]:>{width - 6},.0f} ±{50 * sp:>3.0f}%" if np.isfinite(sp) else f"{m[key]:>{width},.0f}"

    for c in r["candidates"]:
        rates = " ".join(rate(c[d], "img_s", 16) for d in devs) + " " + rate(c[devs[0]], "img_per_cpu_s", 15)
        gain = speed(c, devs) / speed(base, devs) if base else float("nan")
        mark = " <- recommended" if c["name"] == r["recommended"] else ""
        lines.append(f"{c['name']:<12} {c['preset'] or '':<9} {c['converted']:>6} {c['bytes'] / 1e6:>7.1f} "
                     f"{c['pack_rec_s']:>10,.0f} {rates} {gain:>7.2f}x {c['psnr_median']:>8.1f} {c['psnr_p5']:>7.1f} "
                     f"{c['ssim_median']:>8.4f} {c['ssim_p5']:>7.4f}{mark}")
    for c in r["candidates"]:
        for d in devs:
            if "error" in c[d]:
                lines.append(f"{c['name']}: {d} loader failed: {c[d]['error']}")
    for name, v in r.get("peers", {}).items():
        if isinstance(v, str):
            lines.append(f"peer {name}: {v[:120]}")
            continue
        ratios = ", ".join(f"{c['name']}{' (' + c['preset'] + ')' if c['preset'] else ''} "
                           f"{c['cuda']['img_s'] / v:.2f}x" for c in r["candidates"]
                           if (c["name"] == r["recommended"] or c["preset"]) and "img_s" in c.get("cuda", {}))
        lines.append(f"peer {name} (on the original files): {v:,.0f} img/s; against it: {ratios}")
    if r["recommended"]:
        lines.append(f"recommended: {r['recommended']} — median PSNR ≥ {r['min_psnr']:g} dB, as fast as the "
                     f"fastest within its spread (a timed epoch at least as fast as its slowest), then the most "
                     f"faithful (ranked by {measure_name(devs)}; 'vs as-is' too)")
    else:
        lines.append(f"no candidate reaches median PSNR {r['min_psnr']:g} dB")
    return "\n".join(lines)



"""The PNGs of `recordtool bench --plot` and `recordtool tune --plot`, drawn with matplotlib
(the optional `[plot]` extra; no display needed: the Agg canvas writes the file)."""
from __future__ import annotations

import math

from ..errors import RecordtoolError

OURS, PEER, BASE = "#3465a4", "#ce5c00", "#888a85"


class PlotUnavailable(RecordtoolError, ImportError):
    """--plot without matplotlib."""


def require() -> None:
    """Check matplotlib imports before a long measurement, not after it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable("--plot draws with matplotlib, which does not import here: "
                              "pip install 'recordtool[plot]'") from None


def _figure(w: float, h: float):
    require()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _rate(v: float) -> str:
    return f"{v / 1e3:,.1f}k" if v >= 1e4 else f"{v:,.0f}"


def bench(r: dict, path: str) -> None:
    """Images per second of every pipeline `bench` ran, one horizontal bar each, on one linear
    axis in one unit (the read-only rate, in records and MB per second, is stated beneath)."""
    bars = [("recordtool Loader", r["loader"]["img_s"], OURS),
            ("decode stage alone", r["decode"]["img_s"], OURS)]
    for key, name in (("dali", "DALI, same records"), ("dali_files", "DALI, original files")):
        if "img_s" in r.get(key, {}):
            bars.append((name, r[key]["img_s"], PEER))
    for name, v in r.get("peers", {}).items():
        rate = v[0] if isinstance(v, tuple) else v
        if isinstance(rate, (int, float)):
            bars.append((name, float(rate), PEER))
    if "img_s" in r.get("baseline_pil", {}):
        bars.append(("Pillow + RandomResizedCrop", r["baseline_pil"]["img_s"], BASE))
    fig = _figure(8.0, 1.4 + 0.45 * len(bars))
    ax = fig.add_subplot()
    names = [b[0] for b in bars][::-1]
    values = [b[1] for b in bars][::-1]
    ax.barh(names, values, color=[b[2] for b in bars][::-1], height=0.6)
    top = max(values)
    ours = r["loader"]["img_s"]
    for y, v in enumerate(values):
        ax.text(v + top * 0.01, y, f"{_rate(v)}  ({v / ours:.2f}× Loader)" if v != ours else _rate(v),
                va="center", fontsize=9)
    ax.set_xlim(0, top * 1.35)  # room for the value labels
    ax.set_xlabel("images per second (higher is better)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    from matplotlib.patches import Patch

    kinds = [(OURS, "recordtool"), (PEER, "peers")] + ([(BASE, "baseline")] if "baseline_pil" in r else [])
    ax.legend(handles=[Patch(color=c, label=n) for c, n in kinds], loc="lower right", fontsize=9)
    ax.set_title(f"recordtool bench: {r['records']:,} records ({r['mean_jpeg_kb']:.0f} KB mean), device "
                 f"{r['device']}, {r['threads']} threads, batch {r['batch_size']}", fontsize=10)
    fig.text(0.01, 0.005, f"read only: {r['read']['records_s']:,.0f} records/s, {r['read']['mb_s']:,.0f} MB/s",
             fontsize=8, color="#555753")
    fig.savefig(path)


def tune(r: dict, path: str) -> None:
    """The recommendation's measure (with its spread over the timed epochs as error bars)
    against median crop PSNR: one line per --max-side through its qualities, the as-is pack as
    a dashed level (its PSNR, near-lossless, would squeeze the axis), the --min-psnr bound and
    the recommended candidate ringed."""
    import matplotlib

    from .tune_report import measure_name, speed, values

    devs = r["devices"]
    rows = [c for c in r["candidates"] if math.isfinite(c["psnr_median"]) and speed(c, devs) > 0]
    fig = _figure(8.5, 5.2)
    ax = fig.add_subplot()
    sides = sorted({c["max_side"] for c in rows if c["max_side"] is not None})
    cmap = matplotlib.colormaps["viridis"]
    for k, side in enumerate(sides):
        pts = sorted((c for c in rows if c["max_side"] == side), key=lambda c: c["psnr_median"])
        x = [c["psnr_median"] for c in pts]
        y = [speed(c, devs) for c in pts]
        err = [[v - min(values(c, devs)) for c, v in zip(pts, y)], [max(values(c, devs)) - v for c, v in zip(pts, y)]]
        color = cmap(k / max(1, len(sides) - 1) * 0.85)
        ax.errorbar(x, y, yerr=err, color=color, marker="o", ms=5, capsize=3, lw=1.2, label=f"max side {side} px")
        for c, xv, yv in zip(pts, x, y):
            ax.annotate(f"q{c['quality']}", (xv, yv), xytext=(6, 5), textcoords="offset points", fontsize=7,
                        color=color)
    asis = next((c for c in rows if c["max_side"] is None), None)
    if asis is not None:
        ax.axhline(speed(asis, devs), color=BASE, ls="--", lw=1,
                   label=f"as-is (lossless, {asis['psnr_median']:.0f} dB): {_rate(speed(asis, devs))}")
    ax.axvline(r["min_psnr"], color="#cc0000", ls=":", lw=1, label=f"--min-psnr {r['min_psnr']:g} dB")
    best = next((c for c in rows if c["name"] == r["recommended"]), None)
    if best is not None and best["max_side"] is not None:
        ax.plot([best["psnr_median"]], [speed(best, devs)], "o", ms=14, mfc="none", mec="#cc0000", mew=2,
                label=f"recommended: {best['name']}")
    ax.set_xlabel(f"median PSNR of {r['size']}×{r['size']} crops against the original files, dB "
                  "(higher is more faithful)")
    ax.set_ylabel(f"{measure_name(devs)} (higher is faster)")
    ax.margins(x=0.08)  # no point on the frame, room for its label
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(f"recordtool tune: {r['images']:,} images, batch {r['batch_size']}, median of "
                 f"{max(1, r['epochs'] - 1)} epochs (bars: their range)", fontsize=10)
    if not rows:
        ax.text(0.5, 0.5, "no candidate measured", transform=ax.transAxes, ha="center")
    fig.savefig(path)

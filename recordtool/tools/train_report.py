"""The training benchmark's results and how they are reported: `Run` (one timed run of a
pipeline), `Result` (every run of one benchmark, and its `summary` — medians, spreads, ratios to
the synthetic pipeline and to the best DALI), the `table` the command prints and the JSON it
writes (`write_json`). train_bench.py runs the pipelines and fills these in.
"""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field

from .train_pipelines import parse_options

@dataclass
class Run:
    pipeline: str
    img_s: float
    wait_ms: float  # mean host wait per timed step
    steps: int
    error: str | None = None
    cores: dict = field(default_factory=dict)  # thread group → cores busy during the timed steps
    cores_busy: float | None = None  # the process's (and its children's) CPU seconds / wall
    gpu_mib: float | None = None  # device memory the process held (None in the CPU form)
    rss_mib: float | None = None  # the host's peak resident set
    anon_mib: float | None = None  # its peak anonymous part: mapped files' pages left out (train_step.memory_mib)
    affinity: list | None = None  # the CPUs the process's threads were allowed, at the end


@dataclass
class Result:
    arch: str
    size: int
    batch: int
    device: str
    cores: int | None = None  # the node's share the process was pinned to (all it might use by default)
    cpus: list | None = None
    threads: int | None = None
    runs: list = field(default_factory=list)

    def by_pipeline(self) -> dict:
        out: dict = {}
        for r in self.runs:
            out.setdefault(r.pipeline, []).append(r)
        return out

    def all_failed(self) -> str:
        """"" when some pipeline ran; else the line saying that none did (the command then
        exits non-zero: a table of failures is no measurement)."""
        if not self.runs or any(r.error is None for r in self.runs):
            return ""
        return f"every pipeline failed ({len(self.runs)} run(s)); the first: {self.runs[0].error}"

    def summary(self) -> dict:
        """pipeline → {median, min, max, spread (max/min), wait_ms, vs_synthetic, vs_dali, cores_busy,
        gpu_mib, gpu_process_mib, rss_mib, anon_mib}: medians over the runs, but the memories the least of
        them (the pipelines share one process, and what an earlier one leaves behind — DALI's
        pools, freed Python arenas — adds to later readings); vs_dali against the best plain DALI
        row (best_dali); gpu_mib the process's device memory minus the synthetic pipeline's (its
        model and optimiser alone); None where not measured."""
        rows = {}
        for name, runs in self.by_pipeline().items():
            ok = [r for r in runs if r.error is None]
            if not ok:
                rows[name] = {"error": runs[-1].error}
                continue
            rates = [r.img_s for r in ok]
            rows[name] = {"median": statistics.median(rates), "min": min(rates), "max": max(rates),
                          "spread": max(rates) / min(rates), "runs": rates,
                          "wait_ms": statistics.median(r.wait_ms for r in ok),
                          "cores_busy": _median([r.cores_busy for r in ok]),
                          "gpu_process_mib": _least([r.gpu_mib for r in ok]),
                          "rss_mib": _least([r.rss_mib for r in ok]),
                          "anon_mib": _least([r.anon_mib for r in ok])}
        synth = rows.get("synthetic", {}).get("gpu_process_mib")
        for row in rows.values():
            if "median" in row:
                own = row["gpu_process_mib"]
                row["gpu_mib"] = round(own - synth) if synth is not None and own is not None else None
        best = best_dali(rows)
        for ref, name in (("synthetic", "synthetic"), ("dali", best)):
            base = rows.get(name, {}).get("median") if name else None
            for row in rows.values():
                if base and "median" in row:
                    row["vs_" + ref] = row["median"] / base
        return rows


def _median(values, digits: int = 2):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), digits) if values else None


def _least(values):
    values = [v for v in values if v is not None]
    return min(values) if values else None


def best_dali(rows: dict) -> str | None:
    """The name of the fastest plain DALI row of a summary (`dali` or `dali:load=X`, no op): the
    DALI a user would have tuned, which the ratios are against; None without one."""
    plain = [(row["median"], name) for name, row in rows.items() if "median" in row
             and name.partition(":")[0] == "dali" and set(parse_options(name.partition(":")[2])) <= {"load"}]
    return max(plain)[1] if plain else None


def _cpus_text(cpus) -> str:
    return f"{cpus[0]}-{cpus[-1]}" if cpus == list(range(cpus[0], cpus[-1] + 1)) else ",".join(map(str, cpus))


def table(res: Result) -> str:
    rows = res.summary()
    best = best_dali(rows)
    share = f"{res.cores} core(s) (CPUs {_cpus_text(res.cpus)})" if res.cpus else "cores unknown"
    repeats = max((len(v) for v in res.by_pipeline().values()), default=0)  # whichever pipelines ran
    lines = [f"training throughput: {res.arch} @{res.size}, batch {res.batch}, {res.device}, {share}, "
             f"{res.threads} threads; img/s median of {repeats} run(s) (min–max)" + (f"; × DALI against {best}, the best DALI" if best else ""),
             f"{'pipeline':<30}{'img/s':>9}{'min–max':>19}{'max/min':>9}{'× synth':>9}{'× DALI':>8}{'wait ms':>9}"
             f"{'cores':>7}{'GPU MiB':>9}{'RSS MiB':>9}{'anon MiB':>10}"]

    def num(v, width: int, fmt: str) -> str:  # "–" where not measured (the CPU form's GPU memory)
        return f"{v:{width}{fmt}}" if v is not None else f"{'–':>{width}}"

    for name, row in rows.items():
        if "error" in row:
            lines.append(f"{name:<30} failed: {row['error']}")
            continue
        lines.append(f"{name:<30}{row['median']:9,.0f}{row['min']:10,.0f}–{row['max']:<8,.0f}{row['spread']:9.2f}"
                     f"{row.get('vs_synthetic', float('nan')):9.2f}{row.get('vs_dali', float('nan')):8.2f}"
                     f"{row['wait_ms']:9.1f}{num(row['cores_busy'], 7, '.1f')}{num(row['gpu_mib'], 9, ',.0f')}"
                     f"{num(row['rss_mib'], 9, ',.0f')}{num(row.get('anon_mib'), 10, ',.0f')}")
    return "\n".join(lines)


def write_json(res: Result, path: str) -> None:
    with open(path, "w") as f:
        json.dump({"config": {k: v for k, v in asdict(res).items() if k != "runs"},
                   "runs": [asdict(r) for r in res.runs], "summary": res.summary(),
                   "best_dali": best_dali(res.summary()),
                   "commit": os.environ.get("RECORDTOOL_COMMIT")}, f, indent=1, default=float)

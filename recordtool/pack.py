"""`recordtool pack`: a source (ImageNet-style folder) → OFRecord shards + index + manifest.

Records are shuffled across shards at pack time with `seed` (folders are class-sorted; a
sequential read must not be). Files are read and probed in a thread pool but written in
the shuffled order, so the output never depends on the worker count.
"""
from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from . import __version__
from .format.writer import DatasetWriter, fault_point
from .sources import imagefolder
from .sources.image import DEFAULT_MAX_PIXELS, Rejected, prepare

DEFAULT_SHARD_SIZE = 128 * 1024 * 1024


class PackError(RuntimeError):
    pass


@dataclass
class Summary:
    out: str
    records: int
    shards: int
    bytes: int
    seconds: float
    converted: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    warnings: list = field(default_factory=list)

    def line(self) -> str:
        mb = self.bytes / 1e6
        rate = self.records / self.seconds if self.seconds else 0.0
        s = (f"packed {self.records} records into {self.shards} shards ({mb:.1f} MB) in "
             f"{self.seconds:.2f} s ({rate:.0f} rec/s); converted {len(self.converted)}, "
             f"skipped {len(self.skipped)}")
        if self.converted or self.skipped or self.warnings:
            s += f" (see {os.path.join(self.out, 'pack_report.json')})"
        return s


def ordered_map(fn, items, workers: int, chunk: int = 16, ahead: int = 4):
    """fn over items in a thread pool, results in input order.

    Work goes out in chunks (a future per item costs more than reading a small file) and at
    most workers × ahead chunks are in flight, so memory stays bounded.
    """
    items = list(items)
    chunks = (items[i:i + chunk] for i in range(0, len(items), chunk))

    def run(batch):
        return [fn(x) for x in batch]

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="recordtool-pack") as ex:
        pending = deque()
        for batch in chunks:
            pending.append(ex.submit(run, batch))
            if len(pending) >= workers * ahead:
                break
        while pending:
            done = pending.popleft().result()
            for batch in chunks:
                pending.append(ex.submit(run, batch))
                break
            yield from done


def _load(item, max_pixels):
    try:
        with open(item.path, "rb") as f:
            data = f.read()
    except OSError as e:
        return item, Rejected(f"unreadable: {e.strerror or e}")
    try:
        return item, prepare(data, max_pixels=max_pixels)
    except Rejected as e:
        return item, e


def pack(src: str, out: str, *, shards: int | None = None, shard_size: int | None = None,
         workers: int | None = None, seed: int = 0, strict: bool = False, overwrite: bool = False,
         max_pixels: int = DEFAULT_MAX_PIXELS, progress: bool = True) -> Summary:
    t0 = time.perf_counter()
    if shards is not None and shard_size is not None:
        raise ValueError("give --shards or --shard-size, not both")
    if shards is not None and shards < 1:
        raise ValueError("--shards must be ≥ 1")
    if shards is None and shard_size is None:
        shard_size = DEFAULT_SHARD_SIZE
    workers = workers or min(32, (os.cpu_count() or 1) * 2)

    scan = imagefolder.scan(src)
    if strict and (scan.skipped or scan.warnings):
        first = f"{scan.skipped[0][0]}: {scan.skipped[0][1]}" if scan.skipped else scan.warnings[0]
        raise PackError(f"--strict: {os.path.join(src, first)}")
    items = scan.items
    order = np.random.default_rng(seed).permutation(len(items))
    shuffled = [items[i] for i in order]
    n = len(shuffled)
    # --shards N: candidate k goes to shard k*N//n, so shard sizes do not depend on skips elsewhere
    bounds = [k * n // shards for k in range(shards + 1)] if shards else None

    writer = DatasetWriter(out, overwrite=overwrite)
    converted, skipped = [], [(rel, why) for rel, why in scan.skipped]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, unit="img", desc="pack", mininterval=0.5)
    try:
        results = ordered_map(lambda it: _load(it, max_pixels), shuffled, workers)
        next_bound = 1
        if shards:
            writer.new_shard()
        for pos, (item, res) in enumerate(results):
            if shards:
                while pos >= bounds[next_bound]:
                    writer.new_shard()
                    next_bound += 1
            elif writer.shard < 0 or writer.shard_bytes() >= shard_size:
                writer.new_shard()
            if isinstance(res, Rejected):
                if strict:
                    raise PackError(f"--strict: {item.path}: {res}")
                skipped.append((item.relpath, str(res)))
            else:
                if res.converted:
                    converted.append((item.relpath, f"converted to RGB JPEG: {res.converted}"))
                writer.add(res.data, res.info, item.label, os.fsencode(item.relpath))
                fault_point("record")
            if bar is not None:
                bar.update(1)
        if shards:  # trailing shards whose candidates were all skipped still exist, empty
            while len(writer.shards) < shards:
                writer.new_shard()
        if len(writer.index) == 0:
            raise PackError(f"{src}: no record to write: {n} image files found, all skipped"
                            + (f" (first: {skipped[0][0]}: {skipped[0][1]})" if skipped else ""))
    except BaseException:
        writer.abort()
        raise
    finally:
        if bar is not None:
            bar.close()

    report = {
        "source": src,
        "converted": [{"file": f, "reason": r} for f, r in sorted(converted)],
        "skipped": [{"file": f, "reason": r} for f, r in sorted(skipped)],
        "warnings": scan.warnings,
    }
    manifest = {
        "classes": scan.classes,
        "source": {"kind": "imagefolder", "path": src, "files": n},
        "pack": {"seed": seed, "shards": shards, "shard_size": shard_size, "max_pixels": max_pixels,
                 "strict": strict, "shuffled": True},
        "tool": {"name": "recordtool", "version": __version__},
    }
    m = writer.commit(manifest, report)
    return Summary(out, m["records"], len(m["shards"]), sum(s["bytes"] for s in m["shards"]),
                   time.perf_counter() - t0, converted, skipped, scan.warnings)

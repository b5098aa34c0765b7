"""`recordtool pack`: a source (ImageNet-style folder, TFRecord files, OFRecord parts) →
OFRecord shards + index + manifest.

Records are shuffled across shards at pack time with `seed` (sources are class-sorted; a
sequential read must not be). Items are read and fixed in a thread pool but written in the
shuffled order, so the output never depends on the worker count.
"""
from __future__ import annotations

import os
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from . import __version__
from .decode.cpu import cores
from .errors import OnError, PackError, on_error as _on_error, report as _report
from .format.writer import DatasetWriter, fault_point
from .sources.base import Source, source_paths
from .sources.image import DEFAULT_MAX_PIXELS, NO_TRANSCODE, Rejected, Transcode, prepare

DEFAULT_SHARD_SIZE = 128 * 1024 * 1024


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


def _load(source, item, max_pixels, transcode):
    try:
        data, label, filename = source.load(item)
        return item, prepare(data, max_pixels=max_pixels, transcode=transcode), label, filename
    except Rejected as e:
        return item, e, None, None


def pack(src: str | os.PathLike | Source, out: str, *, shards: int | None = None, shard_size: int | None = None,
         workers: int | None = None, seed: int = 0, on_error: OnError | str = "skip", overwrite: bool = False,
         max_pixels: int = DEFAULT_MAX_PIXELS, transcode: Transcode = NO_TRANSCODE,
         progress: bool = True) -> Summary:
    """Pack a source into OUT: OFRecord part files, index.rtx, manifest.json (all or nothing).

    Args:
        src: an ImageNet-style folder path, or a `Source` (TFRecordSource, OFRecordSource).
        out: the dataset directory to write (created; must be empty, ours, or --overwrite).
        shards: number of part files; each is filled by its own task (same bytes for any
            `workers`). Exclusive with `shard_size`.
        shard_size: target part-file size in bytes (default 128 MiB) when `shards` is not given.
        workers: reader threads (default 2 × cores); the output does not depend on it.
        seed: seed of the pack-time shuffle across shards.
        on_error: a file or record that cannot be packed — "skip" (default: listed in
            pack_report.json), "warn" (listed and a warning), "raise" (stop, nothing published;
            the CLI's --strict).
        overwrite: replace a finished dataset in `out`.
        max_pixels: images declaring more pixels are refused (decompression bombs).
        transcode: optional re-encoding (`Transcode`: max_side, quality, hw_friendly).
        progress: show a tqdm bar.
    """
    t0 = time.perf_counter()
    policy = _on_error(on_error)
    strict = policy is OnError.RAISE
    if shards is not None and shard_size is not None:
        raise ValueError("give --shards or --shard-size, not both")
    if shards is not None and shards < 1:
        raise ValueError("--shards must be ≥ 1")
    if shards is None and shard_size is None:
        shard_size = DEFAULT_SHARD_SIZE
    workers = workers or min(32, cores() * 2)
    if isinstance(src, (str, os.PathLike)):
        from .sources.imagefolder import ImageFolderSource

        source = ImageFolderSource(os.fspath(src), exclude=(out,))
    else:
        source = src
    try:
        for where, why in source.skipped:
            _report(policy, f"{where}: {why}", PackError)
        if strict and source.warnings:
            raise PackError(f"on_error=raise: {source.warnings[0]}")
    except BaseException:
        source.close()
        raise
    items = source.items
    order = np.random.default_rng(seed).permutation(len(items))
    shuffled = [items[i] for i in order]
    n = len(shuffled)
    try:
        writer = DatasetWriter(out, overwrite=overwrite, sources=source_paths(source))
    except BaseException:
        source.close()
        raise
    converted, skipped = [], list(source.skipped)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, unit="rec", desc="pack", mininterval=0.5)
    lock = threading.Lock()

    def record(item, res, label, filename, shard):
        """Write one loaded item (or note why it was skipped); safe from several shard threads."""
        if isinstance(res, Rejected):
            _report(policy, f"{source.where(item)}: {res}", PackError, stacklevel=4)
            with lock:
                skipped.append((source.where(item), str(res)))
        else:
            if res.converted:
                with lock:
                    converted.append((source.where(item), f"re-encoded: {res.converted}"))
            shard.add(res.data, res.info, label, filename)
            fault_point("record")
        if bar is not None:
            bar.update(1)

    try:
        if shards:
            # --shards N: candidate k goes to shard k*N//n (shard sizes do not depend on skips
            # elsewhere), and the shards are independent files: each is filled by its own task,
            # in order, so the output is the same for any number of workers.
            bounds = [k * n // shards for k in range(shards + 1)]
            writers = writer.open_shards(shards)

            failed = threading.Event()

            def fill(k):
                try:
                    for item in shuffled[bounds[k]:bounds[k + 1]]:
                        if failed.is_set():  # another shard hit on_error="raise" or an error: stop early
                            return
                        record(*_load(source, item, max_pixels, transcode), writers[k])
                except BaseException:
                    failed.set()
                    raise

            with ThreadPoolExecutor(max_workers=min(workers, shards), thread_name_prefix="recordtool-shard") as ex:
                for f in [ex.submit(fill, k) for k in range(shards)]:
                    f.result()
        else:
            for item, res, label, filename in ordered_map(lambda it: _load(source, it, max_pixels, transcode),
                                                          shuffled, workers):
                if writer.shard < 0 or writer.shard_bytes() >= shard_size:
                    writer.new_shard()
                record(item, res, label, filename, writer.writers[-1])
        if writer.records() == 0:
            raise PackError(f"no record to write: {n} items found, all skipped"
                            + (f" (first: {skipped[0][0]}: {skipped[0][1]})" if skipped else ""))
    except BaseException:
        writer.abort()
        source.close()
        raise
    finally:
        if bar is not None:
            bar.close()
    classes, class_text = source.classes(writer.max_label())
    report = {
        "source": source.describe(),
        "converted": [{"file": f, "reason": r} for f, r in sorted(converted)],
        "skipped": [{"file": f, "reason": r} for f, r in sorted(skipped)],
        "warnings": source.warnings,
    }
    fields = {
        "classes": classes,
        "source": source.describe(),
        "pack": {"seed": seed, "shards": shards, "shard_size": shard_size, "max_pixels": max_pixels,
                 "on_error": policy.value, "shuffled": True, "max_side": transcode.max_side,
                 "quality": transcode.quality, "hw_friendly": transcode.hw_friendly},
        "tool": {"name": "recordtool", "version": __version__},
    }
    if class_text:
        fields["class_text"] = class_text
    m = writer.commit(fields, report)
    source.close()
    return Summary(out, m["records"], len(m["shards"]), sum(s["bytes"] for s in m["shards"]),
                   time.perf_counter() - t0, sorted(converted), sorted(skipped), source.warnings)

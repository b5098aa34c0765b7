"""`recordtool pack`: a source (ImageNet-style folder, TFRecord files, OFRecord parts) →
OFRecord shards + index + manifest.

Records are shuffled across shards at pack time with `seed` (sources are class-sorted; a
sequential read must not be). Two ways to cut them into part files:

- planned (`shards=N`, and always with `engine="ray"`): the driver makes a `Plan` (items per
  shard); each part file is filled by `fill_shard` — a local thread or a Ray task — and
  recorded as finished in `OUT/.partial/part-NNNNN.done.json`; the driver merges the index and
  publishes. A re-run after a crash reuses the shards finished under the same plan.
- by size (default with the local engine): items are read and fixed in a thread pool and
  written in order, a new part file when the current one reaches `shard_size`.

Either way the output never depends on the worker count or the engine.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Literal

from . import __version__
from .checks import MAX_PIXELS, MAX_SEED, MAX_THREADS, bounded_int, parse_size
from .decode.cpu import cores
from .errors import FormatError, OnError, PackError, on_error as _on_error, report as _report
from .format import index as ix
from .format.writer import PARTIAL_DIR, DatasetWriter, FinishedShard, ShardWriter, fault_point
from .fs import get_fs, is_url
from .plan import PLAN_VERSION, Options, Plan, ShardTask, make_plan, shuffle
from .sources.base import Source, source_paths
from .sources.image import DEFAULT_MAX_PIXELS, NO_TRANSCODE, Rejected, Transcode, prepare

DEFAULT_SHARD_SIZE = 128 * 1024 * 1024
Engine = Literal["local", "process", "ray"]
ENGINES = ("local", "process", "ray")
SAMPLE = 256  # items loaded to estimate the shard count of `engine="ray"` without `shards`
DONE_SUFFIX = ".done.json"
DONE_MAX_BYTES = 256 << 20


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
    engine: str = "local"
    reused: list = field(default_factory=list)  # part files finished by an earlier run, kept
    retried: int = 0  # shard tasks Ray ran again after their worker died

    def line(self) -> str:
        mb = self.bytes / 1e6
        rate = self.records / self.seconds if self.seconds else 0.0
        s = (f"packed {self.records} records into {self.shards} shards ({mb:.1f} MB) in "
             f"{self.seconds:.2f} s ({rate:.0f} rec/s, {self.engine} engine); converted {len(self.converted)}, "
             f"skipped {len(self.skipped)}")
        if self.reused:
            s += f"; reused {len(self.reused)} shards finished by an earlier run"
        if self.retried:
            s += f"; {self.retried} shard tasks retried"
        if self.converted or self.skipped or self.warnings:
            s += f" (see {os.path.join(self.out, 'pack_report.json')})"
        return s


def ordered_map(fn, items, workers: int, chunk: int = 16, ahead: int = 4, submit=None):
    """fn over items in a thread pool, results in input order.

    Work goes out in chunks (a future per item costs more than reading a small file) and at
    most workers × ahead chunks are in flight, so memory stays bounded. `submit(chunk)` → a
    future of the chunk's results replaces the thread pool (the process engine's pool).
    """
    items = list(items)
    chunks = (items[i:i + chunk] for i in range(0, len(items), chunk))

    def run(batch):
        return [fn(x) for x in batch]

    with contextlib.ExitStack() as stack:
        if submit is None:
            ex = stack.enter_context(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="recordtool-pack"))

            def submit(batch):
                return ex.submit(run, batch)
        pending = deque()
        for batch in chunks:
            pending.append(submit(batch))
            if len(pending) >= workers * ahead:
                break
        while pending:
            done = pending.popleft().result()
            for batch in chunks:
                pending.append(submit(batch))
                break
            yield from done


def _load(source, item, max_pixels, transcode):
    try:
        data, label, filename = source.load(item)
        return item, prepare(data, max_pixels=max_pixels, transcode=transcode), label, filename
    except Rejected as e:
        return item, e, None, None


# ------------------------------------------------------------------ one shard, any engine

@dataclass
class ShardDone:
    """What a finished shard task hands back, and what `part-NNNNN.done.json` keeps.

    Attributes:
        number: part file number.
        hash: the `ShardTask.hash` it was made under.
        info: its manifest entry {name, records, bytes, crc32c}.
        rows: its index rows (`IndexBuilder.rows()`).
        skipped, converted: [where, reason] of its items.
        notes: what the source learned loading them (`Source.notes`).
    """

    number: int
    hash: str
    info: dict
    rows: dict
    skipped: list
    converted: list
    notes: dict

    def to_json(self) -> dict:
        return {"plan_version": PLAN_VERSION, "number": self.number, "hash": self.hash, "shard": self.info,
                "rows": self.rows, "skipped": self.skipped, "converted": self.converted, "notes": self.notes}

    @classmethod
    def from_json(cls, d, where: str) -> "ShardDone":
        if not isinstance(d, dict) or d.get("plan_version") != PLAN_VERSION:
            raise FormatError(f"{where}: not a finished-shard record of this recordtool")
        for key, typ in (("number", int), ("hash", str), ("shard", dict), ("rows", dict), ("skipped", list),
                         ("converted", list), ("notes", dict)):
            if not isinstance(d.get(key), typ):
                raise FormatError(f"{where}: {key!r} must be a {typ.__name__}")
        ix.IndexBuilder.from_rows(d["rows"], where)  # checked here, so a bad record is never half-used
        return cls(d["number"], d["hash"], d["shard"], d["rows"], d["skipped"], d["converted"], d["notes"])


def notes_of(source, labels) -> dict:
    """What the source learned loading items (`Source.notes`: TFRecord class names), for these
    labels only — what a task hands back to the driver."""
    notes = source.notes() if hasattr(source, "notes") else {}
    return {k: v for k, v in notes.items() if int(k) in labels}


def merge_notes(source, notes: dict) -> None:
    if notes and hasattr(source, "merge_notes"):
        source.merge_notes(notes)


def _results(futures) -> list:
    """The futures' results, or the failure itself (not the shards it stopped early)."""
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise next((e for e in errors if not isinstance(e, _Stopped)), errors[0])
    return [f.result() for f in futures]


class _Stopped(Exception):
    """Another shard task failed under on_error="raise": this one stops early."""


def fill_shard(task: ShardTask, source: Source, options: Options, partial: str, fs=None,
               progress=None, stop: threading.Event | None = None) -> ShardDone:
    """Read, fix and write one part file into `partial` (OUT/.partial), then record it as
    finished: the part file is written under a temporary name, flushed, renamed, and only then
    is `part-NNNNN.done.json` written (atomically) — nothing half-written is ever reused.

    Args:
        task: the shard's number, name, items and plan hash.
        source: where the items load from.
        options: max_pixels, transcode, on_error (RAISE: the first bad item raises PackError
            naming it; otherwise bad items are listed in the result).
        partial: the folder to write into, in `fs`'s syntax.
        fs: the `FileSystem` of `partial` (default: local disk).
        progress: called with 1 after each item.
        stop: when set, the task stops early (raises `_Stopped`).
    """
    if fs is None:
        fs, partial = get_fs(partial)
    final = fs.join(partial, task.name)
    tmp = fs.join(partial, f"{task.name}.{uuid.uuid4().hex}.tmp")
    skipped, converted = [], []
    fault = "record@" + task.name
    writer = ShardWriter(tmp, task.number, fs, name=task.name)
    try:
        for item in task.items:
            if stop is not None and stop.is_set():
                raise _Stopped(task.name)
            item, res, label, filename = _load(source, item, options.max_pixels, options.transcode)
            if isinstance(res, Rejected):
                where = source.where(item)
                if options.on_error is OnError.RAISE:
                    raise PackError(f"{where}: {res}")
                skipped.append([where, str(res)])
            else:
                if res.converted:
                    converted.append([source.where(item), f"re-encoded: {res.converted}"])
                writer.add(res.data, res.info, label, filename)
                fault_point("record")
                fault_point(fault)
            if progress is not None:
                progress(1)
        info = writer.close(durable=True)
    except BaseException:
        writer.close()
        try:
            fs.remove(tmp)
        except OSError:
            pass
        raise
    done = ShardDone(task.number, task.hash, info, writer.index.rows(), skipped, converted,
                     notes_of(source, set(writer.index.labels())))
    fs.replace(tmp, final)
    record = fs.join(partial, task.name + DONE_SUFFIX)
    tmp_record = f"{record}.{uuid.uuid4().hex}.tmp"
    fs.write_bytes(tmp_record, json.dumps(done.to_json(), separators=(",", ":")).encode())  # compact: never published
    fs.replace(tmp_record, record)
    return done


def finished(task: ShardTask, partial: str, fs) -> ShardDone | None:
    """The record of `task`'s shard when an earlier run finished it under the same plan hash and
    its part file is there at the recorded size; None otherwise (the shard is redone)."""
    record = fs.join(partial, task.name + DONE_SUFFIX)
    try:
        if not fs.exists(record):
            return None
        done = ShardDone.from_json(json.loads(fs.read_bytes(record, DONE_MAX_BYTES)), record)
        if done.hash != task.hash or done.number != task.number or done.info.get("name") != task.name:
            return None
        if fs.size(fs.join(partial, task.name)) != done.info.get("bytes"):
            return None
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return done


def run_local(tasks: list, source: Source, options: Options, partial: str, workers: int, bar=None) -> list:
    """Fill `tasks`' shards on a thread pool; the first failure stops the others early."""
    fs, partial = get_fs(partial)
    stop = threading.Event()
    progress = bar.update if bar is not None else None

    def fill(task):
        if stop.is_set():
            raise _Stopped(task.name)
        try:
            return fill_shard(task, source, options, partial, fs, progress, stop)
        except BaseException:
            stop.set()
            raise

    ex = ThreadPoolExecutor(max_workers=max(1, min(workers, len(tasks))), thread_name_prefix="recordtool-shard")
    try:
        futures = [ex.submit(fill, t) for t in tasks]
        wait(futures)
    except BaseException:  # Ctrl-C: the shard threads stop at their next item
        stop.set()
        raise
    finally:
        ex.shutdown(wait=True)
    return _results(futures)


def light_source(source):
    """The source without its item list (each task carries its own items): what is shipped once
    to worker processes or Ray workers."""
    light = copy.copy(source)
    light.items = []
    light.skipped = []
    return light


_worker: dict = {}  # in a worker process of run_processes: its source, progress queue, stop event


def _process_init(source, progress, stop):
    _worker.update(source=source, progress=progress, stop=stop)


def _process_fill(task: ShardTask, options: Options, partial: str) -> ShardDone:
    q, pending = _worker["progress"], [0]

    def tick(n):  # progress to the driver in steps, not per record
        pending[0] += n
        if pending[0] >= 16:
            q.put(pending[0])
            pending[0] = 0

    try:
        return fill_shard(task, _worker["source"], options, partial, progress=tick, stop=_worker["stop"])
    finally:
        if pending[0]:
            q.put(pending[0])


def _load_chunk(chunk, max_pixels, transcode):
    """A worker process's part of a by-size pack: load and fix these items with its source."""
    source = _worker["source"]
    results = [_load(source, it, max_pixels, transcode) for it in chunk]
    return results, notes_of(source, {label for _, res, label, _ in results if not isinstance(res, Rejected)})


def _spawn_pool(ctx, source, workers: int, progress=None, stop=None):
    """Worker processes (`ctx`: spawned, not forked: the driver has threads), each with the
    source once (no item list) and the driver's progress queue and stop event."""
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(workers, mp_context=ctx, initializer=_process_init,
                               initargs=(light_source(source), progress, stop))


def run_processes(tasks: list, source: Source, options: Options, partial: str, workers: int, bar=None) -> list:
    """Fill `tasks`' shards in `workers` processes. Transcoding holds the GIL for part of every
    record (header probes, the encoder's wrapper, numpy, the record's framing: ~12 % on the dev
    machine), so threads stop scaling well before 16 cores; processes do not share a GIL. Workers
    are spawned (not forked: the driver has threads); the source goes to each once, without its
    item list; the first failure stops the others at their next item."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_EXCEPTION

    ctx = mp.get_context("spawn")
    progress, stop = ctx.SimpleQueue(), ctx.Event()
    n = max(1, min(workers, len(tasks)))

    def drain():
        while not progress.empty():
            k = progress.get()
            if bar is not None:
                bar.update(k)

    with _spawn_pool(ctx, source, n, progress, stop) as ex:
        futures = [ex.submit(_process_fill, t, options, partial) for t in tasks]
        try:
            pending = set(futures)
            while pending:
                _, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
                drain()
                if any(f.done() and f.exception() is not None for f in futures):
                    stop.set()
        except BaseException:  # Ctrl-C: the workers stop at their next item
            stop.set()
            raise
        drain()
    return _results(futures)


def estimate_shards(source: Source, shuffled: list, shard_size: int, options: Options, workers: int) -> int:
    """A shard count for `shard_size` when none is given (engine="ray"): the mean output size of
    the first SAMPLE items in pack order (loaded and fixed as pack will), times the item count.
    Deterministic: the same input, seed and options give the same count."""
    sample = shuffled[:SAMPLE]
    if not sample:
        return 1
    total = 0
    for _, res, _, _ in ordered_map(lambda it: _load(source, it, options.max_pixels, options.transcode), sample,
                                    workers):
        if not isinstance(res, Rejected):
            total += len(res.data) + 64  # + OFRecord framing and features
    est = total / len(sample) * len(shuffled)
    return max(1, min(len(shuffled), round(est / shard_size)))


# ------------------------------------------------------------------ the command

def pack(src: str | os.PathLike | Source, out: str, *, shards: int | None = None, shard_size: int | None = None,
         workers: int | None = None, seed: int = 0, on_error: OnError | str = "skip", overwrite: bool = False,
         max_pixels: int = DEFAULT_MAX_PIXELS, transcode: Transcode = NO_TRANSCODE,
         progress: bool = True, engine: Engine = "local", ray_address: str | None = None,
         resume: bool = True) -> Summary:
    """Pack a source into OUT: OFRecord part files, index.rtx, manifest.json (all or nothing).

    Args:
        src: an ImageNet-style folder path, or a `Source` (TFRecordSource, OFRecordSource).
        out: the dataset directory to write (created; must be empty, ours, or --overwrite), or
            an object-store URL (s3://bucket/prefix: packed in a staging folder in $TMPDIR,
            then uploaded, manifest last; see recordtool.format.upload — a staged pack does
            not resume, and Ray tasks on other nodes cannot reach the stage).
        shards: number of part files; each is filled by its own task (same bytes for any
            `workers` and either engine). Exclusive with `shard_size`.
        shard_size: target part-file size in bytes (default 128 MiB) when `shards` is not given.
            The local engine fills part files in turn up to it; the Ray engine derives a shard
            count from it (`estimate_shards`), reported in the summary — `shards=` that count
            gives the same bytes locally.
        workers: the local engine's reader threads (default 2 × cores); the process engine's
            processes (default: cores); with `engine="ray"`, the CPUs of the local Ray instance
            pack starts (default: all). The output does not depend on it.
        seed: seed of the pack-time shuffle across shards.
        on_error: a file or record that cannot be packed — "skip" (default: listed in
            pack_report.json), "warn" (listed and a warning), "raise" (stop, nothing published;
            the CLI's --strict).
        overwrite: replace a finished dataset in `out`.
        max_pixels: images declaring more pixels are refused (decompression bombs).
        transcode: optional re-encoding (`Transcode`: max_side, quality, hw_friendly).
        progress: show a tqdm bar.
        engine: "local" (threads of this process), "process" (one process per core, a shard at a
            time each: for transcoding, whose Python share keeps threads from scaling) or "ray"
            (one Ray task per shard, on the cluster of `ray_address`; needs
            `pip install 'recordtool[ray]'` and OUT on storage every node sees). The Ray engine
            always plans shards (from `shard_size` when `shards` is not given).
        ray_address: the cluster to use: None (RAY_ADDRESS if set, else a new local instance),
            "auto" (the cluster running on this machine), "ray://HOST:PORT", "HOST:PORT" or "local".
        resume: reuse the shards an unfinished earlier run of the same plan finished (planned
            packs only); False starts over.
    """
    # numbers checked once here (the CLI's click types apply the same bounds): OptionError
    shards = None if shards is None else bounded_int("shards", shards, 1)  # ≤ items: below
    shard_size = None if shard_size is None else parse_size("shard_size", shard_size)
    workers = None if workers is None else bounded_int("workers", workers, 1, MAX_THREADS)
    seed = bounded_int("seed", seed, 0, MAX_SEED)
    max_pixels = bounded_int("max_pixels", max_pixels, 1, MAX_PIXELS)
    if is_url(os.fspath(out)):  # object storage: pack locally, then publish, manifest last
        from .format.upload import staged

        with staged(os.fspath(out), overwrite) as stage:
            s = pack(src, stage, shards=shards, shard_size=shard_size, workers=workers, seed=seed, on_error=on_error,
                     max_pixels=max_pixels, transcode=transcode, progress=progress, engine=engine,
                     ray_address=ray_address, resume=False)
        return replace(s, out=os.fspath(out))
    out = get_fs(out)[1]  # a local path (file:// URLs too)
    t0 = time.perf_counter()
    policy = _on_error(on_error)
    strict = policy is OnError.RAISE
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if shards is not None and shard_size is not None:
        raise ValueError("give --shards or --shard-size, not both")
    if shards is None and shard_size is None:
        shard_size = DEFAULT_SHARD_SIZE
    ray_cpus = workers
    workers = workers or (cores() if engine == "process" else min(32, cores() * 2))
    ray_engine = None
    if engine == "ray":
        from . import pack_ray as ray_engine

        ray_engine.require()
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
        shuffled = shuffle(source.items, seed)
        if shards is not None and shards > max(1, len(shuffled)):
            raise ValueError(f"--shards {shards} is more than the {len(shuffled)} items to pack")
        if shards is None and engine in ("local", "process"):
            return _pack_by_size(source, shuffled, out, shard_size, workers, seed, policy, overwrite, max_pixels,
                                 transcode, progress, t0, processes=engine == "process")
        options = Options(max_pixels, transcode, policy)
        if shards is None:
            shards = estimate_shards(source, shuffled, shard_size, options, workers)
        plan = make_plan(source, shuffled, shards, seed, options)
        return _pack_planned(source, plan, out, overwrite, resume, progress, workers, ray_engine, ray_address,
                             ray_cpus, t0, processes=engine == "process")
    finally:
        source.close()


def _manifest_fields(source, classes, class_text, seed, shards, shard_size, policy, max_pixels, transcode) -> dict:
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
    return fields


def _report_doc(source, converted, skipped) -> dict:
    return {"source": source.describe(),
            "converted": [{"file": f, "reason": r} for f, r in sorted(converted)],
            "skipped": [{"file": f, "reason": r} for f, r in sorted(skipped)],
            "warnings": source.warnings}


def _no_record(n, skipped):
    return PackError(f"no record to write: {n} items found, all skipped"
                     + (f" (first: {skipped[0][0]}: {skipped[0][1]})" if skipped else ""))


def _partial_of(out: str) -> str:
    """OUT/.partial as a path every worker can use (absolute: Ray workers run elsewhere)."""
    return os.path.join(os.path.abspath(out), PARTIAL_DIR)


def _pack_planned(source, plan: Plan, out, overwrite, resume, progress, workers, ray_engine, ray_address,
                  ray_cpus, t0, processes: bool = False) -> Summary:
    """Plan → shard tasks (local threads or Ray) → merge → publish; finished shards of an
    unfinished run of the same plan are reused."""
    options = plan.options
    writer = DatasetWriter(out, overwrite=overwrite, sources=source_paths(source), plan=plan.marker(), resume=resume)
    try:
        partial_url = _partial_of(out)
        fs, partial = get_fs(partial_url)
        results = {}
        if writer.kept:
            for task in plan.tasks:
                done = finished(task, partial, fs)
                if done is not None:
                    results[task.number] = done
        reused = [plan.tasks[k].name for k in sorted(results)]
        todo = [t for t in plan.tasks if t.number not in results]
        done_list, retried = [], 0
        with (ray_engine.connected(ray_address, ray_cpus) if todo and ray_engine else contextlib.nullcontext()):
            bar = None
            if progress:
                from tqdm import tqdm

                bar = tqdm(total=sum(len(t.items) for t in todo), unit="rec", mininterval=0.5,
                           desc=f"pack ({len(reused)} shards reused)" if reused else "pack")
            try:
                if todo and ray_engine is not None:
                    done_list, retried = ray_engine.run(todo, source, options, partial_url, bar)
                elif todo:
                    run = run_processes if processes else run_local
                    done_list = run(todo, source, options, partial_url, workers, bar)
            finally:
                if bar is not None:
                    bar.close()
        for d in done_list:
            results[d.number] = d
        ordered = [results[t.number] for t in plan.tasks]
        converted, skipped = [], list(source.skipped)
        for d in ordered:
            for where, why in d.skipped:
                _report(options.on_error, f"{where}: {why}", PackError)
            skipped += [tuple(x) for x in d.skipped]
            converted += [tuple(x) for x in d.converted]
            merge_notes(source, d.notes)
        shards = [FinishedShard(d.info, ix.IndexBuilder.from_rows(d.rows, d.info.get("name", "shard")))
                  for d in ordered]
        records = sum(s.info["records"] for s in shards)
        if records == 0:
            raise _no_record(sum(len(t.items) for t in plan.tasks), skipped)
        max_label = max((max(s.index.labels(), default=-1) for s in shards), default=-1)
        classes, class_text = source.classes(max_label)
        t = options.transcode
        fields = _manifest_fields(source, classes, class_text, plan.seed, len(plan.tasks), None, options.on_error,
                                  options.max_pixels, t)
    except BaseException:
        writer.release()  # .partial stays: its finished shards are for the next run of the plan
        raise
    m = writer.commit(fields, _report_doc(source, converted, skipped), shards=shards)
    return Summary(out, m["records"], len(m["shards"]), sum(s["bytes"] for s in m["shards"]),
                   time.perf_counter() - t0, sorted(converted), sorted(skipped), source.warnings,
                   engine="ray" if ray_engine is not None else "process" if processes else "local", reused=reused,
                   retried=retried)


def _pack_by_size(source, shuffled, out, shard_size, workers, seed, policy, overwrite, max_pixels, transcode,
                  progress, t0, processes: bool = False) -> Summary:
    """Without `shards`: items read and fixed in a thread pool (or, engine="process", worker
    processes), written in order by this process, a new part file whenever the current one
    reaches `shard_size` — the same bytes for any worker count and either engine."""
    n = len(shuffled)
    writer = DatasetWriter(out, overwrite=overwrite, sources=source_paths(source))
    converted, skipped = [], list(source.skipped)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, unit="rec", desc="pack", mininterval=0.5)
    pool = submit = None
    if processes:
        import multiprocessing as mp
        from concurrent.futures import Future

        pool = _spawn_pool(mp.get_context("spawn"), source, workers)

        def to_pool(chunk):  # a chunk's results; the worker's notes (TFRecord class names) merged here
            out_f = Future()

            def merge(f):
                try:
                    results, notes = f.result()
                    merge_notes(source, notes)
                    out_f.set_result(results)
                except BaseException as e:
                    out_f.set_exception(e)
            pool.submit(_load_chunk, chunk, max_pixels, transcode).add_done_callback(merge)
            return out_f

        submit = to_pool
    try:
        for item, res, label, filename in ordered_map(lambda it: _load(source, it, max_pixels, transcode),
                                                      shuffled, workers, submit=submit):
            if isinstance(res, Rejected):
                _report(policy, f"{source.where(item)}: {res}", PackError)
                skipped.append((source.where(item), str(res)))
            else:
                if writer.shard < 0 or writer.shard_bytes() >= shard_size:
                    writer.new_shard()
                if res.converted:
                    converted.append((source.where(item), f"re-encoded: {res.converted}"))
                writer.add(res.data, res.info, label, filename)
                fault_point("record")
            if bar is not None:
                bar.update(1)
        if writer.records() == 0:
            raise _no_record(n, skipped)
    except BaseException:
        if pool is not None:  # the chunks queued behind the failure are not transcoded
            pool.shutdown(wait=True, cancel_futures=True)
            pool = None
        writer.abort()
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
        if bar is not None:
            bar.close()
    classes, class_text = source.classes(writer.max_label())
    fields = _manifest_fields(source, classes, class_text, seed, None, shard_size, policy, max_pixels, transcode)
    m = writer.commit(fields, _report_doc(source, converted, skipped))
    return Summary(out, m["records"], len(m["shards"]), sum(s["bytes"] for s in m["shards"]),
                   time.perf_counter() - t0, sorted(converted), sorted(skipped), source.warnings,
                   engine="process" if processes else "local")

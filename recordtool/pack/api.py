"""`recordtool pack`: a source (ImageNet-style folder, TFRecord files, OFRecord parts) →
OFRecord shards + index + manifest.

`pack()` validates its arguments once into a frozen `PackConfig` (the engine's default
included), then runs one pipeline: list the source, shuffle with `seed` (sources are
class-sorted; a sequential read must not be), cut into part files, write, publish. Two ways
to cut:

- by size (no `shards`, the default): items are loaded and fixed on the engine's workers and
  written in order by this process, a new part file when the current one reaches
  `shard_size`;
- planned (`shards=N`): a `ShardPlan` gives each part file its items; each is filled by
  `task.fill_shard` on a worker and recorded as finished in `OUT/.partial/part-NNNNN.done.json`;
  a re-run after a crash reuses the shards finished under the same plan.

Either way the output never depends on the worker count or the engine (engines.py). A URL
OUT is packed into a local staging folder, then uploaded, manifest last (format/upload.py).
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field, replace

from ..version import __version__
from ..checks import MAX_PIXELS, MAX_SEED, MAX_THREADS, bounded_int, parse_size
from ..errors import ConfigError, OnError, PackError, Rejected, Signalled, on_error as _on_error, report as _report
from ..format import index as ix
from ..format.jpeg import DEFAULT_MAX_PIXELS
from ..format.manifest import ClassList, classes_of
from ..format.schema import PARTIAL_DIR
from ..format.upload import sweep_stages
from ..format.writer import DatasetWriter, FinishedShard
from ..io.fs import get_fs, is_url
from ..sources.base import Source, source_paths
from .engines import Engine, engine_of, ordered_chunks
from .plan import Options, ShardPlan, make_plan, shuffle
from .semaphores import sweep as sweep_semaphores
from .task import finished, merge_notes
from .transcode import NO_TRANSCODE, Transcode

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
    engine: str = "local"  # the `Engine.name` that packed
    reused: list = field(default_factory=list)  # part files finished by an earlier run, kept
    retried: int = 0  # tasks run again after their worker died (Ray)
    missing_classes: list = field(default_factory=list)  # (label, name): listed (classes_from), no folder

    def line(self) -> str:
        mb = self.bytes / 1e6
        rate = self.records / self.seconds if self.seconds else 0.0
        s = (f"packed {self.records} records into {self.shards} shards ({mb:.1f} MB) in "
             f"{self.seconds:.2f} s ({rate:.0f} rec/s, {self.engine} engine); converted {len(self.converted)}, "
             f"skipped {len(self.skipped)}")
        if self.reused:
            s += f"; reused {len(self.reused)} shards finished by an earlier run"
        if self.retried:
            s += f"; {self.retried} tasks retried after their worker died"
        if self.missing_classes:
            n = len(self.missing_classes)
            s += f"; {n} listed class{'es have' if n > 1 else ' has'} no folder (labels kept)"
        if self.converted or self.skipped or self.warnings or self.missing_classes:
            s += f" (see {os.path.join(self.out, 'pack_report.json')})"
        return s


@dataclass(frozen=True)
class PackConfig:
    """A pack's settings, validated once (`configure`); what the inner layers trust.

    Attributes:
        engine: where the work runs (`Engine`: ThreadEngine, ProcessEngine, RayEngine).
        options: what shapes each record (max_pixels, transcode) and the on_error policy.
        shards: number of part files of a planned pack, or None (by size).
        shard_size: target part-file size in bytes of a by-size pack (None when planned).
        seed: seed of the pack-time shuffle.
        overwrite: replace a finished dataset in OUT.
        resume: reuse the shards an unfinished earlier run of the same plan finished.
        progress: show a tqdm bar.
        classes: the class list a folder SRC's labels follow (classes_from), or None.
    """

    engine: Engine
    options: Options
    shards: int | None
    shard_size: int | None
    seed: int
    overwrite: bool
    resume: bool
    progress: bool
    classes: ClassList | None = None


def configure(*, shards=None, shard_size=None, workers=None, seed=0, on_error="skip", overwrite=False,
              max_pixels=DEFAULT_MAX_PIXELS, transcode=NO_TRANSCODE, progress=True, engine=None, ray_address=None,
              resume=True, classes_from=None) -> PackConfig:
    """`pack()`'s arguments (see there) checked and turned into a `PackConfig`."""
    # numbers checked once here (the CLI's click types apply the same bounds): ConfigError
    shards = None if shards is None else bounded_int("shards", shards, 1)  # ≤ items: checked with the plan
    shard_size = None if shard_size is None else parse_size("shard_size", shard_size)
    workers = None if workers is None else bounded_int("workers", workers, 1, MAX_THREADS)
    seed = bounded_int("seed", seed, 0, MAX_SEED)
    max_pixels = bounded_int("max_pixels", max_pixels, 1, MAX_PIXELS)
    if shards is not None and shard_size is not None:
        raise ValueError("give --shards or --shard-size, not both")
    if shards is None and shard_size is None:
        shard_size = DEFAULT_SHARD_SIZE
    if not isinstance(transcode, Transcode):
        raise TypeError(f"transcode must be a Transcode, not {type(transcode).__name__}")
    options = Options(max_pixels, transcode, _on_error(on_error))
    classes = classes_from if classes_from is None or isinstance(classes_from, ClassList) else classes_of(classes_from)
    eng = engine_of(engine, workers, ray_address, transcoding=bool(transcode.max_side or transcode.hw_friendly))
    return PackConfig(eng, options, shards, shard_size, int(seed), bool(overwrite), bool(resume), bool(progress),
                      classes)


def pack(src: str | os.PathLike | Source, out: str | os.PathLike, *, shards: int | None = None,
         shard_size: int | None = None, workers: int | None = None, seed: int = 0, on_error: OnError | str = "skip",
         overwrite: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS, transcode: Transcode = NO_TRANSCODE,
         progress: bool = True, engine: str | Engine | None = None, ray_address: str | None = None,
         resume: bool = True, classes_from: str | os.PathLike | ClassList | None = None) -> Summary:
    """Pack a source into OUT: OFRecord part files, index.rtx, manifest.json (all or nothing).

    Args:
        src: an ImageNet-style folder path, or a `Source` (TFRecordSource, OFRecordSource).
        out: the dataset directory to write (created; must be empty, ours, or --overwrite), or
            an object-store URL (s3://bucket/prefix: packed in a staging folder in $TMPDIR,
            then uploaded, manifest last; see recordtool.format.upload — a staged pack does
            not resume, and Ray shard tasks on other nodes cannot reach the stage).
        shards: number of part files; each is filled by its own task, and a re-run after a
            crash reuses the finished ones. Exclusive with `shard_size`.
        shard_size: target part-file size in bytes (default 128 MiB) when `shards` is not
            given: part files are filled in turn up to it, whatever the engine.
        workers: the local engine's threads (default 2 × cores); the process engine's
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
        engine: "local" (threads of this process), "process" (worker processes: for
            transcoding, whose Python share keeps threads from scaling), "ray" (Ray tasks on
            the cluster of `ray_address`; needs `pip install 'recordtool[ray]'`, and with
            `shards` OUT on storage every node sees), or an `Engine`. Default: "process" when
            `transcode` re-encodes (max_side or hw_friendly), else "local". Same bytes whichever.
        ray_address: the cluster to use: None (RAY_ADDRESS if set, else a new local instance),
            "auto" (the cluster running on this machine), "ray://HOST:PORT", "HOST:PORT" or "local".
        resume: reuse the shards an unfinished earlier run of the same plan finished (planned
            packs only); False starts over.
        classes_from: a packed dataset (its directory, its manifest.json or its URL) whose
            class list and label numbering a folder `src` takes — a validation set packed with
            the training set's labels. A class folder not in that list is a PackError naming
            it; a listed class without a folder keeps its label (`Summary.missing_classes`,
            the report's `missing_classes`). Without it, sorted class folders → 0..K-1.

    SIGTERM and SIGHUP (when they have their default action) stop the workers as Ctrl-C does,
    then end the process by the same signal. Worker processes ignore Ctrl-C: the caller's
    KeyboardInterrupt stops them. The semaphores of a process-engine pack killed with its
    resource tracker (SIGKILL to its process group) are removed by the next pack (Linux), as
    are the staging folders of packs to a URL killed before their cleanup.
    """
    config = configure(shards=shards, shard_size=shard_size, workers=workers, seed=seed, on_error=on_error,
                       overwrite=overwrite, max_pixels=max_pixels, transcode=transcode, progress=progress,
                       engine=engine, ray_address=ray_address, resume=resume, classes_from=classes_from)
    out = os.fspath(out)
    sweep_semaphores()  # what an earlier process-engine pack killed with its tracker left in /dev/shm
    sweep_stages()  # the staging folders of earlier packs to a URL killed before their cleanup
    with stop_on_signals():
        if not is_url(out):
            return _pack_into(src, get_fs(out)[1], config)  # a local path (file:// URLs too)
        from ..format.upload import staged  # object storage: pack locally, then publish, manifest last

        with staged(out, config.overwrite) as stage:
            s = _pack_into(src, stage, replace(config, resume=False))
        return replace(s, out=out)


def _pack_into(src, out: str, config: PackConfig) -> Summary:
    """The pipeline into a local OUT: source → shuffle → by size or planned → publish."""
    t0 = time.perf_counter()
    if isinstance(src, (str, os.PathLike)):
        from ..sources import registry

        source = registry.open_source(registry.PATH_KIND, registry.SourceArgs((os.fspath(src),), out,
                                                                              classes_from=config.classes))
    elif config.classes is not None:
        raise ConfigError("classes_from applies to a folder SRC given by its path; for a Source of your own, "
                          "make it an ImageFolderSource(..., classes=recordtool.format.manifest.classes_of(...))")
    else:
        source = src
    try:
        policy = config.options.on_error
        for where, why in source.skipped:
            _report(policy, f"{where}: {why}", PackError)
        if policy is OnError.RAISE and source.warnings:
            raise PackError(f"on_error=raise: {source.warnings[0]}")
        shuffled = shuffle(source.items, config.seed)
        if config.shards is None:
            return _by_size(source, shuffled, out, config, t0)
        if config.shards > max(1, len(shuffled)):
            raise ValueError(f"--shards {config.shards} is more than the {len(shuffled)} items to pack")
        return _planned(source, make_plan(source, shuffled, config.shards, config.seed, config.options), out,
                        config, t0)
    finally:
        source.close()


@contextlib.contextmanager
def _bar(show: bool, total: int, desc: str):
    if not show:
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(total=total, unit="rec", desc=desc, mininterval=0.5)
    try:
        yield bar
    finally:
        bar.close()


def _by_size(source, shuffled: list, out: str, config: PackConfig, t0: float) -> Summary:
    """Chunks loaded and fixed on the engine, written in order here, a new part file whenever
    the current one reaches `shard_size` — the same bytes for any engine and worker count."""
    policy = config.options.on_error
    converted, skipped = [], list(source.skipped)
    with DatasetWriter(out, overwrite=config.overwrite, sources=source_paths(source)) as writer:
        with _bar(config.progress, len(shuffled), "pack") as bar, \
                config.engine.session(source, config.options) as run:
            for results, notes in ordered_chunks(run, shuffled):
                merge_notes(source, notes)
                for item, res, label, filename in results:
                    if isinstance(res, Rejected):
                        _report(policy, f"{source.where(item)}: {res}", PackError)
                        skipped.append((source.where(item), str(res)))
                    else:
                        if writer.shard < 0 or writer.shard_bytes() >= config.shard_size:
                            writer.new_shard()
                        if res.converted:
                            converted.append((source.where(item), f"re-encoded: {res.converted}"))
                        writer.add(res.data, res.info, label, filename)
                    if bar is not None:
                        bar.update(1)
            retried = run.retried
        if writer.records() == 0:
            raise _no_record(len(shuffled), skipped)
        _finish(writer, source, config, converted, skipped, writer.max_label())
    return _summary(writer.manifest, out, source, config, t0, converted, skipped, [], retried)


def _planned(source, plan: ShardPlan, out: str, config: PackConfig, t0: float) -> Summary:
    """ShardPlan → shard tasks on the engine → their records merged → publish; the shards an
    unfinished run of the same plan finished are reused."""
    options = plan.options
    with DatasetWriter(out, overwrite=config.overwrite, sources=source_paths(source), plan=plan.marker(),
                       resume=config.resume) as writer:
        partial = os.path.join(os.path.abspath(out), PARTIAL_DIR)  # absolute: Ray workers run elsewhere
        results = {}
        if writer.kept:
            fs, local = get_fs(partial)
            for task in plan.tasks:
                done = finished(task, local, fs)
                if done is not None:
                    results[task.number] = done
        reused = [plan.tasks[k].name for k in sorted(results)]
        todo = [t for t in plan.tasks if t.number not in results]
        retried = 0
        if todo:
            desc = f"pack ({len(reused)} shards reused)" if reused else "pack"
            with _bar(config.progress, sum(len(t.items) for t in todo), desc) as bar, \
                    config.engine.session(source, options) as run:
                for d in run.fill(todo, partial, bar):
                    results[d.number] = d
                retried = run.retried
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
        if sum(s.info["records"] for s in shards) == 0:
            raise _no_record(sum(len(t.items) for t in plan.tasks), skipped)
        max_label = max((max(s.index.labels(), default=-1) for s in shards), default=-1)
        _finish(writer, source, config, converted, skipped, max_label, shards)
    return _summary(writer.manifest, out, source, config, t0, converted, skipped, reused, retried)


def _finish(writer, source, config: PackConfig, converted, skipped, max_label: int, shards=None) -> None:
    """The manifest's fields and the report, handed to the writer (published as its block ends)."""
    classes, class_text = source.classes(max_label)
    o = config.options
    t = o.transcode
    fields = {
        "classes": classes,
        "source": source.describe(),
        "pack": {"seed": config.seed, "shards": config.shards, "shard_size": config.shard_size,
                 "max_pixels": o.max_pixels, "on_error": o.on_error.value, "shuffled": True, "max_side": t.max_side,
                 "quality": t.quality, "hw_friendly": t.hw_friendly},
        "tool": {"name": "recordtool", "version": __version__},
    }
    if class_text:
        fields["class_text"] = class_text
    report = {"source": source.describe(),
              "converted": [{"file": f, "reason": r} for f, r in sorted(converted)],
              "skipped": [{"file": f, "reason": r} for f, r in sorted(skipped)],
              "warnings": source.warnings}
    missing = getattr(source, "missing_classes", [])
    if missing:
        report["missing_classes"] = [{"label": k, "class": name} for k, name in missing]
    writer.finish(fields, report, shards)


def _summary(m: dict, out, source, config, t0, converted, skipped, reused, retried) -> Summary:
    return Summary(out, m["records"], len(m["shards"]), sum(s["bytes"] for s in m["shards"]),
                   time.perf_counter() - t0, sorted(converted), sorted(skipped), source.warnings,
                   engine=config.engine.name, reused=reused, retried=retried,
                   missing_classes=list(getattr(source, "missing_classes", [])))


def _no_record(n, skipped):
    return PackError(f"no record to write: {n} items found, all skipped"
                     + (f" (first: {skipped[0][0]}: {skipped[0][1]})" if skipped else ""))


@contextlib.contextmanager
def stop_on_signals(signums=(signal.SIGTERM, signal.SIGHUP)):
    """For the block, SIGTERM and SIGHUP raise `Signalled` in the main thread (only where they
    have their default action, so a handler of the caller's is left alone): the workers are
    stopped and the output released as on Ctrl-C, then the process ends by that signal, as it
    would have at once. A second signal during that cleanup ends it at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {}

    def handler(signum, frame):
        for s in old:
            signal.signal(s, signal.SIG_DFL)
        raise Signalled(signum)

    for s in signums:
        if signal.getsignal(s) is signal.SIG_DFL:
            old[s] = signal.signal(s, handler)
    try:
        yield
    except Signalled as e:
        for s, h in old.items():
            signal.signal(s, h)
        old.clear()
        os.kill(os.getpid(), e.signum)  # default action: the process ends here
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)

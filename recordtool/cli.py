"""The `recordtool` command."""
from __future__ import annotations

import functools
import json
import os
import sys

import click

from . import checks
from .version import __version__
from .errors import OptionError, RecordtoolError
from .pack.transcode import SPEED_PRESETS


def _errors(command):
    """The one error policy of every command: recordtool's errors, the system's (a missing
    file, a full disk), a bad value and a missing optional package become one line on stderr
    and exit status 1; anything else is a bug and keeps its traceback."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (RecordtoolError, OSError, ValueError, ImportError) as e:
            raise click.ClickException(str(e)) from None

    return run


# Numeric options are bounded where they are declared (recordtool.checks holds the bounds the
# Python API applies too): a value out of range is a usage error, exit 2, naming the option.
class _Size(click.ParamType):
    """A byte size: '128MB', '1GiB', '1.5GB', '1000000', in lo..hi."""

    name = "size"

    def __init__(self, lo: int = 1, hi: int = checks.MAX_SHARD_SIZE):
        self.lo, self.hi = lo, hi

    def convert(self, value, param, ctx):
        try:
            return checks.parse_size("the size", value, self.lo, self.hi)
        except OptionError as e:
            self.fail(str(e), param, ctx)


class _Ints(click.ParamType):
    """Comma-separated integers, each in lo..hi, at least one."""

    name = "ints"

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        try:
            return checks.parse_ints("each value", value, self.lo, self.hi)
        except OptionError as e:
            self.fail(str(e), param, ctx)


class _Finite(click.FloatRange):
    """A float in min..max, NaN refused too (click's FloatRange lets NaN through)."""

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if v != v:
            self.fail(f"{value!r} is not a number", param, ctx)
        return v


_THREADS = click.IntRange(1, checks.MAX_THREADS)
_SEED = click.IntRange(0, checks.MAX_SEED)
_CLASSES = click.IntRange(1, checks.CLASSES_LIMIT)
_BATCH = click.IntRange(1, checks.MAX_BATCH)
_EPOCHS = click.IntRange(1, checks.MAX_EPOCHS)


def _policy(on_error, strict: bool) -> str:
    """--strict is --on-error raise; both at once must agree."""
    if strict and on_error not in (None, "raise"):
        raise click.UsageError(f"--strict contradicts --on-error {on_error}")
    return "raise" if strict else (on_error or "skip")


class DatasetPath(click.Path):
    """A dataset directory that must exist, or an object-store URL (s3://bucket/prefix, gs://…)."""

    def convert(self, value, param, ctx):
        from .io.fs import is_url

        return value if is_url(value) else super().convert(value, param, ctx)


_DATASET = DatasetPath(exists=True, file_okay=False)


def _cache_dir(f):
    return click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
                        help="Local cache of a remote dataset's files (default $RECORDTOOL_CACHE_DIR, "
                        "else ~/.cache/recordtool).")(f)


def _cache_limit(f):
    return click.option("--cache-limit", type=_Size(hi=checks.MAX_CACHE_LIMIT), default=None,
                        help="Bytes of shards the local cache may hold for a remote dataset, e.g. 20GB "
                        "(default: the whole dataset, at most 80% of the free disk).")(f)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="recordtool")
def main():
    """Pack image datasets into OFRecord shards with an index, and read them fast."""
    import faulthandler

    # a shard truncated in place while mapped kills the process with SIGBUS (README, Security):
    # at least say where (not possible when stderr is no file, e.g. under click's test runner)
    try:
        faulthandler.enable()
    except (ValueError, OSError, AttributeError):
        pass


@main.command()
@click.argument("src", nargs=-1, required=True)
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--from", "kind", type=click.Choice(["folder", "tfrecord", "ofrecord"]), default="folder",
              show_default=True, help="What SRC is: an ImageNet-style folder, TFRecord files (globs allowed), "
              "or a folder of OFRecord part files to re-shard.")
@click.option("--shards", type=click.IntRange(1), default=None, help="Number of part files (default: by --shard-size).")
@click.option("--shard-size", type=_Size(), default=None,
              help="Target part file size, e.g. 128MB (default 128MB): without --shards, "
              "part files are filled in turn up to it, whatever the engine.")
@click.option("--workers", type=_THREADS, default=None,
              help="Reader threads (default 2×cores); with --engine process, "
              "processes (default: cores); with --engine ray, the CPUs of the local Ray instance it starts. Output is "
              "the same for any value.")
@click.option("--seed", type=_SEED, default=0, show_default=True, help="Seed of the pack-time shuffle across shards.")
@click.option("--on-error", "on_error", type=click.Choice(["skip", "warn", "raise"]), default=None,
              help="A file or record that cannot be packed: skip it (default; listed in pack_report.json), "
              "warn and skip, or raise (stop, nothing published).")
@click.option("--strict", is_flag=True, help="Same as --on-error raise.")
@click.option("--overwrite", is_flag=True, help="Replace a finished dataset in OUT.")
@click.option("--max-pixels", type=click.IntRange(1, checks.MAX_PIXELS), default=None,
              help="Reject images declaring more pixels (default 64 Mpx).")
@click.option("--preset", type=click.Choice(["fast", "balanced", "lossless", "tf-slim", "tfds"]), default=None,
              help="Speed preset (measured by `recordtool tune`, see README): lossless = JPEG bytes as they are; "
              + "; ".join(f"{k} = --max-side {t.max_side} --quality {t.quality}" + (" --hw-friendly" if t.hw_friendly else "")
                          for k, t in SPEED_PRESETS.items() if t.max_side)
              + ". --max-side/--quality given as well override the preset's. "
              "tf-slim and tfds: the same as --keys (kept as an alias).")
@click.option("--keys", type=click.Choice(["tf-slim", "tfds"]), default=None,
              help="TFRecord feature keys: tf-slim (image/encoded, 1-based image/class/label) or tfds (image, label).")
@click.option("--image-key", default=None, help="TFRecord/OFRecord feature holding the image bytes.")
@click.option("--label-key", default=None, help="TFRecord/OFRecord feature holding the integer label.")
@click.option("--label-offset", type=click.IntRange(-checks.CLASSES_LIMIT, checks.CLASSES_LIMIT), default=None,
              help="Added to TFRecord labels (tf-slim: -1).")
@click.option("--filename-key", default=None, help="TFRecord feature holding the file name.")
@click.option("--compression", type=click.Choice(["auto", "none", "gzip", "zlib"]), default="auto",
              show_default=True, help="TFRecord file compression.")
@click.option("--max-side", type=click.IntRange(1, checks.MAX_SIDE), default=None,
              help="Shrink images whose longer side exceeds this (re-encoded).")
@click.option("--quality", type=click.IntRange(1, 100), default=None,
              help="JPEG quality of every re-encoded image (default 95, or the preset's).")
@click.option("--hw-friendly", is_flag=True,
              help="Re-encode JPEGs NVIDIA's hardware decoder cannot take (progressive, 4:1:1, ...) as baseline 4:2:0.")
@click.option("--max-classes", type=_CLASSES, default=None,
              help="Refuse records with a label at or above this (default 1,000,000): a class name is stored per label.")
@click.option("--max-inflate", type=_Finite(1, checks.MAX_INFLATE), default=None,
              help="A GZIP/ZLIB TFRecord may inflate to this many times its size, at least 256 MiB (default 20); "
              "the rest is skipped and reported.")
@click.option("--engine", type=click.Choice(["local", "process", "ray"]), default=None,
              help="local: threads of this process (default without transcoding). process: worker processes, one "
              "per core (default when transcoding: its Python share keeps threads from scaling). ray: Ray tasks on a "
              "Ray cluster (pip install 'recordtool[ray]'); with --shards one task per part file, writing into OUT, "
              "which must then be on storage every node sees. The same bytes whichever, with or without --shards.")
@click.option("--ray-address", default=None,
              help="With --engine ray: auto (the cluster running here), ray://HOST:PORT, HOST:PORT, or local "
              "(a new instance; default unless RAY_ADDRESS is set).")
@click.option("--no-resume", is_flag=True,
              help="Start over instead of reusing the shards an unfinished earlier run of the same pack finished.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@_errors
def pack(src, out, kind, shards, shard_size, workers, seed, on_error, strict, overwrite, max_pixels, preset, keys,
         image_key, label_key, label_offset, filename_key, compression, max_side, quality, hw_friendly, max_classes,
         max_inflate, engine, ray_address, no_resume, quiet):
    """Pack SRC into OUT: OFRecord part files, index.rtx, manifest.json.

    OUT may be a URL (s3://bucket/prefix, any fsspec URL): the dataset is packed in a local
    staging folder, then uploaded, manifest last. TFRecord SRC may be URLs and globs too.

    Folders (SRC/<class>/<image>) get torchvision ImageFolder labels (sorted class folders →
    0..K-1). JPEG bytes are copied unchanged; CMYK JPEGs, PNGs and other images are converted
    to RGB JPEG; unreadable files or records are skipped and listed in OUT/pack_report.json.
    With --shards each part file is filled by its own task; a re-run after a crash reuses the
    part files the killed run finished. SIGTERM and SIGHUP stop the workers as Ctrl-C does.
    """
    from .format.manifest import MAX_CLASSES
    from .pack import pack as run_pack
    from .format.jpeg import DEFAULT_MAX_PIXELS
    from .sources.tfrecord import DEFAULT_MAX_INFLATE, PRESETS

    policy = _policy(on_error, strict)
    if preset in PRESETS:  # the old spelling of --keys
        if keys not in (None, preset):
            raise click.UsageError(f"--preset {preset} contradicts --keys {keys}")
        keys, preset = preset, None
    transcode = _transcode(preset, max_side, quality, hw_friendly)
    max_classes = max_classes or MAX_CLASSES
    source = None
    try:
        if kind != "tfrecord" and (len(src) != 1 or not os.path.isdir(src[0])):
            raise click.UsageError(_not_a_folder(kind, src))
        if kind == "folder":
            from .sources.imagefolder import ImageFolderSource

            source = ImageFolderSource(src[0], exclude=(out,), max_classes=max_classes)
        elif kind == "ofrecord":
            from .sources.ofrecord import OFRecordSource

            source = OFRecordSource(src[0], image_key=image_key or "encoded", label_key=label_key or "class/label",
                                    on_error=policy, max_classes=max_classes)
        else:
            from .sources.tfrecord import TFRecordSource

            if keys is None and not (image_key and label_key):
                raise click.UsageError("--from tfrecord needs --keys or both --image-key and --label-key")
            feature_keys = dict(PRESETS[keys]) if keys else {"image": None, "label": None, "label_offset": 0,
                                                             "filename": None, "synset": None, "text": None}
            for k, v in (("image", image_key), ("label", label_key), ("label_offset", label_offset),
                         ("filename", filename_key)):
                if v is not None:
                    feature_keys[k] = v
            feature_keys["preset"] = keys
            from .io.fs import is_url

            parent = None  # remote OUT: scratch in $TMPDIR
            if not is_url(out):
                parent = os.path.dirname(os.path.abspath(out))
                os.makedirs(parent, exist_ok=True)  # GZIP/ZLIB files are inflated beside OUT
            source = TFRecordSource(src, feature_keys, tmpdir=parent, compression=compression, on_error=policy,
                                    max_inflate=max_inflate or DEFAULT_MAX_INFLATE, max_classes=max_classes)
        summary = run_pack(source, out, shards=shards, shard_size=shard_size,
                           workers=workers, seed=seed, on_error=policy, overwrite=overwrite,
                           max_pixels=max_pixels or DEFAULT_MAX_PIXELS, transcode=transcode,
                           progress=not quiet, engine=engine, ray_address=ray_address, resume=not no_resume)
    finally:
        if source is not None:  # scratch files (inflated TFRecords) and mappings go, whatever happened
            source.close()
    for w in summary.warnings:
        click.echo(f"warning: {w}", err=True)
    for f, why in summary.skipped[:10]:
        click.echo(f"skipped {f}: {why}", err=True)
    if len(summary.skipped) > 10:
        click.echo(f"… {len(summary.skipped) - 10} more skipped", err=True)
    if summary.reused:
        more = f", … {len(summary.reused) - 10} more" if len(summary.reused) > 10 else ""
        click.echo(f"reused {', '.join(summary.reused[:10])}{more} (finished by an earlier run)", err=True)
    click.echo(summary.line())


def _not_a_folder(kind: str, src) -> str:
    """Why SRC is refused for --from folder/ofrecord, with the option the user likely meant."""
    what = src[0] if len(src) == 1 else f"{len(src)} paths"
    if len(src) == 1 and not os.path.lexists(src[0]) and not any(ch in src[0] for ch in "*?["):
        why = f"SRC {src[0]} does not exist"
    else:
        why = f"--from {kind} takes one SRC folder, not {what}"
    if kind == "folder":
        return (f"{why}. For TFRecord files (globs allowed: 'train-*'), add --from tfrecord --keys tf-slim|tfds; "
                "for a folder of OFRecord part files, --from ofrecord")
    return why


def _transcode(preset, max_side, quality, hw_friendly):
    """A speed preset's Transcode with the options given explicitly on top."""
    import dataclasses

    from .pack.transcode import NO_TRANSCODE

    t = SPEED_PRESETS[preset] if preset else NO_TRANSCODE
    changes = {"max_side": max_side, "quality": quality, "hw_friendly": True if hw_friendly else None}
    return dataclasses.replace(t, **{k: v for k, v in changes.items() if v is not None})


@main.command("index")
@click.argument("root", type=click.Path(exists=True, file_okay=False))
@click.option("--image-key", default="encoded", show_default=True)
@click.option("--label-key", default="class/label", show_default=True)
@click.option("--on-error", "on_error", type=click.Choice(["skip", "warn", "raise"]), default=None,
              help="A record that cannot be indexed: skip it (default; listed in the manifest), warn, or raise.")
@click.option("--strict", is_flag=True, help="Same as --on-error raise.")
@click.option("--max-classes", type=_CLASSES, default=None,
              help="Leave out records with a label at or above this (default 1,000,000).")
@click.option("--quiet", "-q", is_flag=True)
@_errors
def index_cmd(root, image_key, label_key, on_error, strict, max_classes, quiet):
    """Build index + manifest for OFRecord part files made elsewhere (e.g. OneFlow's)."""
    from .format.manifest import MAX_CLASSES
    from .format.scan import index_parts

    m = index_parts(root, image_key=image_key, label_key=label_key, on_error=_policy(on_error, strict),
                    progress=not quiet, max_classes=max_classes or MAX_CLASSES)
    for s in m["skipped"][:10]:
        click.echo(f"left out: {s['reason']}", err=True)
    click.echo(f"indexed {m['records']} records in {len(m['shards'])} shards; "
               f"{len(m['skipped'])} left out")


@main.command()
@click.argument("root", type=_DATASET)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_cache_dir
@_errors
def inspect(root, as_json, cache_dir):
    """Counts, classes, sizes, chroma/progressive mix and shards of a dataset (a directory, or a
    URL such as s3://bucket/prefix: only its manifest and index are fetched)."""
    from .inspect import render, summarize

    s = summarize(root, cache_dir=cache_dir)
    click.echo(json.dumps(s, indent=1) if as_json else render(s))


@main.command()
@click.argument("root", type=_DATASET)
@click.option("--decode", is_flag=True, help="Also decode every image and check its size.")
@click.option("--threads", type=_THREADS, default=None, help="Decode threads (default: cores).")
@_cache_dir
@_cache_limit
@click.option("--quiet", "-q", is_flag=True)
@_errors
def verify(root, decode, threads, cache_dir, cache_limit, quiet):
    """Re-read every record; exit 0 only if shards, index and manifest are intact. ROOT may be a
    URL (s3://bucket/prefix): its shards are downloaded through the local cache in turn."""
    from .verify import verify as run_verify

    res = run_verify(root, decode=decode, threads=threads, progress=not quiet, cache_dir=cache_dir,
                     cache_limit=cache_limit)
    if not res.ok:
        click.echo(f"FAILED: {res.errors[0]}", err=True)
        for e in res.errors[1:]:
            click.echo(f"  also: {e}", err=True)
        sys.exit(1)
    click.echo(f"OK: {res.records} records verified" + (f", {res.decoded} decoded" if decode else ""))


@main.command()
@click.argument("root", type=click.Path(exists=True, file_okay=False))
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Decode on the CPU (native threads) or the GPU (NVJPG engines + CPU, auto split).")
@click.option("--batch-size", type=_BATCH, default=256, show_default=True, help="Images per batch.")
@click.option("--threads", type=_THREADS, default=None,
              help="CPU decode threads, and baseline processes (default: cores).")
@click.option("--epochs", type=_EPOCHS, default=2, show_default=True, help="Loader epochs timed (the first warms up).")
@click.option("--images", type=click.IntRange(1), default=None, help="Use only this many records (default: all).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write all numbers here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of every pipeline's img/s side by side (needs matplotlib: pip install "
              "'recordtool[plot]').")
@click.option("--producers", type=_THREADS, default=None, help="Loader producer threads (default: the Loader's).")
@click.option("--dali/--no-dali", default=True, show_default=True,
              help="Run NVIDIA DALI's pipeline on the same records when nvidia.dali imports.")
@click.option("--dali-files", type=click.Path(exists=True, file_okay=False), default=None,
              help="Also run DALI reading this ImageNet-style folder's JPEG files (the original files).")
@click.option("--baseline/--no-baseline", default=True, show_default=True, help="Run the Pillow baseline.")
@click.option("--train", "train_arch", default=None, metavar="ARCH",
              help="Train this torchvision model (resnet50, resnet18, …) with each pipeline instead: "
                   "synthetic, the Loader, DALI and torchvision on --dali-files (recordtool.tools.train_bench).")
@click.option("--steps", type=click.IntRange(1, 100000), default=50, show_default=True,
              help="--train: timed steps per run (after 15 warm-up steps).")
@click.option("--repeats", type=click.IntRange(1, 100), default=3, show_default=True,
              help="--train: runs of each pipeline, interleaved.")
@click.option("--pipelines", default="synthetic;recordtool;dali;torchvision", show_default=True,
              help="--train: ';'-separated; 'recordtool:split=gpu,producers=2' sets Loader options.")
@click.option("--compile", "compile_", is_flag=True, help="--train: torch.compile the model.")
@click.option("--consumer-ms", type=click.FloatRange(0, 10000), default=60.0, show_default=True,
              help="--train with --device cpu: CPU milliseconds the consumer spends per batch (no model).")
@click.option("--op", type=click.Choice(["grayscale", "cutout", "jitter"]), default=None,
              help="Also run the Loader with this user op compiled (recordtool.ops, needs recordtool[numba]) and as "
                   "a batch op, and DALI with its own counterpart (fn.hsv, fn.erase, fn.color_twist).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@_errors
def bench(root, device, batch_size, threads, epochs, images, json_path, plot_path, producers, dali, dali_files,
          baseline, op, train_arch, steps, repeats, pipelines, compile_, consumer_ms, quiet):
    """Measure read, the decode stage and the full Loader on ROOT, against DALI and Pillow.

    DALI (RandomResizedCrop → resize → flip → normalize; on cuda the best of hw_decoder_load
    0.65/0.75/0.9) and the Pillow baseline (decode + RandomResizedCrop + ToTensor, one process per
    thread) run on the same records, batch and threads in the same run; the table gives ratios.

    With --train ARCH: end-to-end training throughput instead — the model trained with synthetic
    data, the Loader, DALI and torchvision's DataLoader (the last two on --dali-files) in turn,
    each --repeats times; img/s, ratios to synthetic and DALI, the host's wait per step.
    """
    from .tools import plots
    from .tools.bench import run, table

    if train_arch is not None:
        from .tools import train_bench

        names = [p for p in pipelines.split(";") if p]
        if dali_files is None:
            names = [p for p in names if p.partition(":")[0] not in ("dali", "torchvision")]
        res = train_bench.run(root, dali_files, train_arch, None, batch_size, steps, 15, repeats, names, threads,
                              device, compile_, consumer_ms, log=lambda m: None if quiet else click.echo(m))
        click.echo(train_bench.table(res))
        if json_path:
            train_bench.write_json(res, json_path)
        return

    if plot_path:
        plots.require()  # before the measurement, not after it
    r = run(root, device=device, batch_size=batch_size, threads=threads, epochs=epochs, images=images,
            progress=not quiet, dali=dali, dali_files=dali_files, baseline=baseline, producers=producers, op=op)
    click.echo(table(r))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(r, f, indent=1, default=str)
    if plot_path:
        plots.bench(r, plot_path)


@main.command()
@click.argument("src", type=click.Path(exists=True, file_okay=False))
@click.option("--images", type=click.IntRange(1), default=1000, show_default=True,
              help="Sample size, drawn with --seed.")
@click.option("--seed", type=_SEED, default=0, show_default=True,
              help="Seed of the sample, the crop windows and loaders.")
@click.option("--sides", type=_Ints(1, checks.MAX_SIDE), default=",".join(map(str, (256, 320, 384, 448, 512))),
              show_default=True,
              help="--max-side candidates, comma-separated.")
@click.option("--qualities", type=_Ints(1, 100), default=",".join(map(str, (75, 85, 90, 95))), show_default=True,
              help="--quality candidates, comma-separated (each side is tried with each quality).")
@click.option("--min-psnr", type=_Finite(0, 200), default=35.0, show_default=True,
              help="Recommend among candidates whose median crop PSNR against the originals is at least this (dB).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Loaders to time: auto = the CPU, and the GPU too when CuPy finds one.")
@click.option("--batch-size", type=_BATCH, default=128, show_default=True, help="Loader batch size.")
@click.option("--epochs", type=_EPOCHS, default=5, show_default=True,
              help="Loader epochs per candidate; the first warms up, the median of the others counts (their "
              "spread is shown and taken into account by the recommendation).")
@click.option("--threads", type=_THREADS, default=None, help="Decode threads (default: cores).")
@click.option("--workers", type=_THREADS, default=None, help="Pack workers (default 2×cores).")
@click.option("--work-dir", type=click.Path(file_okay=False), default=None,
              help="Where the temporary folder for the sample's packs is made (default: the system's temp dir).")
@click.option("--keep", is_flag=True, help="Keep the packs (their folder is printed) instead of removing them.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write all numbers here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of speed against fidelity, the recommended point marked (needs matplotlib: "
              "pip install 'recordtool[plot]').")
@click.option("--quiet", "-q", is_flag=True, help="No line per candidate.")
@_errors
def tune(src, images, seed, sides, qualities, min_psnr, device, batch_size, epochs, threads, workers, work_dir, keep,
         json_path, plot_path, quiet):
    """Measure what --max-side / --quality buy on a sample of SRC (an ImageNet-style folder).

    Packs the sample as it is and with every side × quality candidate (in a temporary folder,
    removed afterwards), times the real Loader on each, and compares its 224² RandomResizedCrop
    outputs with Pillow's from the original files under the same windows (PSNR, SSIM). Prints
    a table and the fastest candidate within --min-psnr; `pack --preset` names measured settings.
    """
    from .tools import plots
    from .tools.tune import candidates, gpu_available, run, table

    if plot_path:
        plots.require()  # before the measurement, not after it
    cands = candidates(sides, qualities)
    if device == "cuda" and not gpu_available():
        raise click.UsageError("--device cuda: CuPy finds no GPU here")
    devices = ("cpu", "cuda") if device == "cuda" or (device == "auto" and gpu_available()) else ("cpu",)
    r = run(src, images=images, seed=seed, cands=cands, min_psnr=min_psnr, devices=devices,
            batch_size=batch_size, epochs=epochs, threads=threads, workers=workers, work_dir=work_dir,
            keep=keep, progress=not quiet)
    click.echo(table(r))
    if keep:
        click.echo(f"packs kept in {r['work_dir']}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(r, f, indent=1, default=str)
    if plot_path:
        plots.tune(r, plot_path)


if __name__ == "__main__":
    main()

"""`recordtool pack` and `recordtool index`: the commands that write a dataset."""
from __future__ import annotations

import click

from .. import checks
from ..pack.transcode import SPEED_PRESETS
from ..sources import registry
from ..sources.base import SourceArgs
from .options import CLASSES, Finite, SEED, Size, THREADS, errors, on_error_policy


@click.command()
@click.argument("src", nargs=-1, required=True)
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--from", "kind", type=click.Choice(registry.cli_names()),
              default=registry.cli_name(registry.source_class(registry.PATH_KIND)),
              show_default=True, help="What SRC is: an ImageNet-style folder, TFRecord files (globs allowed), "
              "or a folder of OFRecord part files to re-shard.")
@click.option("--shards", type=click.IntRange(1), default=None, help="Number of part files (default: by --shard-size).")
@click.option("--shard-size", type=Size(), default=None,
              help="Target part file size, e.g. 128MB (default 128MB): without --shards, "
              "part files are filled in turn up to it, whatever the engine.")
@click.option("--workers", type=THREADS, default=None,
              help="Reader threads (default 2×cores); with --engine process, "
              "processes (default: cores); with --engine ray, the CPUs of the local Ray instance it starts. Output is "
              "the same for any value.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the pack-time shuffle across shards.")
@click.option("--on-error", "on_error", type=click.Choice(["skip", "warn", "raise"]), default=None,
              help="A file or record that cannot be packed: skip it (default; listed in pack_report.json), "
              "warn and skip, or raise (stop, nothing published).")
@click.option("--strict", is_flag=True, help="Same as --on-error raise.")
@click.option("--overwrite", is_flag=True, help="Replace a finished dataset in OUT.")
@click.option("--max-pixels", type=click.IntRange(1, checks.MAX_PIXELS), default=None,
              help="Reject images declaring more pixels (default 64 Mpx).")
@click.option("--preset", type=click.Choice(["fast", "balanced", "lossless"]), default=None,
              help="Speed preset (measured by `recordtool tune`, see README): lossless = JPEG bytes as they are; "
              + "; ".join(f"{k} = --max-side {t.max_side} --quality {t.quality}" + (" --hw-friendly" if t.hw_friendly else "")
                          for k, t in SPEED_PRESETS.items() if t.max_side)
              + ". --max-side/--quality given as well override the preset's.")
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
@click.option("--max-classes", type=CLASSES, default=None,
              help="Refuse records with a label at or above this (default 1,000,000): a class name is stored per label.")
@click.option("--max-inflate", type=Finite(1, checks.MAX_INFLATE), default=None,
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
@click.option("--classes-from", "classes_from", default=None, metavar="TRAIN",
              help="--from folder: take the class list and labels of this packed dataset (its directory, its "
              "manifest.json or its URL), e.g. the training set's when packing the validation set. A class "
              "folder not in that list is an error; a listed class with no folder keeps its label.")
@click.option("--no-resume", is_flag=True,
              help="Start over instead of reusing the shards an unfinished earlier run of the same pack finished.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@errors
def pack(src, out, kind, shards, shard_size, workers, seed, on_error, strict, overwrite, max_pixels, preset, keys,
         image_key, label_key, label_offset, filename_key, compression, max_side, quality, hw_friendly, max_classes,
         max_inflate, engine, ray_address, classes_from, no_resume, quiet):
    """Pack SRC into OUT: OFRecord part files, index.rtx, manifest.json.

    OUT may be a URL (s3://bucket/prefix, any fsspec URL): the dataset is packed in a local
    staging folder, then uploaded, manifest last. TFRecord SRC may be URLs and globs too.

    Folders (SRC/<class>/<image>) get torchvision ImageFolder labels (sorted class folders →
    0..K-1; hidden entries, named '.…', are skipped and listed), or with --classes-from those
    of a packed dataset. JPEG bytes are copied unchanged; CMYK JPEGs, PNGs and other images are converted
    to RGB JPEG; unreadable files or records are skipped and listed in OUT/pack_report.json.
    With --shards each part file is filled by its own task; a re-run after a crash reuses the
    part files the killed run finished. SIGTERM and SIGHUP stop the workers as Ctrl-C does
    (Ctrl-C: one line, exit status 130).
    """
    from ..format.manifest import MAX_CLASSES
    from ..pack import pack as run_pack
    from ..format.jpeg import DEFAULT_MAX_PIXELS

    policy = on_error_policy(on_error, strict)
    transcode = _transcode(preset, max_side, quality, hw_friendly)
    args = SourceArgs(tuple(src), out, on_error=policy, max_classes=max_classes or MAX_CLASSES,
                      classes_from=classes_from, keys=keys, image_key=image_key, label_key=label_key,
                      label_offset=label_offset, filename_key=filename_key, compression=compression,
                      max_inflate=max_inflate)
    why = registry.usage(kind, args)
    if why is not None:
        raise click.UsageError(why)
    source = None
    try:
        source = registry.open_source(kind, args)
        summary = run_pack(source, out, shards=shards, shard_size=shard_size,
                           workers=workers, seed=seed, on_error=policy, overwrite=overwrite,
                           max_pixels=max_pixels or DEFAULT_MAX_PIXELS, transcode=transcode,
                           progress=not quiet, engine=engine, ray_address=ray_address, resume=not no_resume)
    finally:
        if source is not None:  # scratch files (inflated TFRecords) and mappings go, whatever happened
            source.close()
    for w in summary.warnings:
        click.echo(f"warning: {w}", err=True)
    if summary.missing_classes:
        names = ", ".join(f"{name!r} ({k})" for k, name in summary.missing_classes[:10])
        more = f", … {len(summary.missing_classes) - 10} more" if len(summary.missing_classes) > 10 else ""
        click.echo(f"classes of {classes_from} with no folder in SRC (labels kept): {names}{more}", err=True)
    for f, why in summary.skipped[:10]:
        click.echo(f"skipped {f}: {why}", err=True)
    if len(summary.skipped) > 10:
        click.echo(f"… {len(summary.skipped) - 10} more skipped", err=True)
    if summary.reused:
        more = f", … {len(summary.reused) - 10} more" if len(summary.reused) > 10 else ""
        click.echo(f"reused {', '.join(summary.reused[:10])}{more} (finished by an earlier run)", err=True)
    click.echo(summary.line())


def _transcode(preset, max_side, quality, hw_friendly):
    """A speed preset's Transcode with the options given explicitly on top."""
    import dataclasses

    from ..pack.transcode import NO_TRANSCODE

    t = SPEED_PRESETS[preset] if preset else NO_TRANSCODE
    changes = {"max_side": max_side, "quality": quality, "hw_friendly": True if hw_friendly else None}
    return dataclasses.replace(t, **{k: v for k, v in changes.items() if v is not None})


@click.command("index")
@click.argument("root", type=click.Path(exists=True, file_okay=False))
@click.option("--image-key", default="encoded", show_default=True)
@click.option("--label-key", default="class/label", show_default=True)
@click.option("--on-error", "on_error", type=click.Choice(["skip", "warn", "raise"]), default=None,
              help="A record that cannot be indexed: skip it (default; listed in the manifest), warn, or raise.")
@click.option("--strict", is_flag=True, help="Same as --on-error raise.")
@click.option("--max-classes", type=CLASSES, default=None,
              help="Leave out records with a label at or above this (default 1,000,000).")
@click.option("--quiet", "-q", is_flag=True)
@errors
def index_cmd(root, image_key, label_key, on_error, strict, max_classes, quiet):
    """Build index + manifest for OFRecord part files made elsewhere (e.g. OneFlow's)."""
    from ..format.manifest import MAX_CLASSES
    from ..format.scan import index_parts

    m = index_parts(root, image_key=image_key, label_key=label_key, on_error=on_error_policy(on_error, strict),
                    progress=not quiet, max_classes=max_classes or MAX_CLASSES)
    for s in m["skipped"][:10]:
        click.echo(f"left out: {s['reason']}", err=True)
    click.echo(f"indexed {m['records']} records in {len(m['shards'])} shards; "
               f"{len(m['skipped'])} left out")

"""The `recordtool` command."""
from __future__ import annotations

import json
import sys

import click

from . import __version__


def _size(text: str) -> int:
    """'256MB', '1GiB', '1000000' → bytes."""
    t = text.strip().upper().replace("IB", "B")
    mult = {"KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40, "B": 1}
    for suffix, m in mult.items():
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * m)
    return int(t)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="recordtool")
def main():
    """Pack image datasets into OFRecord shards with an index, and read them fast."""


@main.command()
@click.argument("src", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--shards", type=int, default=None, help="Number of part files (default: by --shard-size).")
@click.option("--shard-size", default=None, help="Target part file size, e.g. 128MB (default 128MB).")
@click.option("--workers", type=int, default=None, help="Reader threads (default 2×cores). Output is the same for any value.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the pack-time shuffle across shards.")
@click.option("--strict", is_flag=True, help="Fail on the first file that cannot be packed instead of skipping it.")
@click.option("--overwrite", is_flag=True, help="Replace a finished dataset in OUT.")
@click.option("--max-pixels", type=int, default=None, help="Reject images declaring more pixels (default 64 Mpx).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def pack(src, out, shards, shard_size, workers, seed, strict, overwrite, max_pixels, quiet):
    """Pack an ImageNet-style folder SRC (SRC/<class>/<image>) into OUT.

    Labels follow torchvision's ImageFolder (sorted class folders → 0..K-1). JPEG bytes are
    copied unchanged; CMYK JPEGs, PNGs and other images are converted to RGB JPEG (q95);
    unreadable files are skipped and listed in OUT/pack_report.json.
    """
    from .pack import PackError, pack as run_pack
    from .sources.image import DEFAULT_MAX_PIXELS

    try:
        summary = run_pack(src, out, shards=shards, shard_size=_size(shard_size) if shard_size else None,
                           workers=workers, seed=seed, strict=strict, overwrite=overwrite,
                           max_pixels=max_pixels or DEFAULT_MAX_PIXELS, progress=not quiet)
    except (PackError, FileExistsError, FileNotFoundError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    for w in summary.warnings:
        click.echo(f"warning: {w}", err=True)
    for f, why in summary.skipped[:10]:
        click.echo(f"skipped {f}: {why}", err=True)
    if len(summary.skipped) > 10:
        click.echo(f"… {len(summary.skipped) - 10} more skipped", err=True)
    click.echo(summary.line())


@main.command("index")
@click.argument("root", type=click.Path(exists=True, file_okay=False))
@click.option("--image-key", default="encoded", show_default=True)
@click.option("--label-key", default="class/label", show_default=True)
@click.option("--strict", is_flag=True, help="Fail on the first record that cannot be indexed.")
@click.option("--quiet", "-q", is_flag=True)
def index_cmd(root, image_key, label_key, strict, quiet):
    """Build index + manifest for OFRecord part files made elsewhere (e.g. OneFlow's)."""
    from .format.ofrecord import FormatError
    from .format.scan import index_parts

    try:
        m = index_parts(root, image_key=image_key, label_key=label_key, strict=strict, progress=not quiet)
    except (FormatError, OSError) as e:
        raise click.ClickException(str(e)) from None
    for s in m["skipped"][:10]:
        click.echo(f"left out: {s['reason']}", err=True)
    click.echo(f"indexed {m['records']} records in {len(m['shards'])} shards; "
               f"{len(m['skipped'])} left out")


@main.command()
@click.argument("root", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def inspect(root, as_json):
    """Counts, classes, sizes, chroma/progressive mix and shards of a dataset."""
    from .format.ofrecord import FormatError
    from .inspect import render, summarize

    try:
        s = summarize(root)
    except (FormatError, OSError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(s, indent=1) if as_json else render(s))


@main.command()
@click.argument("root", type=click.Path(exists=True, file_okay=False))
@click.option("--decode", is_flag=True, help="Also decode every image and check its size.")
@click.option("--threads", type=int, default=None, help="Decode threads (default: cores).")
@click.option("--quiet", "-q", is_flag=True)
def verify(root, decode, threads, quiet):
    """Re-read every record; exit 0 only if shards, index and manifest are intact."""
    from .verify import verify as run_verify

    res = run_verify(root, decode=decode, threads=threads, progress=not quiet)
    if not res.ok:
        click.echo(f"FAILED: {res.errors[0]}", err=True)
        for e in res.errors[1:]:
            click.echo(f"  also: {e}", err=True)
        sys.exit(1)
    click.echo(f"OK: {res.records} records verified" + (f", {res.decoded} decoded" if decode else ""))


if __name__ == "__main__":
    main()

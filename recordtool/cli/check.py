"""`recordtool inspect` and `recordtool verify`: what a dataset holds, and whether it is whole."""
from __future__ import annotations

import json
import sys

import click

from .options import DATASET, THREADS, cache_dir_option, cache_limit_option, errors


@click.command()
@click.argument("root", type=DATASET)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--classes-of", "classes_of", default=None, metavar="TRAIN",
              help="Compare the class list with this dataset's (directory, manifest.json or URL), e.g. the training "
              "set of a validation set: a warning line names missing, extra and renumbered classes.")
@cache_dir_option
@errors
def inspect(root, as_json, classes_of, cache_dir):
    """Counts, classes, sizes, chroma/progressive mix and shards of a dataset (a directory, or a
    URL such as s3://bucket/prefix: only its manifest and index are fetched)."""
    from ..inspect import render, summarize

    s = summarize(root, classes_of=classes_of, cache_dir=cache_dir)
    click.echo(json.dumps(s, indent=1) if as_json else render(s))


@click.command()
@click.argument("root", type=DATASET)
@click.option("--decode", is_flag=True, help="Also decode every image and check its size.")
@click.option("--threads", type=THREADS, default=None, help="Decode threads (default: cores).")
@cache_dir_option
@cache_limit_option
@click.option("--quiet", "-q", is_flag=True)
@errors
def verify(root, decode, threads, cache_dir, cache_limit, quiet):
    """Re-read every record; exit 0 only if shards, index and manifest are intact. ROOT may be a
    URL (s3://bucket/prefix): its shards are downloaded through the local cache in turn."""
    from ..verify import verify as run_verify

    res = run_verify(root, decode=decode, threads=threads, progress=not quiet, cache_dir=cache_dir,
                     cache_limit=cache_limit)
    if not res.ok:
        click.echo(f"FAILED: {res.errors[0]}", err=True)
        for e in res.errors[1:]:
            click.echo(f"  also: {e}", err=True)
        sys.exit(1)
    click.echo(f"OK: {res.records} records verified" + (f", {res.decoded} decoded" if decode else ""))

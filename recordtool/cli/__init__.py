"""The `recordtool` command: the group here, one module per command group —
write.py (`pack`, `index`), check.py (`inspect`, `verify`), measure.py (`bench`, `tune`) — and
options.py for what they share (the one error decorator, bounded option types)."""
from __future__ import annotations

import click

from ..version import __version__
from .check import inspect, verify
from .measure import bench, tune
from .write import index_cmd, pack


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


for _command in (pack, index_cmd, inspect, verify, bench, tune):
    main.add_command(_command)

"""The source kinds pack reads, by name: importing this module registers the source class of
every source module of recordtool (sources.base.register), in the order `--from` lists them. A
new input format is one module in sources/ with a source class, and its class named here;
`register` also takes a class defined elsewhere.

The CLI's `--from` choices and pack's opening of a source by name read this table; nothing
else lists the kinds.
"""
from __future__ import annotations

from ..errors import ConfigError
from . import imagefolder, ofrecord, tfrecord
from .base import SourceArgs, cli_name, register, registered, unregister

__all__ = ["PATH_KIND", "SourceArgs", "cli_name", "cli_names", "open_source", "register", "registered",
           "source_class", "source_kinds", "unregister", "usage"]

for _cls in (imagefolder.ImageFolderSource, tfrecord.TFRecordSource, ofrecord.OFRecordSource):
    register(_cls)

PATH_KIND = "imagefolder"  # what `recordtool.pack(path, …)` takes a path SRC for


def source_kinds() -> tuple:
    """The registered kinds (the manifest's source.kind), in registration order."""
    return tuple(cls.kind for cls in registered())


def cli_names() -> tuple:
    """The `recordtool pack --from` spellings of the registered kinds, in registration order."""
    return tuple(cli_name(cls) for cls in registered())


def source_class(name: str):
    """The registered source class of a kind or --from spelling; ConfigError for another name."""
    for cls in registered():
        if name in (cls.kind, cli_name(cls)):
            return cls
    raise ConfigError(f"source kind {name!r} is not one of {', '.join(cli_names())}")


def usage(name: str, args: SourceArgs) -> str | None:
    """What is wrong with these arguments for that kind (one message), or None."""
    return source_class(name).usage(args)


def open_source(name: str, args: SourceArgs):
    """Open the source of a kind (or --from spelling) from `args`; the caller closes it."""
    return source_class(name).open(args)

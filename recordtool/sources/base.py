"""What pack reads from: the `Source` protocol every source implements.

A source lists its items up front (cheap: names and offsets, no image bytes), so pack can
shuffle them with the seed and assign them to shards before reading anything; then `load`
reads one item. Items are dataclasses (their repr names the item: pack's plan hash uses it),
and a source pickles (mappings dropped, re-opened on first use) so Ray workers can load items.
ImageFolderSource, TFRecordSource and OFRecordSource implement it; pack and the tests depend on
this protocol only.

A registered source class is a kind `recordtool pack --from` offers: it names its `kind` (the
manifest's) and `cli_name` (the --from spelling), says what is wrong with the arguments it is
given (`usage`, the CLI's usage error) and opens itself from them (`open`, taking a
`SourceArgs`). recordtool.sources.registry registers recordtool's own; nothing else lists the
kinds.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigError

from ..format.manifest import MAX_CLASSES as DEFAULT_MAX_CLASSES  # noqa: F401  (sources' default)


@runtime_checkable
class Source(Protocol):
    """Attributes:
        kind: the manifest's source.kind ("imagefolder", "tfrecord", "ofrecord", or a
            registered kind's).
        items: every candidate record, in a stable order (pack shuffles positions in it).
        skipped: (where, reason) for what listing already refused (not an image, bad framing).
        warnings: messages for the user (an empty class folder, …).
    """

    kind: str
    items: list
    skipped: list
    warnings: list

    def where(self, item: Any) -> str:
        """Human-readable location of an item: a path, or file + byte offset."""

    def load(self, item: Any) -> tuple:
        """(image bytes, label, filename bytes) of one item; raises `Rejected` with the reason
        when the item cannot become a record."""

    def classes(self, max_label: int) -> tuple:
        """(class names indexed by label, human-readable class texts or None)."""

    def describe(self) -> dict:
        """The manifest's `source` entry."""

    def notes(self) -> dict:
        """What `load` learned that `classes` needs (TFRecord: class names met in records), as
        JSON-able {str(label): value}. Shard tasks may load in other processes (Ray): pack
        collects each task's notes and gives them back to the driver's source."""

    def merge_notes(self, notes: dict) -> None:
        """Take in another copy's `notes`; the result must not depend on the order of merges."""

    def close(self) -> None:
        """Release mappings and scratch files. A copy unpickled in a worker releases its own
        mappings only."""


def source_paths(source) -> list:
    """The local paths a source reads (its folder, or its files): OUT must stay apart from them.
    Object-store URLs are left out (they cannot overlap a local OUT)."""
    from ..io.fs import is_url

    root = getattr(source, "root", None)
    paths = [root] if root is not None else list(getattr(source, "files", []))
    return [p for p in paths if not is_url(p)]


@dataclass(frozen=True)
class SourceArgs:
    """What `recordtool pack` was given for its source (the options a kind does not use are
    left at their defaults by the CLI's parser or ignored by that kind's `open`).

    paths: SRC as given (one folder, or files, globs and URLs).
    out: the dataset being packed (a folder source leaves it out of its walk; TFRecord
        scratch files go beside it).
    on_error: the policy for damaged records ("skip", "warn", "raise").
    max_classes: records with a label at or above this are refused.
    classes_from: a packed dataset whose class list numbers a folder's classes (its path, or a
        ClassList).
    keys, image_key, label_key, label_offset, filename_key: feature keys of TFRecord/OFRecord
        records (`keys`: a TFRecord preset name).
    compression, max_inflate: how TFRecord files are inflated.
    """

    paths: tuple
    out: str
    on_error: str = "skip"
    max_classes: int = DEFAULT_MAX_CLASSES
    classes_from: Any = None
    keys: str | None = None
    image_key: str | None = None
    label_key: str | None = None
    label_offset: int | None = None
    filename_key: str | None = None
    compression: str = "auto"
    max_inflate: float | None = None


_KINDS: dict = {}  # kind → registered source class, in registration order


def register(cls):
    """Make a source class a kind pack opens by name (returns it: usable as a decorator). The
    class has `kind`, optionally `cli_name` (the --from spelling; default: the kind), and the
    class methods `usage(args)` (a usage problem with these `SourceArgs` as one message, or
    None) and `open(args)` (the source). A kind or --from spelling registered with another class
    is a ConfigError (a name means one format)."""
    for attr in ("kind", "usage", "open"):
        if not hasattr(cls, attr):
            raise ConfigError(f"{cls.__name__}: a registered source needs {attr!r}")
    names = {cls.kind, cli_name(cls)}
    for other in _KINDS.values():
        if other is not cls and names & {other.kind, cli_name(other)}:
            raise ConfigError(f"{cls.__name__}: kind {cls.kind!r} / --from {cli_name(cls)!r} is taken by "
                              f"{other.__name__}")
    _KINDS[cls.kind] = cls
    return cls


def cli_name(cls) -> str:
    """A source class's `recordtool pack --from` spelling."""
    return getattr(cls, "cli_name", cls.kind)


def unregister(kind: str) -> None:
    """Forget a registered kind (a kind registered for a while, as a test does)."""
    _KINDS.pop(kind, None)


def registered() -> tuple:
    """The registered source classes, in registration order."""
    return tuple(_KINDS.values())


def one_folder(name: str, paths) -> str | None:
    """The usage problem of a kind (--from `name`) that reads one SRC folder, or None."""
    if len(paths) == 1 and os.path.isdir(paths[0]):
        return None
    what = paths[0] if len(paths) == 1 else f"{len(paths)} paths"
    if len(paths) == 1 and not os.path.lexists(paths[0]) and not any(ch in paths[0] for ch in "*?["):
        return f"SRC {paths[0]} does not exist"
    return f"--from {name} takes one SRC folder, not {what}"


def no_classes(name: str, args: SourceArgs) -> str | None:
    """The usage problem of `classes_from` given to a kind that has no class folders, or None."""
    if args.classes_from is None:
        return None
    return f"--classes-from numbers class folders: it applies to --from folder, not {name}"

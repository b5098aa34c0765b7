"""What pack reads from: the `Source` protocol every source implements.

A source lists its items up front (cheap: names and offsets, no image bytes), so pack can
shuffle them with the seed and assign them to shards before reading anything; then `load`
reads one item. Items are dataclasses (their repr names the item: pack's plan hash uses it),
and a source pickles (mappings dropped, re-opened on first use) so Ray workers can load items.
ImageFolderSource, TFRecordSource and OFRecordSource implement it; pack and the tests depend on
this protocol only.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..format.manifest import MAX_CLASSES as DEFAULT_MAX_CLASSES  # noqa: F401  (sources' default)


@runtime_checkable
class Source(Protocol):
    """Attributes:
        kind: "imagefolder", "tfrecord" or "ofrecord" (the manifest's source.kind).
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

"""ImageNet-style folders: `root/<class>/**/<file>`, with torchvision ImageFolder's labels."""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from ..errors import Rejected, UnsafePath
from ..io import files
from ..checks import CLASSES_LIMIT, bounded_int
from .base import DEFAULT_MAX_CLASSES
from ..format.schema import IMAGE_EXTENSIONS, MAX_IMAGE_BYTES  # noqa: F401  (IMAGE_EXTENSIONS: read from here too)


@dataclass(frozen=True)
class Item:
    path: str  # absolute path as found (symlinks not resolved)
    relpath: str  # relative to the root: stored as the record's filename
    label: int
    size: int = 0  # bytes and modification time when listed: part of a pack plan's hash, so a
    mtime_ns: int = 0  # file edited after a killed pack makes its shard be redone on resume


class ImageFolderSource:
    """An ImageNet-style folder as a `Source`: sorted class folders → labels 0..K-1 (torchvision
    ImageFolder's rule); files walked recursively, sorted, following symbolic links — each
    directory once (by device and inode), so a link loop or a second link to the same folder
    adds nothing and is reported.

    Args:
        root: the folder holding one sub-folder per class.
        exclude: directories never walked (pack passes OUT: a link into it is not packed).
        max_bytes: files larger than this are refused from their size, unread.
        max_classes: more class folders than this is an error (a label per folder).
    """

    kind = "imagefolder"

    def __init__(self, root: str, exclude=(), max_bytes: int = MAX_IMAGE_BYTES,
                 max_classes: int = DEFAULT_MAX_CLASSES):
        max_classes = bounded_int("max_classes", max_classes, 1, CLASSES_LIMIT)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"{root}: not a directory")
        self.root = root
        self.max_bytes = max_bytes
        self.items, self.skipped, self.warnings = [], [], []
        seen = {_dir_id(root)}
        excluded = {d for d in (_dir_id(p) for p in exclude if os.path.isdir(p)) if d is not None}
        classes = []
        for e in sorted(os.scandir(root), key=lambda e: e.name):
            if not e.is_dir():
                self.skipped.append((e.name, "file outside any class folder"))
                continue
            d = _dir_id(e.path)
            if d in excluded:
                self.skipped.append((e.name, "the output directory: not packed"))
            elif d in seen:
                self.skipped.append((e.name, "the source folder itself (symbolic link loop): not walked"))
            else:
                classes.append(e.name)
        if not classes:
            raise FileNotFoundError(f"{root}: no class folders (expected root/<class>/<image>)")
        if len(classes) > max_classes:
            raise FileNotFoundError(f"{root}: {len(classes)} class folders, more than max_classes {max_classes}")
        self.class_names = classes
        # every class folder is its own: a link from one class into another is not walked
        seen |= {_dir_id(os.path.join(root, c)) for c in classes}
        base = os.path.abspath(root)  # items hold absolute paths: loadable from any working directory
        for label, cls in enumerate(classes):
            found = self._walk(os.path.join(base, cls), label, seen, excluded)
            if not found:
                self.warnings.append(f"class {cls!r} (label {label}) has no images; its label is kept so "
                                     "labels match torchvision's ImageFolder")

    def _walk(self, top: str, label: int, seen: set, excluded: set) -> int:
        """Depth-first, sorted, each directory (device, inode) once; returns images found."""
        found = 0
        stack = [top]
        while stack:
            d = stack.pop()
            rel_d = os.path.relpath(d, self.root)
            ident = _dir_id(d)
            if ident in excluded:
                self.skipped.append((rel_d, "the output directory: not packed"))
                continue
            if d is not top and (ident is None or ident in seen):
                self.skipped.append((rel_d, "directory already walked (symbolic link loop or a second link to it)"
                                     if ident is not None else "unreadable directory"))
                continue
            seen.add(ident)
            try:
                entries = sorted(os.scandir(d), key=lambda e: e.name)
            except OSError as e:
                self.skipped.append((rel_d, f"unreadable directory: {e.strerror or e}"))
                continue
            subdirs = []
            for e in entries:
                rel = os.path.relpath(e.path, self.root)
                try:
                    is_dir = e.is_dir()  # follows links
                except OSError:
                    is_dir = False
                if is_dir:
                    subdirs.append(e.path)
                elif not e.name.lower().endswith(IMAGE_EXTENSIONS):
                    self.skipped.append((rel, f"not an image file extension ({os.path.splitext(e.name)[1] or 'none'})"))
                elif (st := _regular_stat(e.path)) is None:
                    self.skipped.append((rel, "broken symbolic link or not a regular file"))
                else:
                    self.items.append(Item(e.path, rel, label, st.st_size, st.st_mtime_ns))
                    found += 1
            stack.extend(reversed(subdirs))  # sorted order: first sub-folder walked first
        return found

    def where(self, item: Item) -> str:
        return item.relpath

    def load(self, item: Item):
        try:
            data = files.read_bounded(item.path, self.max_bytes, "source image", follow=True)
        except UnsafePath as e:  # too large (refused from its size, unread), FIFO, device, …
            msg = str(e)
            raise Rejected(msg[len(item.path) + 2:] if msg.startswith(item.path + ": ") else msg) from None
        except OSError as e:
            raise Rejected(f"unreadable: {e.strerror or e}") from None
        return data, item.label, os.fsencode(item.relpath)

    def classes(self, max_label: int):
        return list(self.class_names), None

    def describe(self) -> dict:
        return {"kind": self.kind, "path": self.root, "files": len(self.items)}

    def notes(self) -> dict:
        return {}

    def merge_notes(self, notes: dict) -> None:
        pass

    def close(self):
        pass


def _dir_id(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _regular_stat(path: str):
    """os.stat of a regular file (links followed), else None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None

"""ImageNet-style folders: `root/<class>/**/<file>`, with torchvision ImageFolder's labels (hidden
entries left out), or the labels of a given class list."""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from ..errors import ConfigError, PackError, Rejected, UnsafePath
from ..io import files
from ..checks import CLASSES_LIMIT, bounded_int
from .base import DEFAULT_MAX_CLASSES, SourceArgs, one_folder
from ..format.manifest import ClassList, classes_of
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

    Hidden entries — a name starting with '.' (`.ipynb_checkpoints`, `.DS_Store`, `._x.jpg`,
    `.git`), at any depth — are not classes and are not walked or packed; each is reported
    among the skipped (a hidden folder once, not its content). torchvision's ImageFolder takes
    a hidden top-level folder as class 0, so on a folder with one its labels differ from ours
    (which are those of the same folder without it).

    With `classes` (a `ClassList`, e.g. the training set's), labels are that list's positions
    instead: a class folder not in it is a PackError naming the folder; a listed class with no
    folder keeps its label (listed in `missing_classes`), so a validation set missing a class
    gets the training set's labels all the same.

    Args:
        root: the folder holding one sub-folder per class.
        exclude: directories never walked (pack passes OUT: a link into it is not packed).
        max_bytes: files larger than this are refused from their size, unread.
        max_classes: more class folders (or listed classes) than this is an error (a label each).
        classes: the class list whose numbering the labels take (format.manifest.classes_of).
    """

    kind = "imagefolder"
    cli_name = "folder"  # recordtool pack --from folder (the default)

    @classmethod
    def usage(cls, args: SourceArgs) -> str | None:
        """SRC must be one folder; the message names the options for the other kinds."""
        why = one_folder(cls.cli_name, args.paths)
        if why is None:
            return None
        return (f"{why}. For TFRecord files (globs allowed: 'train-*'), add --from tfrecord --keys tf-slim|tfds; "
                "for a folder of OFRecord part files, --from ofrecord")

    @classmethod
    def open(cls, args: SourceArgs) -> "ImageFolderSource":
        """The folder `args.paths[0]`, OUT left out of its walk, labels from `args.classes_from`
        (a ClassList, or the packed dataset to read one from) when given."""
        classes = args.classes_from
        if classes is not None and not isinstance(classes, ClassList):
            classes = classes_of(classes)
        return cls(args.paths[0], exclude=(args.out,), max_classes=args.max_classes, classes=classes)

    def __init__(self, root: str, exclude=(), max_bytes: int = MAX_IMAGE_BYTES,
                 max_classes: int = DEFAULT_MAX_CLASSES, classes: ClassList | None = None):
        max_classes = bounded_int("max_classes", max_classes, 1, CLASSES_LIMIT)
        if classes is not None and not isinstance(classes, ClassList):
            raise ConfigError(f"classes must be a ClassList (recordtool.format.manifest.classes_of), not "
                              f"{type(classes).__name__}")
        if not os.path.isdir(root):
            raise FileNotFoundError(f"{root}: not a directory")
        self.root = root
        self.max_bytes = max_bytes
        self.class_list = classes
        self.items, self.skipped, self.warnings = [], [], []
        self.missing_classes = []  # (label, name) of listed classes with no folder (`classes` given)
        seen = {_dir_id(root)}
        excluded = {d for d in (_dir_id(p) for p in exclude if os.path.isdir(p)) if d is not None}
        folders = []
        for e in sorted(os.scandir(root), key=lambda e: e.name):
            is_dir = _is_dir(e)
            if e.name.startswith("."):
                self.skipped.append((e.name, f"hidden {'folder' if is_dir else 'file'} (name starts with '.'): "
                                     + ("not a class, not packed" if is_dir else "not packed")))
            elif not is_dir:
                self.skipped.append((e.name, "file outside any class folder"))
            elif (d := _dir_id(e.path)) in excluded:
                self.skipped.append((e.name, "the output directory: not packed"))
            elif d in seen:
                self.skipped.append((e.name, "the source folder itself (symbolic link loop): not walked"))
            else:
                folders.append(e.name)
        if not folders:
            raise FileNotFoundError(f"{root}: no class folders (expected root/<class>/<image>)")
        self.class_names = self._number(folders, classes)
        if len(self.class_names) > max_classes:
            raise FileNotFoundError(f"{root}: {len(self.class_names)} class"
                                    f"{' folders' if classes is None else 'es listed'}, more than max_classes "
                                    f"{max_classes}")
        # every class folder is its own: a link from one class into another is not walked
        seen |= {_dir_id(os.path.join(root, c)) for c in folders}
        base = os.path.abspath(root)  # items hold absolute paths: loadable from any working directory
        present = set(folders)
        for label, cls in enumerate(self.class_names):
            if cls not in present:
                self.missing_classes.append((label, cls))
                continue
            found = self._walk(os.path.join(base, cls), label, seen, excluded)
            if not found:
                self.warnings.append(f"class {cls!r} (label {label}) has no images; its label is kept so "
                                     "labels match torchvision's ImageFolder")

    def _number(self, folders: list, classes: ClassList | None) -> list:
        """The class names by label: the sorted folders, or the given list — which must hold
        every folder (PackError naming the first it does not)."""
        if classes is None:
            return folders
        known = set(classes.names)
        unknown = [f for f in folders if f not in known]
        if unknown:
            more = f" (and {len(unknown) - 1} more: {unknown[1:4]})" if len(unknown) > 1 else ""
            raise PackError(f"{os.path.join(self.root, unknown[0])}: class folder {unknown[0]!r} is not in the class "
                            f"list of {classes.origin} ({len(classes.names)} classes){more}; its labels cannot "
                            "number it: pack it with that dataset, or remove the folder")
        return list(classes.names)

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
                is_dir = _is_dir(e)
                if e.name.startswith("."):
                    self.skipped.append((rel, f"hidden {'folder' if is_dir else 'file'} (name starts with '.'): "
                                         "not packed"))
                elif is_dir:
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
        d = {"kind": self.kind, "path": self.root, "files": len(self.items)}
        if self.class_list is not None:
            d["classes_from"] = self.class_list.origin
        return d

    def notes(self) -> dict:
        return {}

    def merge_notes(self, notes: dict) -> None:
        pass

    def close(self):
        pass


def _is_dir(entry) -> bool:
    """A directory, or a link to one (followed)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


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

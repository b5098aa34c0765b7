"""ImageNet-style folders: `root/<class>/**/<file>`, with torchvision ImageFolder's labels."""
from __future__ import annotations

import os
from dataclasses import dataclass

from .image import Rejected

# torchvision's IMG_EXTENSIONS: what ImageFolder would load. Other files are reported, not packed.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class Item:
    path: str  # absolute path as found (symlinks not resolved)
    relpath: str  # relative to the root: stored as the record's filename
    label: int


class ImageFolderSource:
    """An ImageNet-style folder as a `Source`: sorted class folders → labels 0..K-1 (torchvision
    ImageFolder's rule); files walked recursively (following links), sorted.

    Args:
        root: the folder holding one sub-folder per class.
    """

    kind = "imagefolder"

    def __init__(self, root: str):
        if not os.path.isdir(root):
            raise FileNotFoundError(f"{root}: not a directory")
        self.root = root
        self.class_names = sorted(e.name for e in os.scandir(root) if e.is_dir())
        if not self.class_names:
            raise FileNotFoundError(f"{root}: no class folders (expected root/<class>/<image>)")
        self.items, self.skipped, self.warnings = [], [], []
        for label, cls in enumerate(self.class_names):
            found = 0
            for dirpath, dirnames, filenames in os.walk(os.path.join(root, cls), followlinks=True):
                dirnames.sort()
                for fn in sorted(filenames):
                    path = os.path.join(dirpath, fn)
                    rel = os.path.relpath(path, root)
                    if not fn.lower().endswith(IMAGE_EXTENSIONS):
                        self.skipped.append((rel, f"not an image file extension ({os.path.splitext(fn)[1] or 'none'})"))
                    elif not os.path.isfile(path):
                        self.skipped.append((rel, "broken symbolic link or not a regular file"))
                    else:
                        self.items.append(Item(path, rel, label))
                        found += 1
            if not found:
                self.warnings.append(f"class {cls!r} (label {label}) has no images; its label is kept so "
                                     "labels match torchvision's ImageFolder")
        for name in sorted(e.name for e in os.scandir(root) if not e.is_dir()):
            self.skipped.append((name, "file outside any class folder"))

    def where(self, item: Item) -> str:
        return item.relpath

    def load(self, item: Item):
        try:
            with open(item.path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise Rejected(f"unreadable: {e.strerror or e}") from None
        return data, item.label, os.fsencode(item.relpath)

    def classes(self, max_label: int):
        return list(self.class_names), None

    def describe(self) -> dict:
        return {"kind": self.kind, "path": self.root, "files": len(self.items)}

    def close(self):
        pass

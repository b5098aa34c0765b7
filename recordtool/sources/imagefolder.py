"""ImageNet-style folders: `root/<class>/**/<file>`, with torchvision ImageFolder's labels."""
from __future__ import annotations

import os
from dataclasses import dataclass

# torchvision's IMG_EXTENSIONS: what ImageFolder would load. Other files are reported, not packed.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class Item:
    path: str  # absolute path as found (symlinks not resolved)
    relpath: str  # relative to the root: stored as the record's filename
    label: int


@dataclass
class Scan:
    classes: list
    items: list  # Item, sorted by (label, relpath)
    skipped: list  # (relpath, reason)
    warnings: list  # str


def scan(root: str) -> Scan:
    """Sorted class folders → labels 0..K-1; files walked recursively (following links), sorted."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root}: not a directory")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if not classes:
        raise FileNotFoundError(f"{root}: no class folders (expected root/<class>/<image>)")
    items, skipped, warnings = [], [], []
    for label, cls in enumerate(classes):
        found = 0
        cdir = os.path.join(root, cls)
        for dirpath, dirnames, filenames in os.walk(cdir, followlinks=True):
            dirnames.sort()
            for fn in sorted(filenames):
                path = os.path.join(dirpath, fn)
                rel = os.path.relpath(path, root)
                if not fn.lower().endswith(IMAGE_EXTENSIONS):
                    skipped.append((rel, f"not an image file extension ({os.path.splitext(fn)[1] or 'none'})"))
                    continue
                if not os.path.isfile(path):
                    skipped.append((rel, "broken symbolic link or not a regular file"))
                    continue
                items.append(Item(path, rel, label))
                found += 1
        if not found:
            warnings.append(f"class {cls!r} (label {label}) has no images; its label is kept so "
                            "labels match torchvision's ImageFolder")
    loose = sorted(e.name for e in os.scandir(root) if not e.is_dir())
    for name in loose:
        skipped.append((name, "file outside any class folder"))
    return Scan(classes, items, skipped, warnings)

"""Names and keys of a dataset directory, in one place (FORMAT.md is their specification).

A dataset directory holds `part-NNNNN` shards, `index.rtx`, `manifest.json` and optionally
`pack_report.json`; while a pack runs, `.partial/` holds what is not published yet (its
`pack.json` marker says it is ours) and `.recordtool.lock` is the pack lock. Each record is an
OFRecord whose features use OneFlow's ImageNet converter keys (`KEY_*`).
"""
from __future__ import annotations

import re

# OneFlow ImageNet converter's keys
KEY_IMAGE = "encoded"
KEY_LABEL = "class/label"
KEY_HEIGHT = "height"
KEY_WIDTH = "width"
KEY_FILENAME = "filename"
KEYS = {"image": KEY_IMAGE, "label": KEY_LABEL, "height": KEY_HEIGHT, "width": KEY_WIDTH, "filename": KEY_FILENAME}

SHARD_PREFIX = "part-"
SHARD_DIGITS = 5
PARTIAL_DIR = ".partial"  # unpublished files of a pack in progress (or killed)
MARKER_FILE = "pack.json"  # in .partial: {"tool": "recordtool", "publishing": [...], ...plan fields}
MARKER_MAX = 64 << 20
LOCK_FILE = ".recordtool.lock"
DONE_SUFFIX = ".done.json"  # in .partial: part-NNNNN.done.json, a shard task's finished record
DONE_MAX_BYTES = 256 << 20

# An image file larger than this is refused from its size, before it is read: a record's
# image must stay far below the format's 4 GiB (uint32 lengths), and a sparse or huge file
# must not cost its size in memory per reader thread.
MAX_IMAGE_BYTES = 256 << 20

# torchvision's IMG_EXTENSIONS: what ImageFolder would load (sources/imagefolder.py packs these;
# others are reported, not packed). Here so the manifest reader can tell a source folder too.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

# names a pack writes into OUT: a foreign file by one of these names is never replaced
OUR_NAMES = re.compile(r"^(part-\d+|index\.rtx|manifest\.json|pack_report\.json)(\.tmp)?$")
# in .partial: what a shard task finished (kept for a re-run of the same plan)
FINISHED = re.compile(r"^part-\d+(\.done\.json)?$")


def shard_name(i: int) -> str:
    """The name of part file number `i`: part-00000, part-00001, …"""
    return f"{SHARD_PREFIX}{i:0{SHARD_DIGITS}d}"

"""Pack output on object storage (s3://bucket/prefix, any fsspec URL), all or nothing.

Pack writes the dataset into a local staging folder first (the same writer as for a local
OUT), then `publish` copies it to the store, manifest last — object stores have no rename,
and a dataset is finished exactly when its manifest exists there. Before anything is written,
`OUT/.partial/pack.json` records which names the pack will write or remove, so a pack killed
half-way leaves parts that the next run recognises as its own (and removes); it is deleted
after the manifest is written. A pack never writes into an OUT that holds other things, and
replaces a finished dataset only with overwrite=True — first removing its manifest, so at no
moment does OUT look finished with mixed files. (Two packs into one URL at once are not
detected: object stores have no locks.)

The staging folder (`new_stage`) is named after the pack's process — pid namespace, pid and
start time, as pack/semaphores.py names its semaphores — and holds a marker saying so. A pack
killed before its cleanup (SIGKILL, the out-of-memory killer) leaves it in $TMPDIR; every later
pack removes such folders whose owner is gone (`sweep_stages`), and nothing else. Linux only
(where /proc tells whether a process lives); elsewhere the folder is anonymous and not swept.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import tempfile

from ..errors import FormatError, OutputExists
from ..io import files
from ..io.fs import check_options, get_fs
from ..io.transfer import Retry
from ..util import owner_gone, process_identity
from . import manifest as mf
from .claim import listed, owned, parse_marker
from .schema import MARKER_FILE, MARKER_MAX, PARTIAL_DIR

MARKER = f"{PARTIAL_DIR}/{MARKER_FILE}"  # the same marker as in a local OUT (format/claim.py)
STAGE_PREFIX = "recordtool-stage-"  # then <pid ns>.<pid>.<start>-<random> (Linux), or <random>
STAGE_MARKER = "recordtool-stage.json"  # inside the folder: {"tool": "recordtool", "owner": [ns, pid, start]}
_STAGE = re.compile(re.escape(STAGE_PREFIX) + r"(\d+)\.(\d+)\.(\d+)-[A-Za-z0-9_]+\Z")


def claim(fs, out: str, overwrite: bool, retry: Retry) -> set:
    """Check that the pack may write OUT; the names of ours already there (to be replaced).

    Args:
        fs, out: the store and OUT's path in it.
        overwrite: a finished dataset of ours in OUT may be replaced.
        retry: how store calls are retried.
    """
    url = fs.url(out)
    if hasattr(fs, "check_bucket"):  # a missing bucket is named now, not after the whole pack
        fs.check_bucket(out, retry.attempts, retry.backoff)
    try:
        names = set(retry.call(lambda: fs.listdir(out), url))
    except FileNotFoundError:
        names = set()
    marker = finished = None
    if PARTIAL_DIR in names:
        try:
            marker = parse_marker(retry.call(lambda: fs.read_bytes(fs.join(out, MARKER), MARKER_MAX), url))
        except FileNotFoundError:
            marker = None
        if marker is None:
            raise OutputExists(f"{url}/{PARTIAL_DIR}: not made by recordtool (no pack marker saying so); "
                               "remove it yourself or choose another OUT")
    if mf.MANIFEST_FILE in names:
        raw = retry.call(lambda: fs.read_bytes(fs.join(out, mf.MANIFEST_FILE), mf.MAX_BYTES), url)
        try:
            finished = mf.parse(raw, f"{url}/{mf.MANIFEST_FILE}")
        except FormatError as e:
            raise OutputExists(f"{url}: holds a manifest.json that is not a recordtool manifest ({e}); "
                               "choose another OUT") from None
    return owned(url, names - {PARTIAL_DIR}, marker, finished, overwrite)


def publish(local: str, fs, out: str, ours: set, retry: Retry) -> None:
    """Copy the finished dataset in `local` to OUT on the store: marker, old manifest removed,
    files no longer listed removed, shards, index and report uploaded (each retried, its size
    checked), the manifest last, the marker removed.

    Args:
        local: the finished local dataset directory.
        fs, out: the store and OUT's path in it.
        ours: names of ours already in OUT (`claim`), replaced or removed.
        retry: how store calls are retried.
    """
    url = fs.url(out)
    manifest = mf.load(local)
    new = listed(manifest)
    marker = {"tool": "recordtool", "publishing": sorted(ours | set(new) | {mf.MANIFEST_FILE})}
    retry.call(lambda: fs.write_bytes(fs.join(out, MARKER), mf.dump(marker)), f"{url}/{MARKER}")
    for name in sorted(ours, key=lambda n: n != mf.MANIFEST_FILE):  # nothing looks finished from here on
        if name not in new:
            with contextlib.suppress(FileNotFoundError):
                retry.call(lambda: fs.remove(fs.join(out, name)), f"{url}/{name}")
    for name in new:
        _upload(os.path.join(local, name), fs, fs.join(out, name), retry)
    _upload(os.path.join(local, mf.MANIFEST_FILE), fs, fs.join(out, mf.MANIFEST_FILE), retry)
    with contextlib.suppress(FileNotFoundError):
        retry.call(lambda: fs.remove(fs.join(out, MARKER)), f"{url}/{MARKER}")


def _upload(src: str, fs, dst: str, retry: Retry) -> None:
    size = os.path.getsize(src)

    def once():
        fd = files.open_regular(src)
        with os.fdopen(fd, "rb") as f, fs.open_write(dst) as w:
            shutil.copyfileobj(f, w, 8 << 20)
        got = fs.size(dst)
        if got != size:
            raise OSError(f"{got} bytes stored, {size} sent")

    retry.call(once, fs.url(dst))


@contextlib.contextmanager
def staged(out: str, overwrite: bool, storage_options: dict | None = None, retry: Retry | None = None):
    """Pack into a local staging folder, then publish it to the URL `out` (see module doc).

    Yields the local dataset directory to pack into (inside $TMPDIR; it needs room for the
    whole dataset). OUT is checked before anything is packed, published only when the block
    ends without an exception, and the staging folder is removed either way.

    Args:
        out: the dataset URL.
        overwrite: replace a finished dataset of ours there.
        storage_options: fsspec options for the URL.
        retry: how store calls are retried (recordtool.io.Retry).
    """
    retry = retry or Retry()
    fs, path = get_fs(out, **check_options(out, storage_options))
    path = path.rstrip("/")
    ours = claim(fs, path, overwrite, retry)
    stage = new_stage()
    try:
        yield os.path.join(stage, "dataset")
        publish(os.path.join(stage, "dataset"), fs, path, ours, retry)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def new_stage() -> str:
    """A new staging folder in $TMPDIR (tempfile's folder), private to this user: named after
    this process (`process_identity`) with the marker STAGE_MARKER inside saying the same,
    where /proc tells who lives; else anonymous (never swept)."""
    me = process_identity()
    stage = tempfile.mkdtemp(prefix=STAGE_PREFIX + (".".join(me) + "-" if me else ""))
    if me is not None:
        files.write_new(os.path.join(stage, STAGE_MARKER), mf.dump({"tool": "recordtool", "owner": list(me)}))
    return stage


def sweep_stages() -> list:
    """Remove the staging folders in $TMPDIR that packs of this pid namespace made (`new_stage`)
    and whose owner is gone (killed before its cleanup). A folder goes only when its name says
    so, it is a real directory (not a link) of this user, and its marker — a regular file, not
    a link — names the same owner; its content is removed without following links (shutil's
    fd-based rmtree). Anything else in $TMPDIR is never touched. The names removed."""
    if process_identity() is None:
        return []
    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:
        return []
    removed = []
    for name in names:
        m = _STAGE.match(name)
        if m is None or not owner_gone(*m.groups()):
            continue
        path = os.path.join(base, name)
        if _stage_of(path, list(m.groups())):
            shutil.rmtree(path, ignore_errors=True)  # another pack's sweep may be removing it too
            if not os.path.lexists(path):
                removed.append(name)
    return removed


def _stage_of(path: str, owner: list) -> bool:
    """True when `path` is a staging folder `new_stage` made for `owner`: a directory of this
    user holding the marker naming that owner."""
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return False
        marker = json.loads(files.read_bounded(os.path.join(path, STAGE_MARKER), 4096, "staging marker"))
    except (OSError, ValueError, FormatError):  # no marker, a link, a FIFO, not JSON: not ours
        return False
    return isinstance(marker, dict) and marker.get("tool") == "recordtool" and marker.get("owner") == owner

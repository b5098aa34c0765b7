"""Datasets on object storage (s3://, gs://, any fsspec URL), read through a local shard cache.

`recordtool.open("s3://bucket/train")` (or `Loader(url)`) fetches the manifest
and the index once, checks them as for a local dataset, and then serves `ds[i]` exactly like a
local dataset: zero-copy memoryviews of mmapped shard files — the cached copies. A shard is
downloaded whole into the cache (recordtool.io.cache: bounded, LRU, shared by the processes of a
machine, checked against the manifest's SHA-256, or CRC32C for manifests without one) the first
time one of its records is asked for,
or earlier: the block sampler tells the dataset its epoch's block order, and a background
thread fetches the rest of the current block and the next block while the current one is read.

A shard stays mapped, and pinned in the cache, while memoryviews of it are alive. The dataset
counts the samples it serves per shard against the epoch's plan: a shard the epoch is done
with is unmapped once nothing uses it, and evicted first when room is needed; a shard the
epoch still needs is evicted only when nothing else can go (never to fetch ahead).

Before each record it serves, the dataset compares the mapped file's identity (inode, size,
mtime, ctime: one fstat) with the one the cache checked (`ShardCache.pin`): a cached file is
never written after its download, so a file written in place since is let go of and pinned
again — checked anew, dropped and downloaded again when its bytes are not the manifest's.
Views handed out before the write show the file as it is now (a mapping cannot be checked).

`close()`, and dropping the dataset (a finalizer of its CachedShards), stop its downloads and let go of every
mapping, fd and pin; its download threads hold it only weakly. A forked child (a DataLoader
worker, multiprocessing's 'fork') makes the locks, queue and event the parent's threads may
have held anew, its client anew (io.fs.FsspecFS), and keeps the mappings it inherits without
ever letting go of the parent's pins on them (the parent ends its own by an explicit unlock).

Pickled, a dataset carries its manifest's fingerprint: unpickled where the URL now holds
another dataset (re-packed: other shards, labels), it raises DatasetChanged (reader._reopen).

A RemoteDataset is a reader.Dataset built with another `ShardFiles` component: `CachedShards`,
which owns all of the above (the pins, the mappings, the epoch's plan, the download threads);
the dataset adds what only a URL has (its manifest and index read through the cache, the
block sampler's default, `shard_file`).

Not split: CachedShards' mappings, pins, epoch's plan and download threads are one state under
one lock — which shard is mapped decides which is pinned, which the plan still needs and which a
thread may fetch — and what a fork, a close or a collection must let go of is all of it at once;
the cache's protocol itself (room, eviction, checked downloads) is in recordtool.io.
"""
from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import queue
import threading
import weakref

import numpy as np

from .errors import CacheFull, FormatError, NoBucket, RemoteError
from .format import index as ix
from .format import manifest as mf
from .io import cache as _cache
from .io import fs as _fs
from .io.transfer import Retry
from .reader import Dataset
from .sampler import DEFAULT_BLOCK_SHARDS, BlockSampler
from .util import ForkLock

FETCH_THREADS = 2  # background downloads at once per dataset
IDLE_EXIT = 5.0  # seconds a download thread waits for work before it ends
AHEAD_WAIT = 60.0  # seconds a download ahead waits for room (shards done with) before it is dropped


class RemoteDataset(Dataset):
    """A finished dataset at an fsspec URL (`recordtool.open(url)` returns one): a `Dataset`
    whose shards come from its `CachedShards` (the local shard cache) instead of the dataset's
    own files. It pickles as its URL and options: unpickled (in a spawned worker, say) it opens
    the dataset again.

    Args:
        root: the dataset's URL, e.g. s3://bucket/prefix (its manifest.json is root/manifest.json).
        cache_dir: where shards are cached; each dataset gets its own folder inside
            (default $RECORDTOOL_CACHE_DIR, else ~/.cache/recordtool).
        cache_limit: bytes of shards the dataset's cache folder may hold (default: the whole
            dataset, or 80 % of the free disk space when that is less). The block sampler needs
            room for two blocks of the largest shards.
        storage_options: fsspec options for the URL (s3fs: endpoint_url, key, secret,
            client_kwargs, config_kwargs, …); fsspec's configuration and the usual AWS
            variables apply too.
        retry: how downloads are retried (recordtool.io.Retry: 5 tries, backoff from 0.5 s).
        deadline: seconds one request to the store may take in all (connecting, the answer,
            each 8 MiB piece of a download) on async stores (s3fs, gcsfs, …); then it is
            cancelled and retried as a timeout. Checked by `recordtool.open` and RemoteOptions.
    """

    def __init__(self, root: str, cache_dir: str | None = None, cache_limit: int | None = None,
                 storage_options: dict | None = None, retry: Retry | None = None,
                 deadline: float = _fs.DEADLINE):
        self._opened_as = (os.fspath(root), dict(cache_dir=cache_dir, cache_limit=cache_limit,
                                                 storage_options=storage_options, retry=retry, deadline=deadline))
        self.fs, self._path = _fs.get_fs(root, deadline=deadline, **_fs.check_options(root, storage_options))
        self._path = self._path.rstrip("/")
        self.root = self.fs.url(self._path)
        self.retry = retry or Retry()
        if hasattr(self.fs, "probe"):
            self.fs.probe()  # an endpoint that is not there: said at once, not after every retry
        manifest = self._load_manifest()
        total = sum(s["bytes"] for s in manifest["shards"])
        self.cache = _cache.ShardCache(self.fs, self._path, os.fspath(cache_dir or _cache.default_dir()), self.retry,
                                       limit=cache_limit, total=total)
        self.cache_limit = self.cache.limit
        try:
            info = manifest["index"]
            mapping, _ = self.cache.meta(info["file"], info["bytes"], info["crc32c"], info.get("sha256"))
            where = self.cache.url(info["file"])
            index = ix.read_index(where, mapping)
            self._setup(manifest, index, where, CachedShards(self.cache, manifest["shards"], index.shard))
        except BaseException:
            self.cache.close()
            raise

    def _load_manifest(self) -> dict:
        path = self.fs.join(self._path, mf.MANIFEST_FILE)
        url = self.fs.url(path)
        try:
            raw = self.retry.call(lambda: self.fs.read_bytes(path, mf.MAX_BYTES), url)
        except FileNotFoundError:
            try:  # "no manifest" is true of a missing bucket too: say which it is
                bucket = self.fs.missing_bucket(self._path, attempts=1, denied_is_missing=False) \
                    if hasattr(self.fs, "missing_bucket") else None
            except RemoteError:
                bucket = None
            if bucket is not None:
                raise NoBucket(f"{bucket}: no such bucket on this store, so there is no dataset at {self.root}; "
                               "check the URL (and endpoint_url / credentials)") from None
            raise FormatError(f"{url}: no manifest, so {self.root} is not a finished recordtool dataset") from None
        return mf.parse(raw, url)

    def sampler(self, seed: int = 0, rank: int = 0, world_size: int = 1, drop_last: bool = False,
                shuffle: bool = True, block_shards: int | None = None):
        """As `Dataset.sampler`, but a block shuffle by default (DEFAULT_BLOCK_SHARDS shards a
        block) whose blocks this dataset fetches ahead; block_shards=0 asks for the global
        permutation (sensible when the cache holds the whole dataset)."""
        if block_shards is None:
            block_shards = min(DEFAULT_BLOCK_SHARDS, max(1, len(self.shards)))
        s = super().sampler(seed=seed, rank=rank, world_size=world_size, drop_last=drop_last, shuffle=shuffle,
                            block_shards=block_shards)
        if isinstance(s, BlockSampler):
            largest = sorted((x["bytes"] for x in self.shards), reverse=True)
            need = sum(largest[:2 * block_shards])
            self.cache.advice = "raise cache_limit" + (" or lower block_shards" if block_shards > 1 else "")
            if need > self.cache_limit:
                how = ("raise cache_limit or lower block_shards" if block_shards > 1 else
                       f"raise cache_limit to at least {need}")
                raise CacheFull(f"{self.root}: cache_limit={self.cache_limit} is less than two blocks of "
                                f"{block_shards} shard{'s' if block_shards > 1 else ''} ({need} bytes): {how}")
            s.on_plan = self.shard_files.set_plan
        return s

    def shard_file(self, shard: int):
        """The checked cached copy of one shard as a read-only mapping, pinned while the block
        runs and let go after (recordtool verify reads every shard this way, in turn)."""
        return self.shard_files.shard_file(shard)

    def __repr__(self):
        return f"<recordtool.Dataset {self.root!r}: {len(self)} records, {len(self.classes)} classes, " \
               f"{len(self.shards)} shards, cache {self.cache.dir!r} ≤ {self.cache_limit} bytes>"


class CachedShards:
    """A remote dataset's shards (a reader.ShardFiles) as checked copies in its ShardCache:
    each downloaded on first use, or ahead along the epoch's block plan, then pinned and mapped.

    Invariants: a mapped shard is pinned in the cache (its fd held) until it is unmapped; a
    record is served from a mapping only while the mapped file's identity is the one the cache
    checked; slices are taken under `lock`, so a mapping is never closed while a view of it
    lives (unless forced: then it closes when the last view goes).

    Args:
        cache: the dataset's ShardCache (this object does not close it).
        shards: the manifest's shards.
        shard_of: the index's shard column (an epoch's plan counts samples per shard from it).
    """

    def __init__(self, cache, shards: list, shard_of):
        self.cache = cache
        self.shards = shards
        self._shard_of = shard_of
        n = len(shards)
        self.lock = ForkLock()  # producers map shards under it: a forked child gets it unlocked
        self._maps: list = [None] * n
        self._views: list = [None] * n
        self._fds: list = [None] * n  # a mapped shard's pinned fd
        self._idents: list = [None] * n  # ... and its file's identity when the cache checked it
        self._inherited: set = set()  # mapped shards whose pins a forked child got from its parent
        self._names = [_cache.file_name(s["name"], s["crc32c"]) for s in shards]
        self._mapped: dict = {}  # mapped shards (→ None), oldest first
        self.mapping_locks = [ForkLock() for _ in range(n)]  # one thread pins (and hashes) a shard at a time
        self._fits = sum(s["bytes"] for s in shards) <= cache.limit  # everything fits: never unmap for room
        # the epoch's plan (BlockSampler.on_plan): blocks in order, and per shard how many of
        # this rank's samples it holds and how many were served: a shard is done when all were
        self.plan_lock = ForkLock()
        self._blocks: list = []
        self._block_of: dict = {}
        self._expected = [0] * n
        self._served = [0] * n
        self._frontier = -1  # the furthest block touched in this plan
        self.queued: set = set()
        self.queue: queue.Queue = queue.Queue()
        self._workers: list = []
        # dropped without close(): its pins end (its mappings go with the object; no download of it
        # is in progress then: each holds it, and its idle download threads end on their own)
        self._finalizer = weakref.finalize(self, _let_go_of, self._fds, self._inherited)
        _LIVE.add(self)

    # ------------------------------------------------------------------ records
    def slice(self, shard: int, offset: int, length: int) -> memoryview:
        # slices are taken under the lock: a view that exists pins its mapping (mm.close()
        # refuses while it lives), so _release never unmaps bytes in use. A record counts as
        # served when its view is taken, not before: while its reader fetches the shard, the
        # shard is still needed (kept mapped, not evicted for others' room)
        with self.lock:
            v = self._current(shard)
            if v is not None:
                self._served[shard] += 1
                return v[offset:offset + length]
        for _ in range(5):
            self._fetch(shard)  # outside the lock: may download, or wait for another process
            with self.mapping_locks[shard]:
                with self.lock:
                    v = self._current(shard)
                    if v is not None:
                        self._served[shard] += 1
                        return v[offset:offset + length]
                pinned = self._pin(shard)  # outside the lock too: checking the copy's digest takes a while
                if pinned is not None:
                    with self.lock:
                        self._served[shard] += 1
                        return self._install(shard, pinned)[offset:offset + length]
        raise CacheFull(f"{self.cache.url(self.shards[shard]['name'])}: evicted again each time before it could "
                        f"be mapped; raise cache_limit")

    def _current(self, shard: int):
        """The shard's mapping when it is mapped and its file is the one the cache checked
        (under self.lock), else None. A file written since (another identity) is let go of
        here, so the caller pins it again: checked anew, and dropped and downloaded again when
        its bytes are not the manifest's."""
        v = self._views[shard]
        if v is None or _cache.identity(self._fds[shard]) == self._idents[shard]:
            return v
        self._unmap(shard, force=True)
        return None

    def _fetch(self, shard: int) -> None:
        info = self.shards[shard]
        self._advance(shard)
        self.cache.fetch(info["name"], info["bytes"], info["crc32c"], protect=self._needed_names,
                         release=self._release_done, sha256=info.get("sha256"))

    def _pin(self, shard: int):
        """(fd, mapping, identity) of a cached shard, pinned until the fd is closed (see
        `ShardCache.pin`); None if it was evicted since it was fetched."""
        info = self.shards[shard]
        pinned = self.cache.pin(info["name"], info["bytes"], info["crc32c"], info.get("sha256"))
        if pinned is None:
            return None
        fd, ident = pinned
        try:
            return fd, (mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if info["bytes"] else b""), ident
        except BaseException:
            _unpin(fd)
            raise

    @contextlib.contextmanager
    def shard_file(self, shard: int):
        """The checked cached copy of one shard as a read-only mapping, pinned while the block
        runs and let go after (recordtool verify reads every shard this way, in turn)."""
        for _ in range(5):
            info = self.shards[shard]
            self.cache.fetch(info["name"], info["bytes"], info["crc32c"], release=self._release_all,
                             sha256=info.get("sha256"))
            pinned = self._pin(shard)
            if pinned is not None:
                break
        else:
            raise CacheFull(f"{self.cache.url(self.shards[shard]['name'])}: evicted again each time before it "
                            f"could be mapped; raise cache_limit")
        fd, mm, _ = pinned
        try:
            yield mm
        finally:
            try:
                if isinstance(mm, mmap.mmap):
                    mm.close()
            finally:
                _unpin(fd)

    def _install(self, shard: int, pinned) -> memoryview:
        """Keep a pinned shard (`_pin`) mapped (under self.lock); its view."""
        fd, mm, ident = pinned
        self._fds[shard], self._maps[shard], self._idents[shard] = fd, mm, ident
        self._views[shard] = memoryview(mm)
        self._mapped[shard] = None
        if not self._fits:
            self._unmap_idle(keep=self._needed() | {shard})
        return self._views[shard]

    def _unmap(self, shard: int, force: bool = False) -> bool:
        """Let go of a mapped shard (under self.lock): its mapping closed, its fd closed and its
        pin ended. A mapping memoryviews still use is kept (False), unless `force`: then it is
        let go of all the same and closes when the last of those views goes (a pin inherited
        from a forked child's parent is the parent's to end: only its fd is closed)."""
        mm = self._maps[shard]
        self._views[shard].release()
        if isinstance(mm, mmap.mmap):
            try:
                mm.close()
            except BufferError:  # slices of it are alive: still in use
                if not force:
                    self._views[shard] = memoryview(mm)
                    return False
        fd = self._fds[shard]
        self._fds[shard] = self._maps[shard] = self._views[shard] = self._idents[shard] = None
        del self._mapped[shard]
        if shard in self._inherited:
            self._inherited.discard(shard)
            os.close(fd)
        else:
            _unpin(fd)
        return True

    def _unmap_idle(self, keep=()) -> None:
        """Unmap (and unpin) mapped shards outside `keep` that no memoryview uses (under self.lock)."""
        for shard in list(self._mapped):
            if shard not in keep:
                self._unmap(shard)

    def _release_all(self) -> None:
        """The cache is short of room: let go of every mapping nothing uses."""
        with self.lock:
            self._unmap_idle()

    def _release_done(self) -> None:
        """Room for a download: let go of idle mappings of shards this epoch is done with."""
        keep = self._needed()
        with self.lock:
            self._unmap_idle(keep=keep)

    # ------------------------------------------------------------------ reading ahead
    def set_plan(self, epoch: int, blocks: list, indices) -> None:
        """The epoch's plan (BlockSampler.on_plan): its blocks of shards, and the indices of this rank."""
        expected = np.bincount(self._shard_of[np.asarray(indices, np.int64)], minlength=len(self.shards))
        with self.plan_lock:
            self._blocks = [[int(s) for s in b] for b in blocks]
            self._block_of = {s: k for k, b in enumerate(self._blocks) for s in b}
            self._expected = expected.tolist()
            self._served = [0] * len(self.shards)
            self._frontier = -1
            self.queued = set()

    def _needed(self) -> set:
        """Shards this epoch still needs, up to the block after the furthest one touched: kept
        mapped, and evicted for room only when nothing else can go (and never for a download
        ahead)."""
        with self.plan_lock:
            return {s for b in self._blocks[:self._frontier + 2] for s in b if self._served[s] < self._expected[s]}

    def _needed_names(self) -> set:
        return {self._names[s] for s in self._needed()}

    def _advance(self, shard: int) -> None:
        """A shard is wanted: if its block is new, queue the downloads of this block and the next."""
        with self.plan_lock:
            k = self._block_of.get(shard)
            if k is None or k <= self._frontier:
                return
            self._frontier = k
            todo = [s for b in self._blocks[k:k + 2] for s in b if s not in self.queued]
            self.queued.update(todo)
        for s in todo:
            self.queue.put(s)
        self._start_workers()

    def prefetch(self, spans) -> None:
        """Start downloading the shards of these (shard, offset, length) spans in the background."""
        for s in sorted({shard for shard, _, _ in spans}):
            self.queue.put(s)
        self._start_workers()

    def _start_workers(self) -> None:
        with self.plan_lock:
            while len(self._workers) < FETCH_THREADS and not self.cache.closed.is_set():
                t = threading.Thread(target=_download_ahead, args=(weakref.ref(self), self.queue, self.cache.closed),
                                     name="recordtool-fetch", daemon=True)
                self._workers.append(t)
                t.start()

    def _retire(self) -> bool:
        """An idle download thread ends (True), unless work came meanwhile."""
        with self.plan_lock:
            if not self.queue.empty() and not self.cache.closed.is_set():
                return False
            with contextlib.suppress(ValueError):
                self._workers.remove(threading.current_thread())
            return True

    def _download(self, shard: int) -> None:
        """Download one shard ahead. A shard someone else is downloading is skipped (a reader
        that needs it waits on its lock); a failure is left for the reader to meet."""
        info = self.shards[shard]
        try:
            self.cache.fetch(info["name"], info["bytes"], info["crc32c"], wait=False, protect=self._needed_names,
                             release=self._release_done, strict=True, patience=AHEAD_WAIT, sha256=info.get("sha256"))
        except Exception:  # noqa: BLE001 — the reader fetches it again and raises with context
            pass

    def close(self) -> None:
        """Stop the downloads and let go of every shard: unmapped, its fd closed and its pin in
        the cache ended (a mapping that memoryviews still use closes, and its pin ends, when
        the last of them goes). The dataset stays usable: a later read fetches and maps again,
        as a local dataset maps again. Dropping the dataset lets go of all of it as well."""
        closed = self.cache.closed
        closed.set()  # downloads in progress end (Cancelled)
        with self.plan_lock:
            workers = list(self._workers)
        for _ in workers:
            self.queue.put(None)
        for t in workers:
            t.join(timeout=30)
        with self.lock:
            for shard in list(self._mapped):
                self._unmap(shard, force=True)
        with self.plan_lock:
            self._workers = [t for t in self._workers if t.is_alive()]
            with contextlib.suppress(queue.Empty):
                while True:
                    self.queue.get_nowait()
            self.queued, self._frontier = set(), -1  # a later read queues its blocks anew
            closed.clear()

    def _forked(self) -> None:
        """In a forked child (before anything else runs there): the parent's download threads
        are not here, and the queue and event they used may have been locked at the fork, so
        both are made anew (the ForkLocks are by recordtool.util, the cache's lock by
        io.cachefolder). The mappings stay usable; their pins are the parent's to end."""
        self.queue, self._workers = queue.Queue(), []
        self.queued, self._frontier = set(), -1
        closed = threading.Event()
        if self.cache.closed.is_set():
            closed.set()
        self.cache.closed = closed
        self._inherited.update(self._mapped)


def _unpin(fd: int) -> None:
    """End a pin and close its fd (an explicit unlock: it ends even where a forked child still
    has a copy of the fd)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _download_ahead(ref, jobs: queue.Queue, closed: threading.Event) -> None:
    """A dataset's download thread: queued shards in order. It holds the dataset (`ref`, a weak
    reference) only while it downloads, so a dataset dropped while its threads wait for work is
    collected; it ends then, when closing, or after IDLE_EXIT seconds without work."""
    while not closed.is_set():
        try:
            shard = jobs.get(timeout=IDLE_EXIT)
        except queue.Empty:
            shard = None
        ds = ref()
        if ds is None:
            return
        if shard is None:  # idle (or closing): end, so an unused dataset can be collected
            if ds._retire():
                return
        else:
            ds._download(shard)
        del ds


def _let_go_of(fds: list, inherited: set) -> None:
    """A dataset's finalizer: its pins end (its mappings go with it; pins inherited from a
    forked child's parent are only closed). It takes no lock: a collection may run it on a
    thread inside any lock."""
    for k, fd in enumerate(fds):
        if fd is None:
            continue
        fds[k] = None
        with contextlib.suppress(OSError):
            if k in inherited:
                os.close(fd)
            else:
                _unpin(fd)


_LIVE: "weakref.WeakSet[CachedShards]" = weakref.WeakSet()  # the remote datasets' shards in this process


def _after_fork_in_child() -> None:
    for ds in list(_LIVE):
        ds._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

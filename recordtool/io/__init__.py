"""Storage, at the bottom of recordtool: nothing here imports the rest of the package but errors.

- files: local files opened safely (no links followed, no special files, bounded reads).
- fs: the FileSystem interface, `LocalFS` and `FsspecFS` (bounded, streamed reads).
- store: which object store an `FsspecFS` reaches, and whether it (and a bucket) is there.
- transfer: `Retry` and the one checked download (size and CRC32C).
- cachefolder: one dataset's cache folder on disk (safe folders, own files, identity stamps).
- cachebudget: the folder's byte budget (accounting, LRU eviction, pins, preallocation).
- cache: `ShardCache`, the bounded local cache of a remote dataset's files.
"""
from .fs import FileSystem, FsspecFS, LocalFS, get_fs, is_url  # noqa: F401
from .transfer import Retry  # noqa: F401

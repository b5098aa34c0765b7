"""Moved to recordtool.io (fs, transfer). This name is kept only for pack.py, pack_ray.py and
format/writer.py, which another branch is splitting; once they import recordtool.io, delete it."""
from .errors import Cancelled, Damaged  # noqa: F401
from .io.fs import FileSystem, FsspecFS, LocalFS, get_fs, is_url  # noqa: F401
from .io.transfer import PERMANENT, Retry, copy_into  # noqa: F401

"""Moved to recordtool.io.files (the storage layer, below format). This name is kept only for
format/writer.py, pack.py and pack_ray.py, which another branch is splitting; once they import
recordtool.io.files, delete this module."""
from ..io.files import (UnsafePath, create_exclusive, inside, map_readonly, open_regular, plain_name,  # noqa: F401
                        read_bounded, replace_tmp, write_new)

"""`recordtool.open`: the one place that decides what kind of dataset a path names.

A local directory (or file:// URL) is a `reader.Dataset`, mapped in place; an object-store URL
(s3://, gs://, any fsspec URL) is a `remote.RemoteDataset`, read through the local shard cache.
Both pickle as what they were opened with, so the result can cross into spawned processes.
"""
from __future__ import annotations

import os

from .checks import check_deadline
from .io.fs import DEADLINE, check_options, is_url
from .io.transfer import Retry
from .reader import Dataset
from .remote import RemoteDataset


def open_dataset(path, cache_dir: str | None = None, cache_limit: int | None = None,
                 storage_options: dict | None = None, retry: Retry | None = None,
                 deadline: float = DEADLINE) -> Dataset:
    """Open a finished dataset.

    Args:
        path: the dataset directory, a file:// URL, or an object-store URL (s3://bucket/prefix,
            gs://…, any fsspec URL).
        cache_dir, cache_limit, storage_options, retry, deadline: for object-store URLs (see
            recordtool.remote.RemoteDataset; deadline: seconds one request may take, 60 by
            default, a ConfigError unless a number in 0.01..86400); a local dataset is mapped
            in place and ignores them, except storage_options: given with a local path they are
            a ConfigError (they would be dropped in silence), as options that are not a dict of
            names are.
    """
    path = os.fspath(path)
    storage_options = check_options(path, storage_options)
    deadline = check_deadline(deadline)
    if is_url(path):
        return RemoteDataset(path, cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options,
                             retry=retry, deadline=deadline)
    return Dataset(path)

"""Everything recordtool raises, and the one failure-policy vocabulary every stage uses.

`except recordtool.RecordtoolError` catches any of our errors; each subclass also derives
from the builtin a caller would expect (`ValueError` for bad data, `FileExistsError` for an
occupied output, …), so older `except ValueError` code keeps working. Messages name the file
and, where there is one, the byte offset.
"""
from __future__ import annotations

import warnings
from enum import Enum


class RecordtoolError(Exception):
    """Base of every error recordtool raises on purpose."""


class FormatError(RecordtoolError, ValueError):
    """Bad data on disk (shard, index, manifest, TFRecord); the message names file and offset."""


class UnsafePath(FormatError):
    """A name from a dataset or source that would lead outside it, or a file that is not a
    regular file (FIFO, device, directory, symlink where none is allowed)."""


class PackError(RecordtoolError, RuntimeError):
    """Pack cannot go on (nothing to write, or a failure under on_error="raise")."""


class OutputExists(RecordtoolError, FileExistsError):
    """OUT holds something pack must not replace."""


class DecodeError(RecordtoolError, RuntimeError):
    """Some images of a batch failed; `.failures` is a list of (batch index, reason)."""

    def __init__(self, failures):
        self.failures = failures
        head = "; ".join(f"#{i}: {r}" for i, r in failures[:5])
        more = f" (+{len(failures) - 5} more)" if len(failures) > 5 else ""
        super().__init__(f"{len(failures)} image(s) failed to decode: {head}{more}")


class RecordError(RecordtoolError, RuntimeError):
    """A record's image could not be decoded; the message names the shard file and byte offset."""


class RemoteError(RecordtoolError, OSError):
    """Object storage kept failing (5xx answers, timeouts, broken or damaged transfers) after
    the retries; the message names the object, the attempts and the last error."""


class CacheFull(RecordtoolError, OSError):
    """The local shard cache cannot make room within its `cache_limit` (too small for the
    shards that must be on disk at once, or every shard in it is in use)."""


class ConfigError(RecordtoolError, ValueError):
    """A parameter out of its range or of the wrong kind; the message names it and what is taken."""


class DeviceUnavailable(RecordtoolError, RuntimeError):
    """The device asked for cannot be used here: CuPy / nvJPEG not installed (the message says
    what to install), or no GPU visible to this process."""


class DatasetNotFound(FormatError, FileNotFoundError):
    """The dataset path does not exist, or is a file rather than a dataset directory (a
    FormatError too: "not a finished dataset", as a folder without a manifest is)."""


class BadState(RecordtoolError, ValueError):
    """A `Loader.load_state_dict` state that does not fit this loader: a missing key, a value of
    the wrong type or out of range, or another run's seed / rank / world size / batch size."""


class OnError(str, Enum):
    """What a stage does with one bad item (a file, a record, an image) — the same three words
    for `pack(on_error=)` / `--on-error`, `Loader(on_error=)`, `decode_crop_resize(on_error=)`
    and `recordtool index --on-error`.

    RAISE: stop with an error naming the item (`--strict` is this).
    WARN: a warning naming the item, then go on without it (pack: listed in pack_report.json;
        loader: the sample is zeros, its label kept, listed in `Loader.bad_records`).
    SKIP: go on without it silently; still listed where WARN lists it.
    """

    RAISE = "raise"
    WARN = "warn"
    SKIP = "skip"


def on_error(value) -> OnError:
    """`value` as an OnError, or ValueError naming the accepted words."""
    try:
        return OnError(value)
    except ValueError:
        raise ValueError(f"on_error must be one of {', '.join(repr(a.value) for a in OnError)}, not {value!r}") \
            from None


def report(policy: OnError, message: str, exc=PackError, stacklevel: int = 3) -> None:
    """Apply a policy to one bad item: raise `exc(message)`, warn, or do nothing (SKIP)."""
    if policy is OnError.RAISE:
        raise exc(message)
    if policy is OnError.WARN:
        warnings.warn(f"recordtool: {message}", RuntimeWarning, stacklevel=stacklevel)

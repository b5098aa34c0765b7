"""Everything recordtool raises, and the one failure-policy vocabulary every stage uses.

`except recordtool.RecordtoolError` catches any of our errors; each subclass also derives
from the builtin a caller would expect (`ValueError` for bad data, `FileExistsError` for an
occupied output, …), so older `except ValueError` code keeps working. Messages name the file
and, where there is one, the byte offset. Every RecordtoolError is importable from
`recordtool` too, except those marked Internal, which never reach a caller.
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


class WorkerLost(PackError):
    """A worker of pack's process or Ray engine died under it (killed by a signal, the OOM
    killer, a lost node) more often than it is retried; the message says what died and
    whether a re-run of the same command resumes."""


class ShardStopped(RecordtoolError):
    """Internal: another shard task failed (or the pack was interrupted), so this one stopped
    early; the driver raises the first real failure instead."""


class Signalled(KeyboardInterrupt):
    """Internal: SIGTERM or SIGHUP reached pack's driver, which stops its workers as on Ctrl-C
    and then dies of the same signal (`signum`)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"stopped by signal {signum}")


class Rejected(RecordtoolError, ValueError):
    """This source file or record cannot become a record; str() is the reason for the report."""


class TFRecordError(FormatError):
    """Bad TFRecord framing or checksum; the message names the file and byte offset."""


class OutputExists(RecordtoolError, FileExistsError):
    """OUT holds something pack must not replace."""


class DecodeError(RecordtoolError, RuntimeError):
    """Some images of a batch failed; `.failures` is a list of (batch index, reason)."""

    def __init__(self, failures):
        self.failures = failures
        head = "; ".join(f"#{i}: {r}" for i, r in failures[:5])
        more = f" (+{len(failures) - 5} more)" if len(failures) > 5 else ""
        super().__init__(f"{len(failures)} image(s) failed to decode: {head}{more}")


class OpCompileError(RecordtoolError, TypeError):
    """A per-image user op (recordtool.ops) cannot be compiled: Numba is missing, or Numba's
    nopython mode refuses the function — the message names the file and line and carries
    Numba's reason."""


class OpError(RecordtoolError, RuntimeError):
    """A user op failed. A compiled per-image op returned a non-zero status (it raised, or
    returned an error code) on some images: `.failures` is a list of (batch index, status). Or
    Python code of an op raised on a batch (a batch op, an ImageOp's `params`): `.failures` is
    empty, the message names the op and the exception, and `__cause__` is that exception."""

    def __init__(self, failures, name: str = "user op", where: str = "", raised: BaseException | None = None):
        self.failures, self.name = failures, name
        if raised is not None:
            super().__init__(f"{name} raised {type(raised).__name__}: {raised}{where}")
            return
        codes = "; ".join(f"#{i}: {OP_STATUS.get(c, f'returned {c}')}" for i, c in failures[:5])
        more = f" (+{len(failures) - 5} more)" if len(failures) > 5 else ""
        super().__init__(f"{name} failed on {len(failures)} image(s){where}: {codes}{more}")


# statuses the compiled-op wrapper (recordtool.ops.compile) returns itself
OP_RAISED, OP_BAD_STRIDE = -1, -2
OP_STATUS = {OP_RAISED: "raised an exception — with op.with_checks(), an index past the image too (run "
                        "op.image on a copy of the image, uncompiled, to see it)",
             OP_BAD_STRIDE: "called with a row stride other than width × 3"}


class OpResultError(RecordtoolError, TypeError):
    """A batch user op returned something other than what its contract says (the uint8 NHWC
    batch it was given, or an array of that type, shape and dtype): normalising it would fail
    later with an unrelated message, or train on what the op never edited."""


class NotADataset(RecordtoolError, TypeError):
    """A Loader used where a torch `Dataset` is expected (wrapped in `torch.utils.data.DataLoader`,
    indexed, pickled into a worker process): the Loader is itself the data loader; the message
    says what to do instead."""


class NativeDecoderMissing(RecordtoolError, ImportError):
    """The native decoder (`recordtool._native`) is not in this install, and the program did
    not opt in to the Python decoder (`recordtool.decode.allow_python_decoder()`, a full
    decode where the native one decodes only the window: slower). Raised at the first decode, not at import: the message holds the one-line fix.
    An ImportError too, since what is missing is a module."""


class RecordError(RecordtoolError, RuntimeError):
    """A record's image could not be decoded; the message names the shard file and byte offset."""


class RemoteError(RecordtoolError, OSError):
    """Object storage kept failing (5xx answers, timeouts, broken or damaged transfers) after
    the retries; the message names the object, the attempts and the last error."""


class AccessDenied(RemoteError, PermissionError):
    """The object store refused the credentials (missing, invalid, expired, or anonymous access
    to a private bucket): not retried, since asking again changes nothing; the message names
    the object and where credentials come from."""


class DatasetChanged(RecordtoolError, OSError):
    """A pickled dataset, unpickled, found another dataset at its path or URL (re-packed since:
    other shards, labels or classes); the message names the path."""


class NoBucket(RecordtoolError, FileNotFoundError):
    """The bucket (or container) a URL names does not exist on the object store."""


class Cancelled(RecordtoolError):
    """A download stopped because its reader was closed."""


class Damaged(Exception):
    """A transfer that arrived incomplete, too long or altered (size or checksum). Not a
    RecordtoolError on purpose: it is retried like a 5xx, and RemoteError names it after the
    last try."""


class CacheFull(RecordtoolError, OSError):
    """The local shard cache cannot make room within its `cache_limit` (too small for the
    shards that must be on disk at once, or every shard in it is in use)."""


class CacheChanged(RecordtoolError, OSError):
    """Another program keeps deleting or replacing files of the local shard cache while
    recordtool writes them (a cache cleaner, say); the message names the path."""


class ConfigError(RecordtoolError, ValueError):
    """A bad parameter, whichever layer checks it: a value out of its range (`pack(max_side=-5)`,
    a shard size of 1e400 MB), a Loader argument or part field of the wrong type or value, an
    option that would do nothing. The API's error for what the CLI reports as a usage error
    (exit 2). The message names the parameter."""


class ThreadStartError(RecordtoolError, OSError):
    """The system would not start a native decode thread (a memory cap leaves no room for its
    stack, a thread limit is reached). Fewer `threads` may work; the threads the failed call
    started are stopped and joined, so nothing of it stays behind."""


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
    """`value` as an OnError, or ConfigError (a ValueError) naming the accepted words."""
    try:
        return OnError(value)
    except ValueError:
        raise ConfigError(f"on_error must be one of {', '.join(repr(a.value) for a in OnError)}, not {value!r}") \
            from None


def report(policy: OnError, message: str, exc=PackError, stacklevel: int = 3) -> None:
    """Apply a policy to one bad item: raise `exc(message)`, warn, or do nothing (SKIP)."""
    if policy is OnError.RAISE:
        raise exc(message)
    if policy is OnError.WARN:
        warnings.warn(f"recordtool: {message}", RuntimeWarning, stacklevel=stacklevel)

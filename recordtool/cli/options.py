"""What every command shares: the one error decorator (`errors`), the option types that bound
a value where it is declared (`Size`, `Ints`, `Finite`, the ranges; recordtool.checks holds the
bounds the Python API applies too), `--on-error`/`--strict` (`on_error_policy`) and the remote-dataset
options."""
from __future__ import annotations

import functools

import click

from .. import checks
from ..errors import ConfigError, RecordtoolError, Signalled


class Interrupted(click.ClickException):
    """Ctrl-C: one line, and the status shells give a command that SIGINT ended (128 + 2)."""

    exit_code = 130

    def __init__(self):
        super().__init__("interrupted")


def errors(command):
    """The one error policy of every command: recordtool's errors, the system's (a missing
    file, a full disk), a bad value and a missing optional package become one line on stderr
    and exit status 1; Ctrl-C is `Error: interrupted` and exit status 130 (the command has
    stopped its workers by then); anything else is a bug and keeps its traceback."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (RecordtoolError, OSError, ValueError, ImportError) as e:
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt as e:
            if isinstance(e, Signalled):  # SIGTERM / SIGHUP: the process ends by that signal
                raise
            raise Interrupted() from None

    return run


# Numeric options are bounded where they are declared (recordtool.checks holds the bounds the
# Python API applies too): a value out of range is a usage error, exit 2, naming the option.
class Size(click.ParamType):
    """A byte size: '128MB', '1GiB', '1.5GB', '1000000', in lo..hi."""

    name = "size"

    def __init__(self, lo: int = 1, hi: int = checks.MAX_SHARD_SIZE):
        self.lo, self.hi = lo, hi

    def convert(self, value, param, ctx):
        try:
            return checks.parse_size("the size", value, self.lo, self.hi)
        except ConfigError as e:
            self.fail(str(e), param, ctx)


class Ints(click.ParamType):
    """Comma-separated integers, each in lo..hi, at least one."""

    name = "ints"

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        try:
            return checks.parse_ints("each value", value, self.lo, self.hi)
        except ConfigError as e:
            self.fail(str(e), param, ctx)


class Finite(click.FloatRange):
    """A float in min..max, NaN refused too (click's FloatRange lets NaN through)."""

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if v != v:
            self.fail(f"{value!r} is not a number", param, ctx)
        return v


THREADS = click.IntRange(1, checks.MAX_THREADS)
SEED = click.IntRange(0, checks.MAX_SEED)
CLASSES = click.IntRange(1, checks.CLASSES_LIMIT)
BATCH = click.IntRange(1, checks.MAX_BATCH)
EPOCHS = click.IntRange(1, checks.MAX_EPOCHS)


def on_error_policy(on_error, strict: bool) -> str:
    """--strict is --on-error raise; both at once must agree."""
    if strict and on_error not in (None, "raise"):
        raise click.UsageError(f"--strict contradicts --on-error {on_error}")
    return "raise" if strict else (on_error or "skip")


class DatasetPath(click.Path):
    """A dataset directory that must exist, or an object-store URL (s3://bucket/prefix, gs://…)."""

    def convert(self, value, param, ctx):
        from ..io.fs import is_url

        return value if is_url(value) else super().convert(value, param, ctx)


DATASET = DatasetPath(exists=True, file_okay=False)


def cache_dir_option(f):
    return click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
                        help="Local cache of a remote dataset's files (default $RECORDTOOL_CACHE_DIR, "
                        "else ~/.cache/recordtool).")(f)


def cache_limit_option(f):
    return click.option("--cache-limit", type=Size(hi=checks.MAX_CACHE_LIMIT), default=None,
                        help="Bytes of shards the local cache may hold for a remote dataset, e.g. 20GB "
                        "(default: the whole dataset, at most 80% of the free disk).")(f)

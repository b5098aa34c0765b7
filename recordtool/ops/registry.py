"""Compiled per-image ops by name, for the tools: `recordtool bench --op NAME` and the training
benchmark build their op with `by_name`, so a name means the same op (class and arguments)
everywhere it is measured.

A name is looked up case-insensitively, with '-' and '_' ignored ("ColorJitter", "color_jitter",
"jitter" are one op). A spec may carry arguments after a colon, `"cutout:size=32"`,
`"jitter:brightness=0.2,saturation=0"`, parsed as finite numbers; keyword arguments of `by_name`
win. So a name may not hold a colon (`register` refuses one: `by_name` could never reach it).
Errors are ConfigError (a ValueError), naming the op and the argument.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..util import ForkLock
from .base import ImageOp
from .examples import ColorJitter, Cutout, RandomGrayscale


@dataclass(frozen=True)
class Entry:
    """A registered op: its class and the arguments its name stands for."""

    name: str
    cls: type
    defaults: dict = field(default_factory=dict, hash=False)
    aliases: tuple = ()


_lock = ForkLock()
_entries: dict = {}  # canonical name → Entry
_names: dict = {}  # every key (canonical names and aliases, folded) → canonical name


def _fold(name: str) -> str:
    return name.strip().lower().replace("-", "").replace("_", "")


def _check_name(name) -> str:
    """A name `by_name` can reach: a string, not empty once folded, without the colon that
    starts a spec's arguments."""
    if not isinstance(name, str):
        raise ConfigError(f"an op name must be a string, not {name!r}")
    if not _fold(name):
        raise ConfigError(f"op name {name!r} is empty (names ignore case, spaces at the ends, '-' and '_')")
    if ":" in name:
        raise ConfigError(f"op name {name!r} holds ':', which starts a spec's arguments: by_name could never "
                          "reach it")
    return name


def register(name: str, cls: type, aliases=(), **defaults) -> None:
    """Register an ImageOp subclass under `name` (and `aliases`), built with `defaults` unless
    the caller overrides them. ValueError when a name or alias is taken by another op; the same
    class registered again under its name replaces its entry (a module imported twice).
    ConfigError (a ValueError) for a name `by_name` cannot reach (not a string, empty, holding
    ':'); TypeError for a class that is not an ImageOp."""
    if not (isinstance(cls, type) and issubclass(cls, ImageOp)):
        raise TypeError(f"{cls!r} is not an ImageOp subclass")
    name = _check_name(name)
    if isinstance(aliases, str):
        aliases = (aliases,)
    aliases = tuple(_check_name(a) for a in aliases)
    entry = Entry(name, cls, dict(defaults), tuple(aliases))
    keys = [_fold(k) for k in (name, *aliases)]
    with _lock:
        old = _entries.get(name)
        if old is not None and old.cls is not cls:
            raise ConfigError(f"op name {name!r} is already registered for {old.cls.__name__}")
        for k in keys:
            taken = _names.get(k)
            if taken is not None and taken != name:
                raise ConfigError(f"op name {k!r} is already registered for {taken!r}")
        if old is not None:
            for k in (name, *old.aliases):
                _names.pop(_fold(k), None)
        _entries[name] = entry
        for k in keys:
            _names[k] = name


def names() -> tuple:
    """The canonical names, in registration order."""
    with _lock:
        return tuple(_entries)


def lookup(name: str) -> Entry:
    """The Entry of a name or alias; ConfigError listing the known names."""
    with _lock:
        canonical = _names.get(_fold(name)) if isinstance(name, str) else None
        if canonical is None:
            raise ConfigError(f"unknown op {name!r}: one of {', '.join(_entries)}")
        return _entries[canonical]


def _number(key: str, text: str):
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"op argument {key}={text!r} is not a number") from None
    if not math.isfinite(value):  # "1e400", "inf", "nan": no op argument means that
        raise ConfigError(f"op argument {key}={text!r} is not a finite number")
    return value


def parse(spec: str) -> tuple:
    """'name' or 'name:key=value,…' → (Entry, {key: number})."""
    name, _, rest = spec.partition(":")
    entry = lookup(name)
    args = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"op argument {item!r} of {spec!r} is not key=value")
        args[key.strip()] = _number(key.strip(), value)
    return entry, args


def by_name(spec: str, **kwargs) -> ImageOp:
    """A new op from its name or spec (module docstring), e.g. `by_name("colorjitter")`,
    `by_name("cutout:size=32", seed=1)`. ConfigError (a ValueError) for an unknown name, a
    malformed argument, one the op does not take, or a value the op refuses."""
    if not isinstance(spec, str):
        raise ConfigError(f"an op spec must be a string such as 'cutout:size=32', not {spec!r}")
    entry, args = parse(spec)
    merged = {**entry.defaults, **args, **kwargs}
    try:
        return entry.cls(**merged)
    except TypeError as e:
        raise ConfigError(f"op {entry.name!r} ({entry.cls.__name__}): {e}") from None


# the tools' names; the arguments are those of BENCHMARKS.md's "Compiled per-image ops" tables
register("grayscale", RandomGrayscale, aliases=("randomgrayscale", "gray"), p=0.2)
register("cutout", Cutout, size=56)
register("jitter", ColorJitter, aliases=("colorjitter",), brightness=0.4, contrast=0.4, saturation=0.4)

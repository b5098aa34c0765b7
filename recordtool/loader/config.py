"""The Loader's configuration in parts, each a frozen, hashable value checked once when it is
made (ConfigError naming the field), so the layers below trust it and take it whole:

- `Output`: what a batch looks like (size, normalisation, dtype, layout, memory format);
- `TrainCrop` / `EvalCrop`: the augmentation — training's RandomResizedCrop and flip, or
  evaluation's resize and centre crop (which one also says whether the Loader trains);
- `GPUOptions`: how a cuda Loader shares its images between the GPU decoders and the CPU;
- `RemoteOptions`: how a dataset URL is reached and cached.

`Output`, `TrainCrop` and `EvalCrop` are defined in decode.spec and `GPUOptions` in
decode.options (the decode stage takes them) and only re-exported here. The Loader's flat
keywords (`size=`, `scale=`, `split=`, `cache_dir=`, ...) are a shorthand: `fold` is the one
adapter that sorts them by part, and `parts` makes each part of its keywords, so a value given
either way is checked by the same part, once; nothing turns a part back into flat names.
"""
from __future__ import annotations

import difflib
import os
import types
from dataclasses import dataclass, field, fields
from typing import Mapping, NamedTuple

from ..checks import MAX_CACHE_LIMIT, bounded_int, check_deadline, flag
from ..decode.device import Device
from ..decode.options import GPUOptions
from ..decode.spec import EvalCrop, Output, TrainCrop
from ..errors import ConfigError
from ..io.fs import DEADLINE, check_options, is_url, option_names
from ..reader import Dataset

__all__ = ["Output", "TrainCrop", "EvalCrop", "GPUOptions", "RemoteOptions", "Parts", "fold", "parts"]


@dataclass(frozen=True)
class RemoteOptions:
    """How a dataset URL (s3://bucket/prefix, any fsspec URL) is reached and cached, as
    `recordtool.open` takes them (recordtool.remote.RemoteDataset). Frozen and hashable (the
    options are kept as a read-only copy, left out of the hash); checked once here. Given for
    a local dataset or an open Dataset it is a ConfigError: it would do nothing.

    Args:
        cache_dir: None — the folder shards are cached in (each dataset gets its own folder
            inside it); None: the user's cache folder (recordtool.io.cache.default_dir).
        cache_limit: None — bytes of shards the dataset's cache folder may hold, an integer
            ≥ 1; None: the whole dataset, or 80 % of the free disk space when that is less.
            Below the dataset's size the shards are fetched again each epoch (a block shuffle
            keeps two blocks at most).
        storage_options: None — the fsspec options that reach the store (a dict of option
            names: endpoint_url, key, secret, ...); None: fsspec's own configuration. An
            empty dict is None.
        deadline: 60.0 — seconds one request to the store may take in all (connecting, the
            answer, each 8 MiB piece of a download; async stores: s3fs, gcsfs, …), a number in
            0.01..86400; then it is cancelled and retried as a timeout (recordtool.io.Retry:
            5 tries), so a store that never answers fails within about 5 × deadline.
    """

    cache_dir: str | None = None
    cache_limit: int | None = None
    storage_options: Mapping | None = field(default=None, hash=False)
    deadline: float = DEADLINE

    def __post_init__(self):
        set_ = object.__setattr__
        if self.cache_dir is not None:
            if not isinstance(self.cache_dir, (str, os.PathLike)):
                raise ConfigError(f"cache_dir must be a folder path, not {type(self.cache_dir).__name__}")
            set_(self, "cache_dir", os.fspath(self.cache_dir))
        if self.cache_limit is not None:
            set_(self, "cache_limit", bounded_int("cache_limit", self.cache_limit, 1, MAX_CACHE_LIMIT, floats=False))
        options = option_names(self.storage_options)
        set_(self, "storage_options", types.MappingProxyType(options) if options else None)
        set_(self, "deadline", check_deadline(self.deadline))

    def open_args(self) -> dict:
        """The keywords `recordtool.open` takes for these options."""
        options = None if self.storage_options is None else dict(self.storage_options)
        return dict(cache_dir=self.cache_dir, cache_limit=self.cache_limit, storage_options=options,
                    deadline=self.deadline)


class Parts(NamedTuple):
    """A Loader's configuration, each part checked: `gpu` None on the CPU, `remote` None when
    no remote option was given."""

    train: bool
    output: Output
    augment: TrainCrop | EvalCrop
    gpu: GPUOptions | None
    remote: RemoteOptions | None


# each part's flat keywords: its fields, as the Loader takes them
PART_KEYWORDS = {name: tuple(f.name for f in fields(cls)) for name, cls in
                 (("output", Output), ("train", TrainCrop), ("eval", EvalCrop), ("gpu", GPUOptions),
                  ("remote", RemoteOptions))}


def fold(shorthand: dict, known=()) -> dict:
    """The flat shorthand's one adapter: the Loader's keywords that are a part's fields, sorted
    by part — {"output", "train" (TrainCrop's), "eval" (EvalCrop's), "gpu", "remote": {field:
    value as given}} — for `parts` to make each part of; ConfigError for a keyword that is no
    part's field, naming the nearest of them and of `known` (the Loader's own keywords)."""
    names = [k for fs in PART_KEYWORDS.values() for k in fs]
    for k in shorthand:
        if k not in names:
            near = difflib.get_close_matches(k, names + list(known), n=1)
            raise ConfigError(f"Loader got an unknown keyword {k!r}" + (f"; did you mean {near[0]!r}?" if near else ""))
    return {part: {k: shorthand[k] for k in fs if k in shorthand} for part, fs in PART_KEYWORDS.items()}


def _part(name: str, part, cls, given: dict):
    """The part given, or one made of its keywords; ConfigError for both, or a wrong type."""
    if part is None:
        return cls(**given) if given else None
    if not isinstance(part, cls):
        raise ConfigError(f"{name} must be a recordtool.{cls.__name__}, not {type(part).__name__}")
    if given:
        raise ConfigError(f"{', '.join(given)} and {name}= both given: set {'it' if len(given) == 1 else 'them'} "
                          f"in {name}={cls.__name__}(...), or leave {name} out")
    return part


def _augment(train, augment, train_kw: dict, eval_kw: dict) -> tuple:
    """(train, TrainCrop or EvalCrop). train None: False for an EvalCrop, else True. The crop
    keywords of the other mode, set away from their defaults, are refused (they would do
    nothing), at their defaults dropped."""
    if augment is not None:
        if not isinstance(augment, (TrainCrop, EvalCrop)):
            raise ConfigError(f"augment must be a recordtool.TrainCrop or EvalCrop, not {type(augment).__name__}")
        given = {**train_kw, **eval_kw}
        if given:
            raise ConfigError(f"{', '.join(given)} and augment= both given: set {'it' if len(given) == 1 else 'them'} "
                              "in augment=TrainCrop(...) / EvalCrop(...), or leave augment out")
        kind = isinstance(augment, TrainCrop)
        if train is not None and flag(train, "train") != kind:
            raise ConfigError(f"train={train} contradicts augment={augment!r} ({'training' if kind else 'evaluation'}"
                              f"): leave train out (the augment says it) or pass "
                              f"{'EvalCrop' if kind else 'TrainCrop'}(...)")
        return kind, augment
    train = True if train is None else flag(train, "train")
    crop, centre = TrainCrop(**train_kw), EvalCrop(**eval_kw)  # each checked, used or not
    if train:
        unused = [k for k in PART_KEYWORDS["eval"] if getattr(centre, k) != getattr(EvalCrop(), k)]
    else:
        unused = [k for k in PART_KEYWORDS["train"] if getattr(crop, k) != getattr(TrainCrop(), k)]
    if unused:  # a setting that does nothing is refused, not ignored
        what = "evaluation's centre crop" if train else "training's RandomResizedCrop and flip"
        raise ConfigError(f"{', '.join(unused)}: set for {what}, nothing with train={train}; leave "
                          f"{'it' if len(unused) == 1 else 'them'} at the default or pass train={not train}")
    return train, (crop if train else centre)


def parts(path, device: Device, *, train, output, augment, gpu, remote, flat: dict) -> Parts:
    """The Loader's parts from its part arguments and its flat keywords sorted by `fold`
    (`flat`): each part given, or made of its keywords, so it is checked there, once.
    ConfigError for a part given with one of its keywords, GPU options on the CPU, remote
    options for a local path or an open Dataset."""
    train, augment = _augment(train, augment, flat["train"], flat["eval"])
    output = _part("output", output, Output, flat["output"]) or Output()
    if not output.normalized:
        raise ConfigError("dtype must be float32, float16 or bfloat16 (the Loader normalises)")
    gpu_kw = flat["gpu"]
    given_gpu = gpu is not None
    gpu = _part("gpu", gpu, GPUOptions, gpu_kw)
    if not device.cuda:
        if given_gpu:
            raise ConfigError(f"GPU options given for device={str(device)!r}: gpu= is for a cuda Loader; leave it out")
        changed = [k for k in gpu_kw if getattr(gpu, k) != getattr(GPUOptions(), k)]
        if changed:
            raise ConfigError(f"GPU options given for device={str(device)!r}: {', '.join(changed)} "
                              f"{'does' if len(changed) == 1 else 'do'} nothing on the CPU; leave "
                              f"{'it' if len(changed) == 1 else 'them'} out or pass device='cuda'")
        gpu = None
    elif gpu is None:
        gpu = GPUOptions()
    given_remote = remote is not None
    remote = _part("remote", remote, RemoteOptions, flat["remote"])
    if not given_remote and remote == RemoteOptions():
        remote = None  # keywords at their defaults (None, {}): nothing asked
    local = isinstance(path, Dataset) or not is_url(os.fspath(path))
    if remote is not None and local:
        names = [k for k in PART_KEYWORDS["remote"] if getattr(remote, k) != getattr(RemoteOptions(), k)] or ["remote"]
        if isinstance(path, Dataset):
            raise ConfigError(f"remote options ({', '.join(names)}) are for opening a dataset URL; the Dataset "
                              "given is open already: leave them out, or pass its URL")
        check_options(path, remote.storage_options)  # names the options (not their values)
        raise ConfigError(f"remote options ({', '.join(names)}) given for {os.fspath(path)!r}, a local path: a "
                          "local dataset is mapped in place; leave them out, or give the dataset's URL")
    return Parts(train, output, augment, gpu, remote)

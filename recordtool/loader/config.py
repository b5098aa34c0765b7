"""The Loader's configuration in parts, each a frozen, hashable value checked once when it is
made (ConfigError naming the field), so the layers below trust it:

- `Output`: what a batch looks like (size, normalisation, dtype, layout, memory format);
- `TrainCrop` / `EvalCrop`: the augmentation — training's RandomResizedCrop and flip, or
  evaluation's resize and centre crop (which one also says whether the Loader trains);
- `GPUOptions`: how a cuda Loader shares its images between the GPU decoders and the CPU;
- `RemoteOptions`: how a dataset URL is reached and cached.

`Output`, `TrainCrop` and `EvalCrop` are defined in decode.spec (the decode stage and the
windows take them) and only re-exported here. `parts` folds the Loader's flat keywords
(`size=`, `scale=`, `split=`, `cache_dir=`, ...) into these parts, so a value given either way
is checked by the same part, once.
"""
from __future__ import annotations

import difflib
import os
import types
from dataclasses import dataclass, field, fields
from typing import Mapping, NamedTuple

from ..checks import MAX_CACHE_LIMIT, bounded_int, check_deadline
from ..decode.gpu import DEFAULT_CHROMA, First, Split, check_chroma, check_first, check_split  # neither CuPy nor nvJPEG
from ..decode.spec import EvalCrop, Output, TrainCrop
from ..errors import ConfigError
from ..io.fs import DEADLINE, check_options, is_url, option_names
from ..reader import Dataset
from .args import flag
from .device import Device

__all__ = ["Output", "TrainCrop", "EvalCrop", "GPUOptions", "RemoteOptions", "Parts", "parts"]


@dataclass(frozen=True)
class GPUOptions:
    """How a cuda Loader shares a batch's images between the NVJPG engines, nvJPEG's hybrid
    decoder and the CPU (decode.gpu.plan). Frozen and hashable; checked once here. Given with
    device="cpu" it is a ConfigError: it would do nothing.

    Args:
        split: "auto" — "auto": one side decodes first (`first`), the other takes images
            only while the training loop waits for its batch (plan.Demand), up to the share
            where both would finish together (an image may be decoded by either: README's
            fidelity bound); "gpu": every image the engines can take goes to them
            (bit-identical runs); "cpu": everything on the CPU; or a fixed CPU share in [0, 1].
        first: "engines" — with split="auto", the side that decodes first: "engines" or "cpu".
            The engines first at any number of cores: CPU decode first takes the cores the
            training loop runs on (ResNet-18 at 4 cores: 4.6k img/s CPU-first, 7.7k with every
            image on the engines), and on 16 cores, where it keeps up alone, it kept 9-12 of
            them busy where the engines first kept 2-3, for a ResNet-50 rate 1-4 % higher
            (BENCHMARKS.md). "cpu": for a host whose spare cores cost nothing (the CPU share's
            pixels take the model no GPU time); plan.First.
        hybrid: True — progressive files (and, without same_pixels, gray ones) go to nvJPEG's
            hybrid decoder, which the engines cannot take; False: to the CPU.
        chroma: "interpolate" — how GPU-decoded 4:2:0 / 4:2:2 chroma is upsampled:
            "interpolate" (libjpeg-turbo's filter in our kernel: the CPU path's pixels, so a
            model sees the same images on either device), "replicate" (nvJPEG's output as it
            is) or "nvjpeg" (nvJPEG's own interpolation); decode.gpu.plan.Chroma.
        same_pixels: False — True: 4:4:4 and gray JPEGs go to the CPU share, so their images
            equal device="cpu"'s bit for bit. False: the GPU decoders take them too (≥ 51 dB
            against the CPU path, README's fidelity bound). Not the default because on a node's
            share of cores those images (a tenth of ImageNet) are what the few CPU threads
            cannot keep up with: ResNet-18 trained 40 % slower on 4 cores with it (BENCHMARKS.md).
        run_ahead: 1 — training steps of GPU work the consuming thread may still have queued
            when it takes a batch: before handing out batch k the Loader sleeps (GIL released)
            until the GPU has finished what that thread queued before taking batch k - run_ahead.
            An eager loop left unbounded runs ahead until CUDA's launch queue is full and then
            blocks inside a kernel launch with the GIL held — the decoders' threads then wait
            for the GIL and their nvJPEG submissions for the same queue (beside a free-running
            ResNet-50 loop the engines delivered 1.8k img/s, beside the same loop waiting each
            step 4.8k: BENCHMARKS.md). 1 still keeps a whole step queued ahead of the GPU; None:
            unbounded (the loop runs as far ahead as CUDA lets it).
    """

    split: Split = "auto"
    first: First = "engines"
    hybrid: bool = True
    chroma: str = DEFAULT_CHROMA
    same_pixels: bool = False
    run_ahead: int | None = 1

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "split", check_split(self.split))
        set_(self, "first", check_first(self.first))
        set_(self, "hybrid", flag(self.hybrid, "hybrid"))
        set_(self, "chroma", check_chroma(self.chroma))
        set_(self, "same_pixels", flag(self.same_pixels, "same_pixels"))
        if self.run_ahead is not None:
            set_(self, "run_ahead", bounded_int("run_ahead", self.run_ahead, 1, 64, floats=False))


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


# the flat keywords of each part (its fields), as the Loader takes them
def _names(cls) -> tuple:
    return tuple(f.name for f in fields(cls))


_OUTPUT, _TRAIN, _EVAL, _GPU, _REMOTE = map(_names, (Output, TrainCrop, EvalCrop, GPUOptions, RemoteOptions))
SHORTHANDS = _OUTPUT + _TRAIN + _EVAL + _GPU + _REMOTE


def _take(shorthand: dict, names: tuple) -> dict:
    return {k: shorthand.pop(k) for k in names if k in shorthand}


def _part(name: str, part, cls, given: dict):
    """The part given, or one made of its shorthands; ConfigError for both, or a wrong type."""
    if part is None:
        return cls(**given) if given else None
    if not isinstance(part, cls):
        raise ConfigError(f"{name} must be a recordtool.{cls.__name__}, not {type(part).__name__}")
    if given:
        raise ConfigError(f"{', '.join(given)} and {name}= both given: set {'it' if len(given) == 1 else 'them'} "
                          f"in {name}={cls.__name__}(...), or leave {name} out")
    return part


def _augment(train, augment, shorthand: dict) -> tuple:
    """(train, TrainCrop or EvalCrop). train None: False for an EvalCrop, else True. The crop
    keywords of the other mode, set away from their defaults, are refused (they would do
    nothing), at their defaults dropped."""
    train_kw, eval_kw = _take(shorthand, _TRAIN), _take(shorthand, _EVAL)
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
        unused = [k for k in _EVAL if getattr(centre, k) != getattr(EvalCrop(), k)]
    else:
        unused = [k for k in _TRAIN if getattr(crop, k) != getattr(TrainCrop(), k)]
    if unused:  # a setting that does nothing is refused, not ignored
        what = "evaluation's centre crop" if train else "training's RandomResizedCrop and flip"
        raise ConfigError(f"{', '.join(unused)}: set for {what}, nothing with train={train}; leave "
                          f"{'it' if len(unused) == 1 else 'them'} at the default or pass train={not train}")
    return train, (crop if train else centre)


def parts(path, device: Device, *, train, output, augment, gpu, remote, shorthand: dict, keywords=()) -> Parts:
    """The Loader's parts from its part arguments and flat keywords (`shorthand`): each
    keyword folded into its part, so it is checked there, once. ConfigError for an unknown
    keyword (naming the nearest of SHORTHANDS and `keywords`, the Loader's own), a part given
    with one of its keywords, GPU options on the CPU, remote options for a local path or an
    open Dataset."""
    shorthand = dict(shorthand)
    unknown = [k for k in shorthand if k not in SHORTHANDS]
    if unknown:
        k = unknown[0]
        near = difflib.get_close_matches(k, list(SHORTHANDS) + list(keywords), n=1)
        raise ConfigError(f"Loader got an unknown keyword {k!r}" + (f"; did you mean {near[0]!r}?" if near else ""))
    train, augment = _augment(train, augment, shorthand)
    output = _part("output", output, Output, _take(shorthand, _OUTPUT)) or Output()
    if not output.normalized:
        raise ConfigError("dtype must be float32, float16 or bfloat16 (the Loader normalises)")
    gpu_kw = _take(shorthand, _GPU)
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
    remote_kw = _take(shorthand, _REMOTE)
    given_remote = remote is not None
    remote = _part("remote", remote, RemoteOptions, remote_kw)
    if not given_remote and remote == RemoteOptions():
        remote = None  # keywords at their defaults (None, {}): nothing asked
    local = isinstance(path, Dataset) or not is_url(os.fspath(path))
    if remote is not None and local:
        names = [k for k in _REMOTE if getattr(remote, k) != getattr(RemoteOptions(), k)] or ["remote"]
        if isinstance(path, Dataset):
            raise ConfigError(f"remote options ({', '.join(names)}) are for opening a dataset URL; the Dataset "
                              "given is open already: leave them out, or pass its URL")
        check_options(path, remote.storage_options)  # names the options (not their values)
        raise ConfigError(f"remote options ({', '.join(names)}) given for {os.fspath(path)!r}, a local path: a "
                          "local dataset is mapped in place; leave them out, or give the dataset's URL")
    return Parts(train, output, augment, gpu, remote)

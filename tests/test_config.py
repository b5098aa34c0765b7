"""The Loader's configuration parts (recordtool.loader.config): each checked once, frozen and
hashable; the flat keywords folded into them give the same batches; the combinations that
would do nothing or contradict each other are refused."""
import dataclasses
import math

import numpy as np
import pytest

import recordtool
from conftest import jpeg_bytes, write
from recordtool import EvalCrop, GPUOptions, Loader, Output, RemoteOptions, TrainCrop
from recordtool.decode.spec import IMAGENET_MEAN, IMAGENET_STD
from recordtool.errors import ConfigError
from recordtool.pack import pack


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("config")
    src = root / "src"
    for i in range(24):
        write(str(src / f"c{i % 3}" / f"{i}.jpg"), jpeg_bytes(64 + 8 * (i % 4), 48 + 4 * (i % 5), seed=i))
    pack(str(src), str(root / "out"), shards=2, progress=False)
    return str(root / "out")


def batches(loader):
    out = [(np.asarray(x).copy(), np.asarray(y).copy()) for x, y in loader]
    loader.close()
    return out


# ---------------------------------------------------------------- each part checks each field

BAD = [
    (Output, {"size": 0}, "size"), (Output, {"size": 2.5}, "size"), (Output, {"size": True}, "size"),
    (Output, {"size": (16, 0)}, r"size \(width\)"), (Output, {"size": (1, 2, 3)}, "size"),
    (Output, {"mean": (0, 0)}, "mean"), (Output, {"mean": (0, 0, float("nan"))}, "mean"),
    (Output, {"std": (1, 0, 1)}, "std"), (Output, {"dtype": "int8"}, "dtype"), (Output, {"layout": "CHW"}, "layout"),
    (Output, {"memory_format": "preserve"}, "memory_format"),
    (Output, {"memory_format": "channels_last", "layout": "NHWC"}, "memory_format"),
    (TrainCrop, {"scale": (0.0, 1.0)}, "scale"), (TrainCrop, {"scale": (0.5, 0.2)}, "scale"),
    (TrainCrop, {"scale": 0.5}, "scale"), (TrainCrop, {"ratio": (2, 1)}, "ratio"),
    (TrainCrop, {"scale": {0.08, 1.0}}, r"scale must be a pair \(lo, hi\), a tuple or list, not \{"),  # no order
    (TrainCrop, {"ratio": {0.75, 1.33}}, "ratio must be a pair"), (TrainCrop, {"scale": {0.08: 1.0}}, "scale"),
    (TrainCrop, {"ratio": (1, math.inf)}, "ratio"), (TrainCrop, {"hflip": 1.5}, "hflip"),
    (TrainCrop, {"hflip": True}, "hflip"), (TrainCrop, {"hflip": "0.5"}, "hflip"),
    (EvalCrop, {"crop_pct": 0}, "crop_pct"), (EvalCrop, {"crop_pct": 1.2}, "crop_pct"),
    (EvalCrop, {"crop_pct": None}, "crop_pct"),
    (GPUOptions, {"split": "gpus"}, "split"), (GPUOptions, {"split": 1.5}, "split"),
    (GPUOptions, {"split": "0.5"}, "split"), (GPUOptions, {"split": True}, "split"),
    (GPUOptions, {"split": float("nan")}, "split"), (GPUOptions, {"hybrid": 1}, "hybrid"),
    (GPUOptions, {"hybrid": "yes"}, "hybrid"), (GPUOptions, {"chroma": "bilinear"}, "chroma"),
    (GPUOptions, {"chroma": None}, "chroma"), (GPUOptions, {"same_pixels": 0}, "same_pixels"),
    (GPUOptions, {"first": "gpu"}, "first"), (GPUOptions, {"first": None}, "first"),
    (GPUOptions, {"run_ahead": 0}, "run_ahead"), (GPUOptions, {"run_ahead": 1.0}, "run_ahead"),
    (GPUOptions, {"run_ahead": True}, "run_ahead"), (GPUOptions, {"run_ahead": 65}, "run_ahead"),
    (GPUOptions, {"hybrid_lanes": 0}, "hybrid_lanes"), (GPUOptions, {"hybrid_lanes": 9}, "hybrid_lanes"),
    (GPUOptions, {"hybrid_lanes": 2.0}, "hybrid_lanes"), (GPUOptions, {"hybrid_lanes": True}, "hybrid_lanes"),
    (GPUOptions, {"engines_ahead": 1}, "engines_ahead"), (GPUOptions, {"engines_ahead": "no"}, "engines_ahead"),
    (RemoteOptions, {"cache_dir": 3}, "cache_dir"), (RemoteOptions, {"cache_limit": 0}, "cache_limit"),
    (RemoteOptions, {"cache_limit": -1}, "cache_limit"), (RemoteOptions, {"cache_limit": "200GB"}, "cache_limit"),
    (RemoteOptions, {"cache_limit": True}, "cache_limit"),
    (RemoteOptions, {"storage_options": "endpoint_url=x"}, "storage_options"),
    (RemoteOptions, {"storage_options": {1: "x"}}, "storage_options"),
]


@pytest.mark.parametrize("cls,kw,match", BAD, ids=[f"{c.__name__}-{list(k)[0]}-{i}" for i, (c, k, _) in enumerate(BAD)])
def test_each_bad_field_is_a_config_error_naming_it(cls, kw, match):
    with pytest.raises(ConfigError, match=match):
        cls(**kw)


def test_the_parts_normalise_what_they_take():
    assert Output(32).size == (32, 32) and Output((12, 20)).size == (12, 20)
    assert Output(dtype=np.float16).dtype == "float16" and Output(mean=[0, 0, 0]).mean == (0.0, 0.0, 0.0)
    assert TrainCrop(scale=[0.2, 1]).scale == (0.2, 1.0) and EvalCrop(1).crop_pct == 1.0
    assert GPUOptions(split=0.25).split == 0.25 and GPUOptions(split=np.float32(0.5)).split == 0.5
    assert GPUOptions(hybrid=np.bool_(False)).hybrid is False
    assert RemoteOptions(cache_limit=np.int64(10)).cache_limit == 10
    assert RemoteOptions(storage_options={}) == RemoteOptions()  # empty options: none


def test_first_defaults_to_the_engines_and_names_one_side():
    """split="auto" decodes on the engines first unless first="cpu" is asked for; any other
    value is a ConfigError naming the option."""
    assert GPUOptions().first == "engines"
    assert GPUOptions(first="cpu").first == "cpu"
    for bad in ("auto", "gpu", "", None, 1):
        with pytest.raises(ConfigError, match="first must be one of engines, cpu"):
            GPUOptions(first=bad)


DALI_MEAN, DALI_STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)  # ImageNet's in 0-255 units

REFUSED_NORMALISATIONS = [
    # 0-255 units: near-constant batches; the message names the values divided by 255
    ({"mean": DALI_MEAN, "std": DALI_STD},
     r"mean=\(123.675, 116.28, 103.53\) is outside 0..1: .*divide them by 255, mean=\(0.485, 0.456, 0.406\), "
     r"std=\(0.229, 0.224, 0.225\)"),
    ({"mean": DALI_MEAN}, r"outside 0..1: .*divide them by 255, mean=\(0.485, 0.456, 0.406\)$"),
    ({"std": DALI_STD}, r"std=\(58.395, 57.12, 57.375\) is above 1: .*nearly constant.*divide them by 255, "
                        r"std=\(0.229, 0.224, 0.225\)$"),
    ({"mean": (0, 0, 0), "std": (255, 255, 255)}, r"above 1: .*divide them by 255, std=\(1, 1, 1\)$"),
    ({"std": (2, 1, 1)}, r"std=\(2.0, 1.0, 1.0\) is above 1"),
    # out of any range: no 0-255 advice
    ({"mean": (1e300,) * 3}, r"outside 0..1: mean and std are in 0-1 units[^;]*$"),
    ({"mean": (-0.1, 0.5, 0.5)}, r"outside 0..1[^;]*$"),
    ({"mean": (0.5, 0.5, 1.01)}, r"outside 0..1[^;]*$"),  # one value past 1: not 0-255 units
    ({"mean": (100, 100, 300)}, r"outside 0..1[^;]*$"),
    ({"mean": DALI_MEAN, "std": (0.5, 0.5, 2)}, r"outside 0..1[^;]*$"),  # the std past 1 is not 0-255 units
    # so small a std that the values pass ±1000, or the dtype's largest finite value (inf in the batch)
    ({"std": (1e-50,) * 3}, r"too small: .* would reach 5.94e\+49, beyond float32's largest finite value"),
    ({"std": (5e-324,) * 3}, r"would reach inf, beyond float32's"),
    ({"std": (1e-6,) * 3, "dtype": "float16"}, r"would reach 5.94e\+05, beyond float16's largest finite value 65504"),
    ({"std": (1e-6,) * 3, "dtype": "bfloat16"}, r"would reach 5.94e\+05; the values may reach ±1000 at most"),
    ({"mean": (0, 0, 0), "std": (1 / 255, 1 / 255, 0.0009)}, r"would reach 1.11e\+03;"),
    # not finite, not positive (as before)
    ({"std": (0.2, 0.2, float("inf"))}, "std needs 3 finite numbers > 0"),
    ({"std": (0.2, 0.2, -0.2)}, "std needs 3 finite numbers > 0"),
    ({"mean": (0.5, float("-inf"), 0.5)}, "mean needs 3 finite numbers"),
]


@pytest.mark.parametrize("kw,match", REFUSED_NORMALISATIONS, ids=range(len(REFUSED_NORMALISATIONS)))
def test_a_normalisation_that_is_no_normalisation_is_refused_saying_why(kw, match):
    """mean / std in 0-255 units (DALI's) would give near-constant batches, a tiny std inf or
    huge values: each a ConfigError saying why — and, for 0-255 units, the values to pass."""
    with pytest.raises(ConfigError, match=match):
        Output(**kw)


ACCEPTED_NORMALISATIONS = [
    (IMAGENET_MEAN, IMAGENET_STD, -2.12, 2.64),
    ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711), -1.80, 2.15),  # CLIP's
    ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), -1.0, 1.0),
    ((0, 0, 0), (1, 1, 1), 0.0, 1.0),  # pixels in 0..1
    ((0, 0, 0), (1 / 255,) * 3, 0.0, 255.0),  # the pixels as they are
    ((1, 1, 1), (1 / 255,) * 3, -255.0, 0.0),
    ((0, 0, 0), (0.001,) * 3, 0.0, 1000.0),  # the largest reach taken
]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("mean,std,lo,hi", ACCEPTED_NORMALISATIONS, ids=range(len(ACCEPTED_NORMALISATIONS)))
def test_every_normalisation_in_use_is_taken_and_gives_finite_batches(mean, std, lo, hi, dtype):
    """The normalisations in use are taken in every dtype, and the values the pipeline computes
    from them ((x / 255 - mean) / std, x in 0..255: the decode stage's scale and bias) stay finite
    and within ±MAX_NORMALISED."""
    from recordtool.decode.cpu import normalize
    from recordtool.decode.spec import MAX_NORMALISED, bfloat16_values

    out = Output(16, mean=mean, std=std, dtype=dtype)
    assert out.mean == tuple(map(float, mean)) and out.std == tuple(map(float, std))
    pixels = np.broadcast_to(np.array([0, 255], np.uint8)[:, None, None, None], (2, 1, 1, 3))
    x = normalize(np.ascontiguousarray(pixels), out.mean, out.std, "NHWC", dtype)
    v = bfloat16_values(x) if dtype == "bfloat16" else x.astype(np.float64)
    assert np.isfinite(v).all() and np.abs(v).max() <= MAX_NORMALISED * 1.01
    assert v.min() == pytest.approx(lo, rel=0.01, abs=0.01) and v.max() == pytest.approx(hi, rel=0.01, abs=0.01)
    Output(16, mean=mean, std=std, dtype="uint8")  # checked alike where unused


@pytest.mark.parametrize("part", [Output(16, dtype="bfloat16"), TrainCrop(hflip=0.0), EvalCrop(0.9),
                                  GPUOptions(split="gpu"), RemoteOptions(cache_dir="/c", cache_limit=5,
                                                                         storage_options={"anon": True})])
def test_parts_are_frozen_and_hashable(part):
    field = dataclasses.fields(part)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(part, field, getattr(part, field))
    again = dataclasses.replace(part)  # made anew from its own fields: equal, same hash
    assert again == part and hash(again) == hash(part) and len({part, again}) == 1


def test_remote_options_keep_a_read_only_copy_of_the_storage_options():
    given = {"endpoint_url": "http://127.0.0.1:9000"}
    r = RemoteOptions(storage_options=given)
    given["endpoint_url"] = "http://elsewhere"
    assert r.storage_options["endpoint_url"] == "http://127.0.0.1:9000"
    with pytest.raises(TypeError):
        r.storage_options["key"] = "x"


def test_the_parts_are_exported_lazily():
    import subprocess
    import sys

    code = ("import sys, recordtool; assert 'recordtool.loader' not in sys.modules; "
            "from recordtool import Output, TrainCrop, EvalCrop, GPUOptions, RemoteOptions; "
            "from recordtool.loader.config import Output as O; assert Output is O")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert set(recordtool.__all__) >= {"Output", "TrainCrop", "EvalCrop", "GPUOptions", "RemoteOptions"}


# ---------------------------------------------------------------- the Loader with parts or keywords

def test_a_set_for_a_crop_range_is_a_config_error_at_the_loader(packed):
    with pytest.raises(ConfigError, match="scale must be a pair"):
        Loader(packed, 4, scale={0.08, 1.0}, as_torch=False)


def test_the_loaders_normalisation_keywords_are_checked_by_output(packed):
    with pytest.raises(ConfigError, match=r"divide them by 255, mean=\(0.485, 0.456, 0.406\), std=\(0.229"):
        Loader(packed, 4, mean=DALI_MEAN, std=DALI_STD, as_torch=False)
    with pytest.raises(ConfigError, match="beyond float16's largest finite value 65504"):
        Loader(packed, 4, std=(1e-6,) * 3, dtype="float16", as_torch=False)


def test_a_part_and_its_keywords_make_the_same_batches(packed):
    base = dict(batch_size=5, seed=3, as_torch=False, drop_last=False)
    flat = Loader(packed, size=(16, 24), dtype="float16", memory_format="channels_last", scale=(0.3, 0.9),
                  ratio=(0.5, 2.0), hflip=0.25, **base)
    parts = Loader(packed, output=Output((16, 24), dtype="float16", memory_format="channels_last"),
                   augment=TrainCrop(scale=(0.3, 0.9), ratio=(0.5, 2.0), hflip=0.25), **base)
    assert flat.output == parts.output and flat.augment == parts.augment and flat.train and parts.train
    a, b = batches(flat), batches(parts)
    assert len(a) == len(b) == 5 and a[0][0].shape == (5, 3, 16, 24) and a[0][0].dtype == np.float16
    assert all(np.array_equal(x, y) and np.array_equal(u, v) for (x, u), (y, v) in zip(a, b))
    # and differently configured, different batches: the comparison above can fail
    other = batches(Loader(packed, output=Output((16, 24), dtype="float16", memory_format="channels_last"),
                           augment=TrainCrop(scale=(0.3, 0.9), ratio=(0.5, 2.0), hflip=0.75), **base))
    assert not all(np.array_equal(x, y) for (x, _), (y, _) in zip(a, other))


def test_eval_crop_implies_evaluation_and_equals_the_keywords(packed):
    base = dict(batch_size=6, size=20, as_torch=False)
    ev = Loader(packed, augment=EvalCrop(crop_pct=0.9), **base)
    assert ev.train is False and ev.shuffle is False and ev.drop_last is False and ev.augment.crop_pct == 0.9
    flat = Loader(packed, train=False, crop_pct=0.9, **base)
    assert flat.augment == ev.augment
    a, b = batches(ev), batches(flat)
    assert all(np.array_equal(x, y) for (x, _), (y, _) in zip(a, b))
    tr = Loader(packed, augment=TrainCrop(), **base)
    assert tr.train is True and tr.augment == TrainCrop() and tr.augment.scale == (0.08, 1.0)


MIRRORS = ("size", "mean", "std", "dtype", "layout", "memory_format", "scale", "ratio", "hflip", "crop_pct", "split",
           "hybrid", "chroma", "run_ahead", "same_pixels", "spec")


def test_the_loader_keeps_the_parts_whole_and_mirrors_none_of_their_fields(packed):
    """A part's fields are read on the part (`loader.output.size`, `loader.augment.scale`,
    `loader.gpu.split`): one name per value, none turned back into a flat attribute."""
    ld = Loader(packed, 4, output=Output((12, 20), mean=(0, 0, 0), std=(1, 1, 1), layout="NHWC"), as_torch=False)
    assert ld.output.size == (12, 20) and ld.output.layout == "NHWC" and ld.output.mean == (0, 0, 0)
    assert ld.backend.recipe.output is ld.output and ld.backend.recipe.augment is ld.augment
    assert ld.device == "cpu" and not ld.dev.cuda and ld.gpu is None and ld.remote is None
    assert Loader(packed, 4, size=16, as_torch=False).output.size == (16, 16)
    assert [name for name in MIRRORS if hasattr(ld, name)] == []
    import recordtool.decode.spec as spec

    assert not hasattr(spec, "OutputSpec")  # one name for the output: Output


@pytest.mark.parametrize("kw,match", [
    ({"output": Output(16), "size": 16}, "size and output= both given"),
    ({"output": Output(16), "dtype": "float16", "layout": "NHWC"}, "dtype, layout and output= both given"),
    ({"augment": TrainCrop(), "scale": (0.2, 1.0)}, "scale and augment= both given"),
    ({"augment": EvalCrop(), "crop_pct": 0.875}, "crop_pct and augment= both given"),
    ({"augment": TrainCrop(), "crop_pct": 0.9}, "crop_pct and augment= both given"),
    ({"remote": RemoteOptions(), "cache_dir": "/c"}, "cache_dir and remote= both given"),
])
def test_a_part_and_one_of_its_keywords_is_a_config_error(packed, kw, match):
    with pytest.raises(ConfigError, match=match):
        Loader(packed, 4, **kw)


def test_a_gpu_part_and_its_keyword_is_a_config_error_too(packed):
    with pytest.raises(ConfigError, match="split and gpu= both given"):
        Loader(packed, 4, device="cuda", gpu=GPUOptions(), split="gpu")  # before any GPU is looked for


@pytest.mark.parametrize("bad,near", [("sise", "size"), ("scales", "scale"), ("batchsize", "batch_size"),
                                      ("memory_fromat", "memory_format"), ("shufle", "shuffle"),
                                      ("storage_option", "storage_options")])
def test_an_unknown_keyword_names_the_nearest_one(packed, bad, near):
    with pytest.raises(ConfigError, match=f"unknown keyword '{bad}'; did you mean '{near}'"):
        Loader(packed, 4, **{bad: 1})


def test_an_unknown_keyword_like_nothing_is_named_alone(packed):
    with pytest.raises(ConfigError, match=r"unknown keyword 'zzz'$"):
        Loader(packed, 4, zzz=1)


def test_gpu_options_on_a_cpu_loader_are_refused(packed):
    with pytest.raises(ConfigError, match="GPU options given for device='cpu'"):
        Loader(packed, 4, gpu=GPUOptions())
    with pytest.raises(ConfigError, match="GPU options given for device='cpu': split, hybrid do nothing"):
        Loader(packed, 4, split="gpu", hybrid=False)
    with pytest.raises(ConfigError, match="chroma"):  # checked by the part, before the dataset opens
        Loader("/nonexistent", 4, chroma="bilinear")
    # at their defaults they do nothing and say nothing wrong: code written for either device runs
    ld = Loader(packed, 4, split="auto", hybrid=True, chroma="interpolate", same_pixels=False, run_ahead=1,
                as_torch=False)
    assert ld.gpu is None
    ld.close()


def test_remote_options_for_a_local_or_open_dataset_are_refused(packed, tmp_path):
    with pytest.raises(ConfigError, match="remote options .* local path"):
        Loader(packed, 4, remote=RemoteOptions())
    with pytest.raises(ConfigError, match=r"remote options \(cache_dir\) given for .* a local path"):
        Loader(packed, 4, cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="local path") as e:
        Loader(packed, 4, storage_options={"endpoint_url": "http://secret-host:1"})
    assert "endpoint_url" in str(e.value) and "secret-host" not in str(e.value)
    ds = recordtool.open(packed)
    for kw in ({"remote": RemoteOptions(cache_limit=10)}, {"cache_limit": 10}):
        with pytest.raises(ConfigError, match=r"remote options \(cache_limit\) are for opening a dataset URL"):
            Loader(ds, 4, **kw)
    # keywords at their defaults ask for nothing
    Loader(packed, 4, cache_dir=None, storage_options={}, as_torch=False).close()
    Loader(ds, 4, storage_options={}, as_torch=False).close()


def test_train_contradicting_the_augment_is_refused(packed):
    with pytest.raises(ConfigError, match="train=True contradicts augment=EvalCrop"):
        Loader(packed, 4, train=True, augment=EvalCrop())
    with pytest.raises(ConfigError, match="train=False contradicts augment=TrainCrop"):
        Loader(packed, 4, train=False, augment=TrainCrop())
    with pytest.raises(ConfigError, match="train must be True or False"):
        Loader(packed, 4, train=1, augment=TrainCrop())


@pytest.mark.parametrize("kw,match", [
    ({"scale": (0.5, 1.0), "train": False}, "scale: set for training's"),
    ({"hflip": 0.0, "ratio": (1, 1), "train": False}, "ratio, hflip: set for training's"),
    ({"crop_pct": 0.95}, "crop_pct: set for evaluation's"),
    ({"crop_pct": 0.95, "train": True}, "crop_pct: set for evaluation's")])
def test_keywords_of_the_other_mode_set_away_from_their_defaults_are_refused(packed, kw, match):
    with pytest.raises(ConfigError, match=match):
        Loader(packed, 4, **kw)


def test_keywords_of_the_other_mode_at_their_defaults_are_dropped(packed):
    ev = Loader(packed, 4, train=False, scale=(0.08, 1.0), hflip=0.5, as_torch=False)
    tr = Loader(packed, 4, crop_pct=0.875, as_torch=False)
    assert ev.augment == EvalCrop() and tr.augment == TrainCrop()
    ev.close(), tr.close()


@pytest.mark.parametrize("kw,match", [
    ({"output": 224}, "output must be a recordtool.Output"), ({"augment": "train"}, "augment must be"),
    ({"gpu": {"split": "gpu"}}, "gpu must be a recordtool.GPUOptions"),
    ({"remote": {"cache_dir": "/c"}}, "remote must be a recordtool.RemoteOptions"),
    ({"output": Output(dtype="uint8")}, "dtype must be float32, float16 or bfloat16"),
    ({"with_ids": 1}, "with_ids"), ({"as_torch": "no"}, "as_torch"), ({"hybrid": "no"}, "hybrid"),
    ({"same_pixels": None}, "same_pixels"), ({"batch_size": 2.5}, "batch_size"), ({"seed": -1}, "seed")])
def test_wrong_kinds_are_config_errors_naming_the_argument(packed, kw, match):
    with pytest.raises(ConfigError, match=match):
        Loader(packed, **dict({"batch_size": 4}, **kw))


def test_the_parts_walk_down_unchanged(packed):
    """One value each: the batcher and its recipe hold the Loader's own parts, not copies."""
    out, aug = Output(16, dtype="bfloat16"), TrainCrop(hflip=0.0)
    ld = Loader(packed, 4, output=out, augment=aug, as_torch=False)
    assert ld.output is out and ld.augment is aug
    assert ld.backend.recipe.output is out and ld.backend.recipe.augment is aug and ld.backend.recipe.train
    assert not hasattr(ld.backend, "spec")  # the CPU backend reads the recipe's
    ld.close()


def test_remote_options_and_their_keywords_open_a_url_alike(packed, tmp_path):
    """memory:// goes through the shard cache as s3:// does: the part and its keywords reach it
    alike, and give the local dataset's batches."""
    fsspec = pytest.importorskip("fsspec")
    mem = fsspec.filesystem("memory")
    mem.put(packed, "/rt-config/train", recursive=True)
    try:
        base = dict(batch_size=6, size=16, seed=1, as_torch=False, block_shards=1)
        opts = RemoteOptions(cache_dir=str(tmp_path / "a"), cache_limit=1 << 30)
        by_part = Loader("memory://rt-config/train", remote=opts, **base)
        by_keywords = Loader("memory://rt-config/train", cache_dir=str(tmp_path / "b"), cache_limit=1 << 30, **base)
        assert by_part.remote == opts and by_part.ds.cache_limit == by_keywords.ds.cache_limit == 1 << 30
        assert by_part.ds.cache.dir.startswith(str(tmp_path / "a"))
        local = Loader(recordtool.open(packed), **base)
        a, b, c = batches(by_part), batches(by_keywords), batches(local)
        assert len(a) == len(c) == 4
        assert all(np.array_equal(x, y) and np.array_equal(x, z) for (x, _), (y, _), (z, _) in zip(a, b, c))
        by_part.ds.close(), by_keywords.ds.close()
    finally:
        mem.rm("/rt-config", recursive=True)

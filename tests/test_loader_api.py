"""The Loader's user-facing API: evaluation order, device spellings, output types and memory
formats (Output), the ring's size, resume-state checks and the first errors users meet."""
import sys
import types

import numpy as np
import pytest

import recordtool
from conftest import jpeg_bytes, write
from recordtool.decode.spec import Output, bfloat16_bits, bfloat16_values
from recordtool.errors import BadState, ConfigError, DatasetNotFound, DeviceUnavailable, RecordtoolError
from recordtool.loader import Loader
from recordtool.decode.device import Device, parse_device
from recordtool.pack import pack

N = 30  # not a multiple of the batch sizes below: a partial last batch


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader_api")
    for i in range(N):
        write(str(root / "src" / f"c{i % 3}" / f"{i}.jpg"), jpeg_bytes(56 + 8 * (i % 3), 48, seed=i))
    pack(str(root / "src"), str(root / "out"), shards=2, progress=False)
    return str(root / "out")


def ids_of(loader):
    return [np.asarray(ids).tolist() for _, _, ids in loader]


def test_evaluation_sees_every_sample_once_in_a_fixed_order(packed):
    ev = Loader(packed, batch_size=8, size=16, train=False, with_ids=True, as_torch=False)
    assert (ev.shuffle, ev.drop_last) == (False, False)
    first = ids_of(ev)
    assert sum(first, []) == list(range(N)) and len(first) == len(ev) == 4  # 8+8+8+6: nothing dropped
    assert ids_of(ev) == first  # the next epoch: the same order
    tr = Loader(packed, batch_size=8, size=16, with_ids=True, as_torch=False)
    assert (tr.shuffle, tr.drop_last) == (True, True) and len(tr) == 3
    a, b = ids_of(tr), ids_of(tr)
    assert a != b and all(len(x) == 8 for x in a)  # shuffled per epoch, the partial batch dropped


def test_shuffle_and_drop_last_are_explicit(packed):
    ld = Loader(packed, batch_size=8, size=16, train=False, shuffle=True, drop_last=True, with_ids=True,
                as_torch=False)
    got = sum(ids_of(ld), [])
    assert len(got) == 24 and got != sorted(got)
    ld = Loader(packed, batch_size=8, size=16, train=True, shuffle=False, drop_last=False, with_ids=True,
                as_torch=False)
    assert sum(ids_of(ld), []) == list(range(N))
    with pytest.raises(ConfigError, match="shuffle"):
        Loader(packed, batch_size=8, shuffle="no")


@pytest.mark.parametrize("given,want", [("cpu", Device("cpu")), ("cuda", Device("cuda")), ("cuda:1", Device("cuda", 1)),
                                        (" CUDA:0 ", Device("cuda", 0)), (2, Device("cuda", 2)),
                                        (np.int64(3), Device("cuda", 3))])
def test_device_spellings(given, want):
    assert parse_device(given) == want


def test_device_spellings_of_torch_and_refusals():
    torch = pytest.importorskip("torch")
    assert parse_device(torch.device("cuda", 1)) == Device("cuda", 1)
    assert parse_device(torch.device("cuda")) == Device("cuda")
    assert parse_device(torch.device("cpu")) == Device("cpu")
    for bad in ("gpu", "cuda:x", "cuda:-1", -1, True, torch.device("meta"), None):
        with pytest.raises(ConfigError, match="device"):
            parse_device(bad)


def test_loader_takes_a_torch_device(packed):
    torch = pytest.importorskip("torch")
    ld = Loader(packed, batch_size=4, size=16, device=torch.device("cpu"))
    x, _ = next(iter(ld))
    assert ld.device == "cpu" and x.device == torch.device("cpu")
    ld.close()


def test_cuda_without_cupy_says_what_to_install(packed, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # as on a machine without CuPy
    with pytest.raises(DeviceUnavailable, match=r"CuPy .*pip install 'recordtool\[cu13\]'"):
        Loader(packed, batch_size=4, device="cuda:0")


def test_cuda_without_a_visible_gpu_says_so(packed, monkeypatch):
    class CUDARuntimeError(RuntimeError):
        pass

    def no_driver():
        raise CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")

    fake = types.ModuleType("cupy")  # CuPy installed, no usable GPU: what its runtime answers
    fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=no_driver))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    with pytest.raises(DeviceUnavailable, match="no GPU is visible.*InsufficientDriver"):
        Loader(packed, batch_size=4, device="cuda")
    fake.cuda.runtime.getDeviceCount = lambda: 1
    with pytest.raises(DeviceUnavailable, match="sees 1 GPU"):
        Loader(packed, batch_size=4, device="cuda:3")


def test_missing_path_and_a_file_are_named(tmp_path):
    with pytest.raises(DatasetNotFound, match="does not exist"):
        Loader(str(tmp_path / "nope"), batch_size=4)
    f = tmp_path / "afile.jpg"
    f.write_bytes(jpeg_bytes())
    with pytest.raises(DatasetNotFound, match="is a file, not a dataset directory"):
        Loader(str(f), batch_size=4)
    assert issubclass(DatasetNotFound, RecordtoolError) and issubclass(DatasetNotFound, FileNotFoundError)
    assert issubclass(DatasetNotFound, recordtool.errors.FormatError)


def test_batch_larger_than_the_share(packed):
    with pytest.raises(ConfigError, match="batch_size 64 is more than the 30 records.*drop_last=False"):
        Loader(packed, batch_size=64, size=16)
    with pytest.raises(ConfigError, match="15 records of this rank"):
        Loader(packed, batch_size=16, size=16, rank=1, world_size=2)
    ev = Loader(packed, batch_size=4000, size=16, train=False, as_torch=False)
    batches = [x for x, _ in ev]
    assert len(batches) == 1 and batches[0].shape == (N, 3, 16, 16)
    assert ev.ring.shape[0] == N  # the ring holds the largest batch this rank makes, not batch_size


def test_ring_past_the_memory_bound_is_refused(packed):
    with pytest.raises(ConfigError, match=r"output ring would take .* GiB.*lower batch_size"):
        Loader(packed, batch_size=N, size=16384, train=False)


@pytest.mark.parametrize("change,match", [({"batch": -1}, "batch=-1"), ({"batch": "3"}, "batch='3'"),
                                          ({"epoch": -5}, "epoch=-5"), ({"batch": 4}, "outside .* 3 batches"),
                                          ({"epoch": 1.5}, "epoch=1.5"), ({"rank": 1}, "rank=1 does not match"),
                                          ({"batch_size": 4}, "batch_size=4 does not match"),
                                          ({"seed": True}, "seed=True")])
def test_load_state_dict_checks_every_field(packed, change, match):
    ld = Loader(packed, batch_size=8, size=16, as_torch=False)
    state = dict(ld.state_dict(), **change)
    with pytest.raises(BadState, match=match):
        ld.load_state_dict(state)
    assert ld.state_dict()["epoch"] == 0 and ld.state_dict()["batch"] == 0  # nothing taken from a bad state


def test_load_state_dict_names_a_missing_key(packed):
    ld = Loader(packed, batch_size=8, size=16, as_torch=False)
    state = ld.state_dict()
    del state["rank"]
    with pytest.raises(BadState, match="lacks 'rank'"):
        ld.load_state_dict(state)
    ld.load_state_dict(dict(ld.state_dict(), batch=3, epoch=2))  # the end of epoch 2 is a valid place
    assert list(ld) == [] and ld.epoch == 3


def test_output_spec_is_validated_once_and_frozen():
    s = Output(32, dtype=np.float16)
    assert s.size == (32, 32) and s.dtype == "float16" and hash(s) == hash(Output((32, 32), dtype="float16"))
    with pytest.raises(Exception):
        s.dtype = "float32"
    for kw, match in [({"size": 0}, "size"), ({"size": 2.5}, "size"), ({"size": True}, "size"),
                      ({"dtype": "int8"}, "dtype"), ({"layout": "CHW"}, "layout"), ({"std": (1, 0, 1)}, "std"),
                      ({"mean": (0, 0)}, "mean"), ({"memory_format": "channels_last", "layout": "NHWC"}, "NCHW"),
                      ({"memory_format": "preserve"}, "memory_format")]:
        with pytest.raises(ConfigError, match=match):
            Output(**kw)
    cl = Output(8, dtype="bfloat16", memory_format="channels_last")
    assert cl.buffer_layout == "NHWC" and cl.buffer_shape(2) == (2, 8, 8, 3) and cl.shape(2) == (2, 3, 8, 8)
    assert cl.storage_dtype == np.uint16 and cl.nbytes(2) == 2 * 8 * 8 * 3 * 2


def test_loader_arguments_raise_config_errors(packed):
    for kw in ({"batch_size": 0}, {"batch_size": "8"}, {"size": 0}, {"size": (16, 0)}, {"size": (16, 24, 3)},
               {"dtype": "float64"}, {"layout": "CHW"},
               {"prefetch": 0}, {"threads": 0}, {"rank": 2, "world_size": 2}, {"seed": -1}):
        with pytest.raises(ConfigError):
            Loader(packed, **dict({"batch_size": 4}, **kw))


def test_bfloat16_bits_round_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, 3.0e38, 1e-40, 0.0], np.float32)
    bits = bfloat16_bits(x)
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even one (1); 1 + 3·2^-8 up to 1 + 2^-6
    assert bfloat16_values(bits)[:4].tolist() == [1.0, 1.0, 1.015625, -2.5]
    torch = pytest.importorskip("torch")
    assert np.array_equal(torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16), bits)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_native_bfloat16_equals_the_reference(layout):
    from recordtool.decode import cpu
    from recordtool.decode.cpu import normalize

    bufs = [jpeg_bytes(64, 48, seed=k) for k in range(5)]
    win = np.array([[0, 0, 48, 64], [4, 3, 30, 40], [0, 8, 48, 48], [10, 0, 20, 64], [1, 1, 40, 50]], np.float64)
    flips = np.array([0, 1, 0, 1, 1], bool)
    f32 = cpu.decode_crop_resize_normalize(bufs, win, flips, (24, 24), layout=layout, dtype="float32")
    bf = cpu.decode_crop_resize_normalize(bufs, win, flips, (24, 24), layout=layout, dtype="bfloat16")
    assert bf.dtype == np.uint16 and np.array_equal(bf, bfloat16_bits(f32))
    raw = cpu.decode_crop_resize(bufs, win, (24, 24))
    assert np.array_equal(normalize(raw, layout=layout, dtype="bfloat16", flips=flips), bf)  # the user-op path


def test_loader_bfloat16_and_channels_last(packed):
    kw = dict(batch_size=8, size=24, seed=3, train=False, as_torch=False)
    ref = [x for x, _ in Loader(packed, **kw)]  # float32 NCHW contiguous
    bits = [x for x, _ in Loader(packed, dtype="bfloat16", **kw)]
    assert all(b.dtype == np.uint16 and np.array_equal(b, bfloat16_bits(r)) for b, r in zip(bits, ref))
    cl = [x for x, _ in Loader(packed, memory_format="channels_last", **kw)]
    for c, r in zip(cl, ref):
        assert c.shape == r.shape and np.array_equal(c, r)
        assert c.transpose(0, 2, 3, 1).flags.c_contiguous  # NHWC memory: the NCHW shape is a view
    nhwc = [x for x, _ in Loader(packed, layout="NHWC", **kw)]
    assert all(np.array_equal(a, r.transpose(0, 2, 3, 1)) for a, r in zip(nhwc, ref))


def test_torch_bfloat16_channels_last_without_a_copy(packed):
    torch = pytest.importorskip("torch")
    kw = dict(batch_size=8, size=24, seed=3, train=False)
    ref = [x for x, _ in Loader(packed, **kw)]
    ld = Loader(packed, dtype=torch.bfloat16, memory_format=torch.channels_last, **kw)
    for (x, _), r in zip(ld, ref):
        assert x.dtype == torch.bfloat16 and tuple(x.shape) == tuple(r.shape)
        assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        assert torch.equal(x, r.to(torch.bfloat16))  # the same rounding as torch's
        conv = torch.nn.Conv2d(3, 4, 3).to(torch.bfloat16, memory_format=torch.channels_last)
        assert conv(x).shape == (len(x), 4, 22, 22)
    x, _ = next(iter(ld))
    assert x.data_ptr() in {m.ctypes.data for m in ld.ring._mem}  # the ring's memory itself: no copy
    ld.close()


def test_record_info_gives_filename_class_and_features(tmp_path):
    src = tmp_path / "src"
    names = {"cat": ["a.jpg", "b.JPEG"], "dog": ["sub/c.jpg"]}
    for cls, files in names.items():
        for f in files:
            write(str(src / cls / f), jpeg_bytes(40, 30, seed=len(f)))
    pack(str(src), str(tmp_path / "out"), progress=False)
    ds = recordtool.open(str(tmp_path / "out"))
    infos = [ds.info(i) for i in range(len(ds))]
    assert sorted(r.filename for r in infos) == ["cat/a.jpg", "cat/b.JPEG", "dog/sub/c.jpg"]
    for r in infos:
        assert r.class_name == r.filename.split("/")[0] and r.label == ds.classes.index(r.class_name)
        assert (r.width, r.height) == (40, 30) and r.shard == ds.shards[0]["name"]
        assert r.features["encoded"][0] == bytes(ds[r.id][0]) and r.features["class/label"] == [r.label]
    assert ds.info(-1) == infos[-1]
    with pytest.raises(IndexError):
        ds.info(3)


@pytest.mark.parametrize("kw,match", [
    ({"scale": (0.0, 1.0)}, "scale"), ({"scale": (0.5, 0.2)}, "scale"), ({"scale": (0.1, 1.5)}, "scale"),
    ({"scale": "ab"}, "scale"), ({"scale": (0.1,)}, "scale"), ({"scale": (0.1, float("nan"))}, "scale"),
    ({"scale": 0.5}, "scale"), ({"ratio": (0, 1)}, "ratio"), ({"ratio": (2, 1)}, "ratio"),
    ({"ratio": (1, float("inf"))}, "ratio"), ({"ratio": (True, 2)}, "ratio"), ({"hflip": 1.5}, "hflip"),
    ({"hflip": -0.1}, "hflip"), ({"hflip": True}, "hflip"), ({"hflip": "0.5"}, "hflip"),
    ({"crop_pct": 0, "train": False}, "crop_pct"), ({"crop_pct": 1.2, "train": False}, "crop_pct"),
    ({"crop_pct": None, "train": False}, "crop_pct"), ({"size": (16, 0)}, r"size \(width\)"),
    ({"size": (16, 24, 3)}, "size"),
    # set away from their defaults where they would do nothing
    ({"scale": (0.5, 1.0), "train": False}, "scale"), ({"hflip": 0.0, "ratio": (1, 1), "train": False}, "ratio, hflip"),
    ({"crop_pct": 0.95}, "crop_pct")])
def test_crop_options_are_checked_at_the_edge_naming_the_option(packed, kw, match):
    with pytest.raises(ConfigError, match=match):
        Loader(packed, **dict({"batch_size": 4, "size": 16}, **kw))


def test_crop_options_are_frozen_and_the_defaults_are_torchvisions(packed):
    from dataclasses import FrozenInstanceError

    from recordtool import EvalCrop, TrainCrop

    ld = Loader(packed, batch_size=4, size=16, as_torch=False)
    assert ld.augment == TrainCrop() and ld.backend.recipe.augment is ld.augment
    assert (ld.augment.scale, ld.augment.ratio, ld.augment.hflip) == ((0.08, 1.0), (0.75, 4 / 3), 0.5)
    with pytest.raises(FrozenInstanceError):
        ld.augment.hflip = 1.0
    ev = Loader(packed, batch_size=4, size=16, train=False, crop_pct=0.9, as_torch=False)
    assert ev.augment.crop_pct == 0.9 and ev.backend.recipe.augment == EvalCrop(crop_pct=0.9)


@pytest.mark.parametrize("layout,memory_format", [("NCHW", "contiguous"), ("NHWC", "contiguous"),
                                                  ("NCHW", "channels_last")])
def test_non_square_sizes_in_every_layout(packed, layout, memory_format):
    """size=(h, w) — torchvision's RandomResizedCrop((h, w)) / CenterCrop((h, w)) — gives h × w
    batches in training and evaluation; an int, or (s, s), stays square."""
    for train, kw in ((True, dict(scale=(0.3, 0.9), ratio=(0.5, 2.0), hflip=0.3)), (False, dict(crop_pct=0.95))):
        ld = Loader(packed, batch_size=4, size=(12, 20), train=train, layout=layout, memory_format=memory_format,
                    as_torch=False, **kw)
        assert ld.output.size == (12, 20)
        x, _ = next(iter(ld))
        assert x.shape == ((4, 3, 12, 20) if layout == "NCHW" else (4, 12, 20, 3)) and np.isfinite(x).all()
        ld.close()
        seen = []
        with_op = Loader(packed, batch_size=4, size=(12, 20), train=train, layout=layout, memory_format=memory_format,
                         as_torch=False, user_op=lambda b: seen.append(b.shape) or b, **kw)
        y, _ = next(iter(with_op))  # the uint8 batch the op sees is h × w too, and so is what it gives back
        with_op.close()
        assert seen[0] == (4, 12, 20, 3) and np.array_equal(x, y)
    assert Loader(packed, batch_size=4, size=(16, 16), as_torch=False).output.size == (16, 16)


_THREADS_SCRIPT = r"""
import os, resource, sys, threading
from recordtool import _native
from recordtool.errors import ConfigError, ThreadStartError
from recordtool.loader import Loader


def threads():  # the native decode threads of every pool, and the Python threads
    return sum(len(_native.pool_thread_ids(p)) for p in range(128)), threading.active_count()


def cap(extra_mb):  # address space: what the process maps now + extra_mb
    vm = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmSize:")) // 1024
    lim = (vm + extra_mb) << 20
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))


kw = dict(batch_size=4, size=16, as_torch=False)
warm = Loader(sys.argv[1], threads=1, **kw)
next(iter(warm))
warm.close()
before = threads()
cap(40)  # room for a few 8 MiB thread stacks, not 64
try:
    Loader(sys.argv[1], threads=40000, **kw)
except ConfigError as e:
    print("bounded", "256" in str(e), threads() == before)
try:
    Loader(sys.argv[1], threads=64, **kw)
except ThreadStartError as e:
    print("refused", threads() == before, e)
ld = Loader(sys.argv[1], threads=2, **kw)
print("later loader decodes", bool(next(iter(ld))[0].any()))
"""


def test_threads_are_bounded_and_a_failed_thread_start_leaves_no_threads(packed):
    """threads past MAX_DECODE_THREADS is a ConfigError before any thread starts; a Loader whose
    decode threads the system stops starting (an address-space cap: no room for their stacks)
    raises ThreadStartError with the threads it started stopped — a later Loader still runs."""
    import subprocess

    p = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, packed], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert "bounded True True" in p.stdout, p.stdout
    assert "refused True cannot start native decode thread" in p.stdout, p.stdout
    assert "later loader decodes True" in p.stdout, p.stdout
    with pytest.raises(ConfigError, match=r"threads must be in 1\.\.256"):
        Loader(packed, batch_size=4, threads=257)
    with pytest.raises(ConfigError, match=r"producers must be in 1\.\.32"):
        Loader(packed, batch_size=4, producers=33)


def test_every_error_a_caller_may_catch_is_importable_from_recordtool():
    import inspect

    from recordtool import BadState, ConfigError, DatasetNotFound, DeviceUnavailable, NotADataset

    errors = recordtool.errors
    assert (BadState, ConfigError, DatasetNotFound, DeviceUnavailable, NotADataset) == (
        errors.BadState, errors.ConfigError, errors.DatasetNotFound, errors.DeviceUnavailable, errors.NotADataset)
    public = [name for name, cls in vars(recordtool.errors).items()
              if inspect.isclass(cls) and issubclass(cls, recordtool.errors.RecordtoolError)
              and not (cls.__doc__ or "").startswith("Internal")]
    assert len(public) >= 20
    for name in public:
        assert getattr(recordtool, name) is getattr(recordtool.errors, name) and name in recordtool.__all__, name
    assert set(recordtool.__all__) <= set(dir(recordtool)) | {"Loader", "Output", "TrainCrop", "EvalCrop",
                                                            "GPUOptions", "RemoteOptions", "pack"}

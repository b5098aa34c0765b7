"""What a newcomer from PyTorch tries first, and the one clear error each mistake gets: a
torchvision transform or a torch module as `user_op`, a user op that returns something else than
its batch, the Loader wrapped in torch's DataLoader, a source folder where a packed dataset is
expected, a bad `on_error` word, `storage_options` that cannot be right, an object store that is
not there, and `recordtool bench --train` without a GPU. Object storage is a real S3 server
(tests/s3server.py) on 127.0.0.1; the client is s3fs, unpatched."""
from __future__ import annotations

import itertools
import os
import pickle
import socket
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import recordtool
from conftest import jpeg_bytes, write
from recordtool.cli import main
from recordtool.errors import (ConfigError, FormatError, NoBucket, NotADataset, OpResultError, RecordtoolError,
                               RemoteError)
from recordtool.io import FsspecFS, Retry
from recordtool.loader import Loader
from recordtool.pack import pack

torch = pytest.importorskip("torch")

FAST = Retry(attempts=3, backoff=0.01, max_backoff=0.05)
KW = dict(batch_size=4, size=16, as_torch=False)
_buckets = itertools.count()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """An ImageNet-style folder: 3 class folders of 8 JPEGs."""
    root = tmp_path_factory.mktemp("newcomer") / "src"
    for i in range(24):
        write(str(root / f"c{i % 3}" / f"{i}.jpg"), jpeg_bytes(48 + 4 * (i % 5), 40, seed=i))
    return root


@pytest.fixture(scope="module")
def packed(source):
    out = source.parent / "out"
    pack(str(source), str(out), shards=3, progress=False)
    return str(out)


# ---------------------------------------------------------------- user ops from torch and torchvision
def _refused(packed, op) -> str:
    with pytest.raises(ConfigError) as e:
        Loader(packed, user_op=op, **KW)
    assert isinstance(e.value, RecordtoolError)
    return str(e.value)


def test_real_torchvision_transforms_are_refused_naming_what_to_pass(packed):
    """v2.ColorJitter hands a NumPy batch back untouched (training without the augmentation, no
    warning); v2.RandomErasing raises inside. Both are refused when the Loader is made."""
    try:
        from torchvision.transforms import v2
    except Exception as e:  # not installed, or a build for another torch (README: Adding torchvision)
        pytest.skip(f"torchvision does not import: {e}")
    msg = _refused(packed, v2.ColorJitter(brightness=0.4))
    assert "torchvision" in msg and "recordtool.ops.ColorJitter" in msg
    assert "recordtool.ops.Cutout" in _refused(packed, v2.RandomErasing())
    msg = _refused(packed, v2.Compose([v2.RandomGrayscale(), v2.Normalize([0.5] * 3, [0.2] * 3)]))
    assert "recordtool.ops.RandomGrayscale" in msg and "Loader does itself" in msg


def _torchvision_like(name: str, module: str = "torchvision.transforms.v2._color"):
    """A torch.nn.Module class defined as torchvision defines its v2 transforms (same name and
    module), doing what v2 does to a NumPy array: handing it back untouched."""
    return type(name, (torch.nn.Module,), {"__module__": module, "forward": lambda self, x: x})


def test_torchvision_shaped_transforms_are_refused(packed):
    """Without torchvision installed: transforms of its modules are told by their module."""
    jitter = _torchvision_like("ColorJitter")()
    msg = _refused(packed, jitter)
    assert "ColorJitter" in msg and "torchvision" in msg and "recordtool.ops.ColorJitter(" in msg
    assert "no-op" in msg and "output tensors" in msg  # why, and the other way: after the Loader
    erasing = _torchvision_like("RandomErasing", "torchvision.transforms.v2._augment")()
    assert "recordtool.ops.Cutout" in _refused(packed, erasing)
    crop = _torchvision_like("RandomResizedCrop", "torchvision.transforms.transforms")()
    assert "Loader does itself" in _refused(packed, crop)

    def hflip(img):  # a functional transform
        return img

    hflip.__module__ = "torchvision.transforms.functional"
    assert "torchvision" in _refused(packed, hflip)


def test_torch_modules_and_non_callables_are_refused(packed):
    msg = _refused(packed, torch.nn.Identity())  # takes tensors: the batch is a NumPy array
    assert "torch.nn.Module" in msg and "NumPy" in msg and "recordtool.ops" in msg
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1))
    _refused(packed, conv)
    assert "torch.nn.Module" in _refused(packed, conv.forward)
    assert "callable" in _refused(packed, "cutout")


@pytest.mark.parametrize("returns", ["none", "tensor", "float", "shape"])
def test_a_user_op_returning_something_else_than_its_batch_is_named(packed, returns):
    """Each batch checks what the op returned against the contract (the uint8 NHWC batch, or an
    array of its kind, dtype and shape): None, a tensor, a float array or another shape is an
    OpResultError naming the op — never normalised into a wrong batch or a later, unrelated error."""
    def make(batch):
        batch[:] = 7
        return {"none": None, "tensor": torch.from_numpy(batch), "float": batch.astype(np.float32),
                "shape": batch[:, :8]}[returns]

    ld = Loader(packed, user_op=make, **KW)
    with pytest.raises(OpResultError, match="make") as e:
        next(iter(ld))
    assert isinstance(e.value, TypeError) and "uint8" in str(e.value)
    ld.close()
    # a new uint8 array of the batch's shape is what the op made: it is normalised
    ld = Loader(packed, user_op=lambda b: np.full_like(b, 255), layout="NHWC", mean=(0, 0, 0), std=(1, 1, 1), **KW)
    x, _ = next(iter(ld))
    assert np.all(np.asarray(x) == 1.0)
    ld.close()


# ---------------------------------------------------------------- the Loader is the DataLoader
def _names_the_route(e) -> None:
    msg = str(e.value)
    assert isinstance(e.value, TypeError) and isinstance(e.value, RecordtoolError)
    assert "itself the data loader" in msg and "recordtool.open(path)" in msg and "collate_fn" in msg


@pytest.mark.parametrize("workers", ["none", "spawn", "fork"])
def test_loader_wrapped_in_a_torch_dataloader_says_what_to_do(packed, workers):
    ld = Loader(packed, **KW)
    kw = {} if workers == "none" else dict(num_workers=1, multiprocessing_context=workers, timeout=120)
    dl = torch.utils.data.DataLoader(ld, batch_size=2, **kw)
    with pytest.raises(NotADataset) as e:
        next(iter(dl))
    _names_the_route(e)
    with pytest.raises(NotADataset) as e:
        pickle.dumps(ld)
    _names_the_route(e)
    assert len(list(ld)) == len(ld)  # still the loader it was
    ld.close()


# ---------------------------------------------------------------- a source folder, a bad word
def test_a_source_folder_given_as_a_dataset_says_pack_it_first(source):
    for path in (source, source / "c1"):
        with pytest.raises(FormatError, match="recordtool pack") as e:
            recordtool.open(str(path))
        assert "source folder" in str(e.value)
        with pytest.raises(FormatError, match="recordtool pack"):
            Loader(str(path), batch_size=2)


def test_an_unknown_on_error_word_is_a_recordtool_error(packed):
    with pytest.raises(ConfigError, match="'raise', 'warn', 'skip'"):
        Loader(packed, on_error="ignore", **KW)
    with pytest.raises(RecordtoolError):
        recordtool.errors.on_error("ignore")


# ---------------------------------------------------------------- storage_options and the store
@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    import s3fs
    from s3server import S3

    server = S3()
    with pytest.MonkeyPatch.context() as mp_:
        mp_.setattr(s3fs.S3FileSystem, "retries", 1)  # s3fs's own retry knob: recordtool's are tested
        yield server
    server.stop()


@pytest.fixture
def remote(s3, packed):
    import s3fs

    fs = s3fs.S3FileSystem(**s3.options)
    bucket = f"nc-{next(_buckets)}"
    fs.mkdir(bucket)
    for name in sorted(os.listdir(packed)):
        fs.put_file(os.path.join(packed, name), f"{bucket}/data/{name}")
    s3.proxy.clear()
    return f"s3://{bucket}/data"


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_storage_options_mistakes_fail_at_once_naming_the_option(s3, remote, packed, tmp_path):
    """A misspelt option, options that are not a dict, options for a local path: ConfigError
    before any request (a configuration error is not retried), naming the option."""
    opts = {k: v for k, v in s3.options.items() if k != "endpoint_url"}
    for open_ in (lambda **kw: recordtool.open(remote, cache_dir=str(tmp_path), retry=FAST, **kw),
                  lambda **kw: Loader(remote, cache_dir=str(tmp_path), **KW, **kw)):
        with pytest.raises(ConfigError, match="'endpoint'.*did you mean 'endpoint_url'"):
            open_(storage_options=dict(opts, endpoint=s3.options["endpoint_url"]))
        with pytest.raises(ConfigError, match="storage_options must be a dict"):
            open_(storage_options="endpoint_url=" + s3.options["endpoint_url"])
    assert not s3.proxy.requests
    for open_ in (recordtool.open, lambda p, **kw: Loader(p, **KW, **kw)):
        with pytest.raises(ConfigError, match="local path") as e:
            open_(packed, storage_options=s3.options)
        assert "endpoint_url" in str(e.value) and "testing" not in str(e.value)  # names, never values
    with pytest.raises(ConfigError, match="storage_options"):
        Loader(recordtool.open(packed), storage_options=s3.options, **KW)


def test_an_option_the_client_refuses_when_it_connects_is_not_retried(s3, remote, tmp_path):
    """s3fs passes names it does not know on to its session, which refuses them at the first
    request: a ConfigError naming it, not RemoteError after every retry."""
    with pytest.raises(ConfigError, match="region_of_choice") as e:
        recordtool.open(remote, cache_dir=str(tmp_path), retry=FAST,
                        storage_options=dict(s3.options, region_of_choice="eu"))
    assert "storage_options" in str(e.value) and not isinstance(e.value, RemoteError)
    with pytest.raises(ConfigError, match="region_of_choice"):  # pack's bucket check: the same
        FsspecFS.from_url("s3://nc-any/x", **dict(s3.options, region_of_choice="eu"))[0].check_bucket("nc-any/x")


def test_a_closed_endpoint_is_named_before_any_retry(s3, remote, tmp_path):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    opts = dict(s3.options, endpoint_url=endpoint)
    with pytest.raises(RemoteError, match="cannot be reached") as e:
        recordtool.open(remote, cache_dir=str(tmp_path), retry=FAST, storage_options=opts)
    assert endpoint in str(e.value) and "connection refused" in str(e.value)
    with pytest.raises(RemoteError, match=f"{endpoint}: the object store's endpoint cannot be reached"):
        Loader(remote, cache_dir=str(tmp_path), storage_options=opts, **KW)


def test_a_missing_bucket_is_named_not_a_missing_manifest(s3, remote, tmp_path):
    with pytest.raises(NoBucket, match="s3://no-such-bucket-nc: no such bucket"):
        recordtool.open("s3://no-such-bucket-nc/data", cache_dir=str(tmp_path), retry=FAST,
                        storage_options=s3.options)
    with pytest.raises(FormatError, match="no manifest"):  # the bucket is there, the dataset is not
        recordtool.open(remote + "-not", cache_dir=str(tmp_path), retry=FAST, storage_options=s3.options)


@pytest.fixture
def s3_config(s3, monkeypatch):
    """The server reached through fsspec's configuration, as a user's CLI would."""
    import fsspec.config

    monkeypatch.setitem(fsspec.config.conf, "s3", dict(s3.options))


def test_pack_to_an_unreachable_endpoint_says_so_not_no_bucket(s3, s3_config, source, tmp_path, monkeypatch):
    import fsspec.config

    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setitem(fsspec.config.conf, "s3", dict(s3.options, endpoint_url=endpoint))
    r = CliRunner().invoke(main, ["pack", str(source), "s3://nc-out/sets/a", "-q"])
    assert r.exit_code == 1 and f"{endpoint}: the object store's endpoint cannot be reached" in r.output, r.output
    assert "no such bucket" not in r.output and "Traceback" not in r.output


def test_pack_when_the_bucket_probe_fails_says_so_not_no_bucket(s3, s3_config, source, tmp_path, monkeypatch):
    """A bucket check answered by 5xx every time is reported as a failed check, not as a bucket
    that does not exist (whose advice, "create it first", would be wrong)."""
    import s3fs
    from s3server import Fault

    from recordtool.format import upload

    monkeypatch.setattr(upload, "Retry", lambda: FAST)
    s3fs.S3FileSystem(**s3.options).mkdir("nc-there")
    s3.proxy.clear()
    s3.proxy.add(Fault("/nc-there", "503", times=100, method="HEAD"))
    r = CliRunner().invoke(main, ["pack", str(source), "s3://nc-there/sets/a", "-q"])
    s3.proxy.clear()
    assert r.exit_code == 1 and "could not find out whether the bucket exists" in r.output, r.output
    assert "ServiceUnavailable" in r.output or "503" in r.output or "Service Unavailable" in r.output
    assert "no such bucket" not in r.output


# ---------------------------------------------------------------- recordtool bench
def _one_error_line(r) -> str:
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert r.exit_code == 1 and lines[-1].startswith("Error: ") and "Traceback" not in r.output, r.output
    return lines[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: --device cuda trains")
def test_bench_train_on_cuda_without_a_gpu_is_one_line(packed):
    r = CliRunner().invoke(main, ["bench", packed, "--train", "resnet18", "--device", "cuda", "--steps", "1",
                                  "--repeats", "1", "-q"])
    line = _one_error_line(r)
    assert "--device cuda" in line and "no GPU" in line and "--device cpu" in line


def test_bench_consumer_ms_nan_is_refused(packed):
    r = CliRunner().invoke(main, ["bench", packed, "--train", "resnet18", "--device", "cpu", "--consumer-ms", "nan",
                                  "--steps", "1", "--repeats", "1", "--pipelines", "synthetic", "-q"])
    assert r.exit_code == 2 and "--consumer-ms" in r.output and "not a number" in r.output, r.output


def test_bench_train_fails_when_every_pipeline_failed(packed, tmp_path):
    args = ["bench", packed, "--train", "resnet18", "--device", "cpu", "--steps", "1", "--repeats", "1",
            "--consumer-ms", "0", "--batch-size", "4", "--json", str(tmp_path / "t.json"), "-q"]
    r = CliRunner().invoke(main, args + ["--pipelines", "recordtool:no_such_option=1;recordtool:size=0"])
    line = _one_error_line(r)
    assert "every pipeline failed" in line and "no_such_option" in line
    assert "failed:" in r.output and (tmp_path / "t.json").exists()  # the table and the numbers still written
    r = CliRunner().invoke(main, args + ["--pipelines", "synthetic;recordtool:no_such_option=1"])
    assert r.exit_code == 0, r.output  # one that ran is a measurement: the failure is in its table


def test_train_bench_module_exits_non_zero_when_every_pipeline_failed(packed):
    import subprocess

    p = subprocess.run([sys.executable, "-m", "recordtool.tools.train_bench", packed, "--device", "cpu", "--steps",
                        "1", "--repeats", "1", "--consumer-ms", "0", "--batch", "4", "--pipelines",
                        "recordtool:no_such_option=1"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "every pipeline failed" in p.stderr, (p.stdout, p.stderr)

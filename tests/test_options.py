"""Every numeric option is bounded: out of range is a usage error (exit 2) naming the option on
the command line, and an ConfigError (a RecordtoolError and a ValueError) in the Python API —
never a silent 1x1 transcode, a "loader failed" with exit 0, or a raw OverflowError."""
from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from conftest import jpeg_bytes, write
from recordtool.cli import main
from recordtool.errors import ConfigError, RecordtoolError


@pytest.fixture
def src(tmp_path):
    for c in range(2):
        for i in range(3):
            write(str(tmp_path / "src" / f"c{c}" / f"{i}.jpg"), jpeg_bytes(40, 32, seed=3 * c + i))
    return str(tmp_path / "src")


def _usage_error(args, option):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 2, (args, r.exit_code, r.output)
    assert option in r.output and "Invalid value" in r.output, r.output
    return r


PACK = [("--max-side", "-5"), ("--max-side", "0"), ("--shard-size", "1e400MB"), ("--shard-size", "-5MB"),
        ("--shard-size", "nanGB"), ("--shard-size", "0"), ("--shard-size", "12 apples"), ("--shards", "0"),
        ("--workers", "0"), ("--workers", "100000"), ("--max-pixels", "0"), ("--seed", "-1"),
        ("--max-classes", "0"), ("--max-classes", "2147483648"), ("--max-inflate", "nan"),
        ("--max-inflate", "inf"), ("--quality", "0"), ("--label-offset", str(2**40))]


@pytest.mark.parametrize("option,value", PACK)
def test_pack_options_are_bounded(src, tmp_path, option, value):
    out = tmp_path / "out"
    _usage_error(["pack", src, out, option, value, "-q"], option)
    assert not out.exists()


TUNE = [("--sides", "-64"), ("--sides", "0"), ("--sides", "256,abc"), ("--sides", ","), ("--qualities", "0"),
        ("--qualities", "101"), ("--images", "-5"), ("--batch-size", "0"), ("--epochs", "0"),
        ("--min-psnr", "nan"), ("--threads", "0"), ("--workers", "0"), ("--seed", "-1")]


@pytest.mark.parametrize("option,value", TUNE)
def test_tune_options_are_bounded(src, option, value):
    _usage_error(["tune", src, option, value, "-q"], option)


@pytest.mark.parametrize("option,value", [("--batch-size", "0"), ("--images", "0"), ("--epochs", "0"),
                                          ("--threads", "0"), ("--producers", "0")])
def test_bench_options_are_bounded(src, option, value):
    _usage_error(["bench", src, option, value, "-q"], option)


def test_index_and_verify_options_are_bounded(tmp_path):
    (tmp_path / "parts").mkdir()
    _usage_error(["index", tmp_path / "parts", "--max-classes", 2**31], "--max-classes")
    _usage_error(["verify", tmp_path / "parts", "--threads", "0"], "--threads")
    _usage_error(["verify", tmp_path / "parts", "--cache-limit", "-5GB"], "--cache-limit")


def test_sizes_parse():
    from recordtool.checks import parse_size

    assert parse_size("s", "128MB") == 128 << 20 and parse_size("s", "1GiB") == 1 << 30
    assert parse_size("s", "1.5GB") == 3 << 29 and parse_size("s", "1000000") == 10**6 and parse_size("s", 7) == 7
    for bad in ("1e400MB", "-1", "nan", "inf", "0", "", "MB", True, 2**41):
        with pytest.raises(ConfigError):
            parse_size("s", bad)


def test_api_edges_raise_option_error(src, tmp_path):
    from recordtool.format.scan import index_parts
    from recordtool.pack import pack
    from recordtool.pack.transcode import Transcode
    from recordtool.sources.imagefolder import ImageFolderSource
    from recordtool.tools.tune import Candidate, run

    assert issubclass(ConfigError, RecordtoolError) and issubclass(ConfigError, ValueError)
    for kw in ({"max_side": -5}, {"max_side": 0}, {"quality": 0}, {"quality": 101}, {"max_side": 2.5}):
        with pytest.raises(ConfigError):
            Transcode(**kw)
    out = tmp_path / "out"
    for kw in ({"shard_size": float("inf")}, {"shard_size": "1e400MB"}, {"shard_size": -5}, {"workers": 0},
               {"seed": -1}, {"max_pixels": 0}, {"shards": 0}, {"shards": True}):
        with pytest.raises(ConfigError):
            pack(src, str(out), progress=False, **kw)
        assert not out.exists()
    for kw in ({"max_side": -64}, {"max_side": 0}, {"max_side": 256, "quality": 101}):
        with pytest.raises(ConfigError):
            Candidate(**kw)
    for kw in ({"images": -5}, {"batch_size": 0}, {"epochs": 0}, {"min_psnr": float("nan")}, {"threads": 0}):
        with pytest.raises(ConfigError):
            run(src, progress=False, **kw)
    (tmp_path / "parts").mkdir()
    with pytest.raises(ConfigError, match="max_classes"):
        index_parts(str(tmp_path / "parts"), progress=False, max_classes=2**31)  # before the scan
    with pytest.raises(ConfigError, match="max_classes"):
        ImageFolderSource(src, max_classes=0)
    assert os.listdir(tmp_path / "parts") == []

"""What a user meets first on the command line: class names in `inspect`, the option a wrong
`pack` call was missing, and a named reason when `bench --device cuda` cannot run here."""
import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import jpeg_bytes, write

CLI = [sys.executable, "-m", "recordtool.cli"]


def run(*args):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_user")
    for k, cls in enumerate(["n01440764", "goldfish", "tench fish"]):
        for i in range(4 + k):
            write(str(root / "src" / cls / f"{i}.jpg"), jpeg_bytes(48, 40, seed=10 * k + i))
    p = run("pack", root / "src", root / "out", "-q")
    assert p.returncode == 0, p.stderr
    return root / "out"


def test_inspect_shows_class_names(packed):
    p = run("inspect", packed)
    assert p.returncode == 0, p.stderr
    assert "classes: 0 'goldfish' (5), 1 'n01440764' (4), 2 'tench fish' (6)" in p.stdout
    s = json.loads(run("inspect", packed, "--json").stdout)
    assert s["class_names"] == ["goldfish", "n01440764", "tench fish"] and s["records_per_class"] == [5, 4, 6]


def test_pack_a_glob_without_from_tfrecord_suggests_it(tmp_path):
    write(str(tmp_path / "slim-00000-of-00002"), b"\0" * 64)
    p = run("pack", str(tmp_path / "slim-*"), tmp_path / "out")
    assert p.returncode == 2 and "--from tfrecord --keys tf-slim|tfds" in p.stderr and "Traceback" not in p.stderr
    p = run("pack", tmp_path / "slim-00000-of-00002", tmp_path / "out")  # a file, not a folder
    assert p.returncode == 2 and "--from tfrecord" in p.stderr
    p = run("pack", tmp_path / "nope", tmp_path / "out")
    assert p.returncode == 2 and "nope does not exist" in p.stderr


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_bench_on_cuda_without_cupy_says_what_to_install(packed):
    p = run("bench", packed, "--device", "cuda", "-q")
    assert p.returncode == 1 and "pip install 'recordtool[cu13]'" in p.stderr and "Traceback" not in p.stderr

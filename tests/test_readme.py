"""README.md's ```python examples run as they are written: each block in a fresh interpreter,
in a folder holding what the examples name — `out/train` and `out/val` packed from generated
images, and the same dataset on an S3 server on 127.0.0.1 (moto's) at `s3://bucket/imagenet/train`
and `s3://demo/train`, reached as README's "Try it on your machine" sets up (FSSPEC_S3_ENDPOINT_URL
and the AWS variables).

Three things of the README are replaced in the code before it runs, because they name places
of the reader's machine: the server's address (README: http://127.0.0.1:5555; here the port
the test server got) and the cache folders /tmp/rt-cache and /nvme/cache (here folders of the
test's own). A block whose first lines hold `# needs: cuda` (a CUDA device and CuPy),
`# needs: torchvision` or `# needs: numba` is skipped only where that is absent; a block that
names an `s3://` URL needs the S3 server's packages (moto, s3fs: the test extra, which CI
installs). Numba is an optional extra the test environment has: a block that does not declare
it runs where it cannot be imported, as on an install without `recordtool[numba]`.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from conftest import jpeg_bytes, write

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
README_ENDPOINT = "http://127.0.0.1:5555"
NEEDS = re.compile(r"^#\s*needs:\s*(.+)$")


def blocks() -> list:
    """(first line number, code) of every ```python block of README.md."""
    found, code, start = [], None, 0
    with open(README, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if code is None:
                if line.strip() == "```python":
                    code, start = [], n + 1
            elif line.strip() == "```":
                found.append((start, "".join(code)))
                code = None
            else:
                code.append(line)
    assert code is None, f"README.md: the ```python block from line {start} is not closed"
    return found


def needs(code: str) -> set:
    """What a block declares it needs (`# needs: cuda, torchvision` among its leading comments)."""
    out = {"s3"} if "s3://" in code else set()
    for line in code.splitlines():
        if not line.startswith("#"):
            break
        m = NEEDS.match(line.strip())
        if m:
            out |= {w.strip() for w in m.group(1).split(",") if w.strip()}
    return out


def _have_cuda() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device
        return False


AVAILABLE = {
    "cuda": _have_cuda,
    "torchvision": lambda: importlib.util.find_spec("torchvision") is not None,
    "s3": lambda: all(importlib.util.find_spec(m) is not None for m in ("s3fs", "moto")),
    "numba": lambda: importlib.util.find_spec("numba") is not None,
}

# first on the path of a block that does not declare `# needs: numba`: Numba as not installed
NO_NUMBA = "raise ImportError(\"numba: not installed for a README block without '# needs: numba'\")\n"


def test_the_readme_has_runnable_examples():
    assert len(blocks()) >= 4
    for line, code in blocks():
        unknown = needs(code) - set(AVAILABLE)
        assert not unknown, f"README.md line {line}: `# needs:` {sorted(unknown)}: the test knows {sorted(AVAILABLE)}"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(the folder the examples run in, their environment, the S3 server or None without its packages)."""
    from recordtool.pack import pack

    root = tmp_path_factory.mktemp("readme")
    for split, n in (("train", 272), ("val", 40)):  # train: more than one batch of 256
        for i in range(n):
            write(str(root / "src" / split / f"class{i % 4}" / f"{i}.jpg"), jpeg_bytes(40 + i % 24, 36, seed=i))
        pack(str(root / "src" / split), str(root / "out" / split), progress=False)
    # the recordtool these tests import (the installed wheel under scripts/test.sh and on the GPU
    # machine, the tree in a developer's run) is the one the examples run: never the tree's
    # sources where no native part was built into it
    import recordtool

    home = os.path.dirname(os.path.dirname(os.path.abspath(recordtool.__file__)))
    path = [home] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    if not AVAILABLE["s3"]():
        yield root, env, None
        return
    import fsspec.config
    import s3fs
    from s3server import S3

    server = S3()
    env.update(FSSPEC_S3_ENDPOINT_URL=server.options["endpoint_url"], AWS_ACCESS_KEY_ID="testing",
               AWS_SECRET_ACCESS_KEY="testing")
    try:
        fs = s3fs.S3FileSystem(**server.options)
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(fsspec.config.conf, "s3", dict(server.options))  # what FSSPEC_S3_* set up, for pack here
            for bucket, url in (("bucket", "s3://bucket/imagenet/train"), ("demo", "s3://demo/train")):
                fs.mkdir(bucket)
                pack(str(root / "src" / "train"), url, shards=4, progress=False)
        yield root, env, server
    finally:
        server.stop()


@pytest.mark.parametrize("line, code", [pytest.param(n, code, id=f"line{n}",
                                                     marks=[pytest.mark.gpu] if "cuda" in needs(code) else [])
                                        for n, code in blocks()])
def test_readme_example_runs(request, line, code):
    missing = sorted(n for n in needs(code) if n in AVAILABLE and not AVAILABLE[n]())
    if missing:
        pytest.skip(f"README.md line {line} needs {', '.join(missing)}")
    root, env, server = request.getfixturevalue("world")
    if server is not None:
        code = code.replace(README_ENDPOINT, server.options["endpoint_url"])
    code = (code.replace("/tmp/rt-cache", str(root / "rt-cache")).replace("/nvme/cache", str(root / "nvme-cache")))
    if "numba" not in needs(code):
        write(str(root / "no-numba" / "numba.py"), NO_NUMBA.encode())
        env = dict(env, PYTHONPATH=os.pathsep.join([str(root / "no-numba"), env["PYTHONPATH"]]))
    p = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"README.md line {line}:\n{p.stderr[-4000:]}"

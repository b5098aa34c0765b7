"""Packed sets the GPU tests share: built once a session, read only."""
import io

import pytest

from conftest import photo_like
from gpu_data import mixed_jpegs


@pytest.fixture(scope="session")
def packed_mix(tmp_path_factory):
    """A small packed set with engine, hybrid (progressive, gray) and CPU (CMYK) files."""
    from conftest import write
    from recordtool.pack import pack

    root = tmp_path_factory.mktemp("gpu_loader")
    bufs, _ = mixed_jpegs(40)
    for i, b in enumerate(bufs):
        write(str(root / "src" / f"c{i % 4}" / f"{i}.jpg"), b)
    cmyk = io.BytesIO()
    photo_like(200, 150, seed=99).convert("CMYK").save(cmyk, "JPEG", quality=90)
    write(str(root / "src" / "c0" / "cmyk.jpg"), cmyk.getvalue())
    pack(str(root / "src"), str(root / "out"), shards=2, progress=False)
    return str(root / "out")


@pytest.fixture(scope="session")
def packed_layouts(tmp_path_factory):
    """A packed set of every layout the index names: 4:4:4 and gray (baseline and progressive)
    beside 4:2:0 / 4:2:2 files."""
    from conftest import write
    from recordtool.pack import pack

    root = tmp_path_factory.mktemp("gpu_layouts")
    kinds = [(0, False, False), (0, True, False), (None, False, True), (None, True, True), (2, False, False),
             (1, False, False), (2, True, False)]
    for i in range(28):
        sub, prog, gray = kinds[i % len(kinds)]
        im = photo_like(*[(500, 375), (375, 500), (640, 480), (333, 500)][i % 4], seed=200 + i)
        buf = io.BytesIO()
        if gray:
            im.convert("L").save(buf, "JPEG", quality=92, progressive=prog)
        else:
            im.save(buf, "JPEG", quality=92, subsampling=sub, progressive=prog)
        write(str(root / "src" / f"c{i % 3}" / f"{i}.jpg"), buf.getvalue())
    pack(str(root / "src"), str(root / "out"), shards=2, progress=False)
    return str(root / "out")

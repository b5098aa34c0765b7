"""Tiny datasets built in tmp dirs: tests never need ../shared or network."""
from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

# scripts/test.sh (and so CI) tests the installed wheel: a run that imports the source tree's
# recordtool instead would test what no user installs
if os.environ.get("RECORDTOOL_TEST_INSTALLED") == "1":
    import recordtool

    _tree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.dirname(os.path.abspath(recordtool.__file__)) == os.path.join(_tree, "recordtool"):
        pytest.exit(f"RECORDTOOL_TEST_INSTALLED=1 but recordtool comes from the source tree "
                    f"({recordtool.__file__}): run from outside it (scripts/test.sh)", returncode=3)

# Ray tests (pack --engine ray): every Ray process on the loopback address, no usage report
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def photo_like(w: int, h: int, seed: int = 0) -> Image.Image:
    """Smooth colour field + noise: compresses and decodes like a photo, small and fast."""
    rng = np.random.default_rng(seed)
    base = Image.fromarray(rng.integers(0, 256, (max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8))
    a = np.asarray(base.resize((w, h), Image.BICUBIC), dtype=np.float32)
    a += rng.normal(0, 6, a.shape).astype(np.float32)
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8), "RGB")


def sharp_chroma(w: int, h: int, seed: int = 0, cells: int = 24, alpha: float = 0.5) -> Image.Image:
    """A photo-like image with hard-edged saturated colour patches blended in: sharp chroma edges,
    where nvJPEG's replicated 4:2:x chroma and libjpeg's fancy upsampling differ most (like the
    worst real photos, e.g. sand dunes against sky)."""
    rng = np.random.default_rng(seed)
    base = np.asarray(photo_like(w, h, seed), np.float32)
    grid = rng.integers(0, 256, (cells * h // w + 1, cells, 3)).astype(np.uint8)
    patches = np.asarray(Image.fromarray(grid).resize((w, h), Image.NEAREST), np.float32)
    return Image.fromarray(np.clip((1 - alpha) * base + alpha * patches, 0, 255).astype(np.uint8))


def jpeg_bytes(w=64, h=48, seed=0, mode="RGB", **save) -> bytes:
    im = photo_like(w, h, seed)
    if mode != "RGB":
        im = im.convert(mode)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=save.pop("quality", 90), **save)
    return buf.getvalue()


def png_bytes(w=40, h=30, seed=0, mode="RGB") -> bytes:
    buf = io.BytesIO()
    photo_like(w, h, seed).convert(mode).save(buf, "PNG")
    return buf.getvalue()


def write(path, data: bytes):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def packed_folder(root, n: int, classes: int = 3, w: int = 40, h: int = 36, seed: int = 0) -> str:
    """A small dataset packed under `root` (2 shards): n JPEGs in `classes` class folders, of
    w, w + 4 or w + 8 by h pixels, each drawn from seed + its index; returns the packed path."""
    from recordtool.pack import pack

    for i in range(n):
        write(str(root / "src" / f"c{i % classes}" / f"{i}.jpg"), jpeg_bytes(w + 4 * (i % 3), h, seed=seed + i))
    pack(str(root / "src"), str(root / "out"), shards=2, progress=False)
    return str(root / "out")


@pytest.fixture
def folder(tmp_path):
    """A clean ImageFolder: 3 classes × 7 JPEGs of mixed sizes and subsamplings."""
    root = tmp_path / "src"
    k = 0
    for c, cls in enumerate(["cat", "dog", "eel"]):
        for i in range(7):
            sub = [0, 1, 2][k % 3]
            write(str(root / cls / f"{cls}_{i}.JPEG"),
                  jpeg_bytes(40 + 8 * (k % 5), 30 + 4 * (k % 7), seed=k, subsampling=sub,
                             progressive=(k % 6 == 5)))
            k += 1
    return root


def tree(root) -> dict:
    """name → bytes of every file directly in a dataset directory (what byte-identity compares)."""
    return {n: open(os.path.join(root, n), "rb").read() for n in sorted(os.listdir(root))
            if os.path.isfile(os.path.join(root, n))}


@pytest.fixture(scope="module")
def host_kernel(tmp_path_factory):
    """native/gpu_resize.cu built for the host (tests/host_kernel.py), or a skip without g++."""
    from host_kernel import build

    lib = build(tmp_path_factory.mktemp("hostkernel"))
    if lib is None:
        pytest.skip("no C++ compiler")
    return lib


def cut_to_region(planes, roi, hs, vs):
    """What a region decode writes: the whole planes (Y, and Cb, Cr subsampled hs × vs, or Y
    alone) cut to the region roi = (x, y, w, h); (y, None, None) for grayscale."""
    from recordtool.decode.gpu.roi import chroma_dims

    rx, ry, rw, rh = roi
    y = planes[0][ry:ry + rh, rx:rx + rw]
    if len(planes) == 1:
        return y, None, None
    (cc,), (cr,) = chroma_dims([roi], hs, vs)
    return (y, *(p[ry // vs:ry // vs + cr, rx // hs:rx // hs + cc] for p in planes[1:]))

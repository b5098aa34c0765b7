"""GPU path: kernel vs its numpy reference, GPU vs CPU pixels, split, steady-state memory.

The GPU tests skip cleanly without CuPy or a GPU (CI); the reference and routing tests run
everywhere. scripts/device_run.sh runs this file on the H200 machine.
"""
import io

import numpy as np
import pytest
from PIL import Image

from conftest import photo_like
from recordtool.decode import decode_crop_resize, random_flips, random_windows
from recordtool.decode.gpu import CPU, ENGINE, HYBRID, hardware_decodable, route
from recordtool.decode.gpu_ref import resize_normalize
from recordtool.format.jpeg import CHROMA_411, CHROMA_420, CHROMA_422, CHROMA_GRAY, CS_CMYK, CS_GRAY, CS_YCBCR


def psnr(a, b):
    mse = ((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2).mean()
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def test_routing_from_index_columns():
    chroma = np.array([CHROMA_420, CHROMA_422, CHROMA_420, CHROMA_411, CHROMA_GRAY, -1])
    prog = np.array([0, 0, 1, 0, 0, 0])
    cs = np.array([CS_YCBCR, CS_YCBCR, CS_YCBCR, CS_YCBCR, CS_GRAY, CS_CMYK])
    assert hardware_decodable(chroma, prog, cs).tolist() == [True, True, False, False, False, False]
    # progressive and gray to nvJPEG's hybrid decoder; 4:1:1 and CMYK to the CPU
    assert route(chroma, prog, cs).tolist() == [ENGINE, ENGINE, HYBRID, CPU, HYBRID, CPU]


@pytest.mark.parametrize("shape,box,out", [((300, 400), (0, 0, 400, 300), (224, 224)),
                                           ((80, 60), (3.5, 1.25, 57.5, 70.75), (224, 224)),
                                           ((500, 375), (10, 20, 300, 460), (96, 128))])
def test_kernel_reference_matches_pillow(shape, box, out):
    region = np.asarray(photo_like(shape[1], shape[0], seed=4))
    ref = np.asarray(Image.fromarray(region).resize((out[1], out[0]), Image.BILINEAR, box=box))
    got = np.clip(np.rint(resize_normalize(region, box, out[0], out[1])), 0, 255)
    assert psnr(got, ref) > 45
    m = resize_normalize(region, box, out[0], out[1], mirror=True)
    assert np.allclose(m, resize_normalize(region, box, out[0], out[1])[:, ::-1])


try:
    import cupy

    _ngpu = cupy.cuda.runtime.getDeviceCount()
except Exception:  # no CuPy, or no driver
    cupy, _ngpu = None, 0
gpu = pytest.mark.skipif(_ngpu == 0, reason="no CuPy or no CUDA device")


def _jpegs(n=24):
    out, sizes = [], []
    for k in range(n):
        w, h = [(500, 375), (375, 500), (640, 480), (333, 500)][k % 4]
        im = photo_like(w, h, seed=k)
        if k % 7 == 3:
            im = im.convert("L")
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=92, subsampling=[2, 1, 0][k % 3], progressive=(k % 5 == 4))
        out.append(buf.getvalue())
        sizes.append((w, h))
    return out, np.array(sizes)


def _hw(bufs):
    """Route codes, as the index columns give them."""
    from recordtool.format.jpeg import probe

    infos = [probe(b) for b in bufs]
    return route([i.chroma for i in infos], [i.progressive for i in infos], [i.colorspace for i in infos])


@gpu
@pytest.mark.parametrize("dtype,layout", [("float32", "NCHW"), ("float16", "NHWC"), ("uint8", "NCHW")])
def test_kernel_matches_reference(dtype, layout):
    from recordtool.decode.gpu import SAMPLE_DTYPE, kernel

    rng = np.random.default_rng(1)
    regions = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(300, 400), (50, 70), (224, 224)]]
    boxes = [(0, 0, 400, 300), (2.5, 1.0, 66.0, 49.5), (0, 0, 224, 224)]
    mirror = [0, 1, 0]
    dev = [cupy.asarray(r) for r in regions]
    samples = np.zeros(3, SAMPLE_DTYPE)
    for k, (r, b) in enumerate(zip(dev, boxes)):
        samples[k] = (r.data.ptr, r.shape[1] * 3, r.shape[1], r.shape[0], *b, mirror[k])
    H, W = 96, 112
    out = cupy.empty((3, 3, H, W) if layout == "NCHW" else (3, H, W, 3), dtype)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    kernel(dtype, layout)(((W + 31) // 32, (H + 7) // 8, 3), (32, 8, 1),
                          (cupy.asarray(samples.view(np.uint8)), out, np.int32(W), np.int32(H),
                           *[np.float32(v) for v in mean + std]))
    got = cupy.asnumpy(out).astype(np.float64)
    if layout == "NCHW":
        got = got.transpose(0, 2, 3, 1)
    for k in range(3):
        norm = dtype != "uint8"
        ref = resize_normalize(regions[k], boxes[k], H, W, bool(mirror[k]), mean if norm else None,
                               std if norm else None)
        tol = {"float32": 1e-3, "float16": 2e-2, "uint8": 1.0}[dtype]
        assert np.abs(got[k] - (ref if norm else np.rint(ref))).max() <= tol


@gpu
@pytest.mark.parametrize("split", ["gpu", "cpu", "auto", 0.5])
def test_gpu_matches_cpu_40db(split):
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = _jpegs()
    ids = np.arange(len(bufs))
    win = random_windows(sizes[:, 0], sizes[:, 1], ids, 3, 0)
    flips = random_flips(ids, 3, 0)
    dec = GPUDecoder(max_batch=32, dtype="uint8", layout="NHWC", split=split)
    out = cupy.asnumpy(dec(bufs, win, flips, _hw(bufs)))
    ref = decode_crop_resize(bufs, win)
    ref[flips] = ref[flips, :, ::-1]
    for k in range(len(bufs)):
        assert psnr(out[k], ref[k]) >= 40, (k, split, dec.last)
    routes = _hw(bufs)
    assert (routes == HYBRID).sum() >= 6  # progressive and gray files are in the batch
    if split == "cpu":
        assert dec.last.gpu == 0 and dec.last.hybrid == 0
    else:
        if dec.hw is not None and split == "gpu":
            assert dec.last.gpu == int((routes == ENGINE).sum())
        if dec.hybrid is not None:  # every progressive / gray window went through the hybrid decoder
            assert dec.last.hybrid == int((routes == HYBRID).sum()), dec.last
    dec.close()


@gpu
def test_hybrid_off_sends_progressive_and_gray_to_cpu():
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = _jpegs(12)
    win = random_windows(sizes[:, 0], sizes[:, 1], np.arange(12), 1, 0)
    dec = GPUDecoder(max_batch=16, dtype="uint8", layout="NHWC", split="gpu", hybrid=False)
    out = cupy.asnumpy(dec(bufs, win, np.zeros(12, bool), _hw(bufs)))
    assert dec.last.hybrid == 0 and dec.last.cpu_forced == int((_hw(bufs) != ENGINE).sum())
    ref = decode_crop_resize(bufs, win)
    assert min(psnr(out[k], ref[k]) for k in range(12)) >= 40
    dec.close()


@gpu
def test_output_ring_recycles_after_release_and_spills_when_held():
    from recordtool.decode.gpu import GPUDecoder, OutputRing

    bufs, sizes = _jpegs(8)
    win = random_windows(sizes[:, 0], sizes[:, 1], np.arange(8), 2, 0)
    dec = GPUDecoder(max_batch=8, dtype="float32", layout="NCHW", split="gpu")
    ring = dec.ring = OutputRing(dec.output_shape(), "float32", 2)
    first = dec(bufs, win, np.zeros(8, bool), _hw(bufs))
    keep = cupy.asnumpy(first)
    ptr = first.data.ptr
    assert ring.free == 1
    second = dec(bufs, win, np.ones(8, bool), _hw(bufs))  # the other slot: `first` is still held
    assert second.data.ptr != ptr and ring.free == 0
    third = dec(bufs, win, np.zeros(8, bool), _hw(bufs))  # both held: from CuPy's pool, counted
    assert ring.spills == 1
    assert np.array_equal(cupy.asnumpy(first), keep)  # a held batch is never overwritten
    view = first[2:5]  # a view keeps the slot too
    del first, third
    assert ring.free == 0
    del view
    assert ring.free == 1
    again = dec(bufs, win, np.zeros(8, bool), _hw(bufs))
    assert again.data.ptr == ptr and np.array_equal(cupy.asnumpy(again), keep)
    del second, again
    assert ring.free == 2
    dec.close()


@gpu
def test_auto_split_adapts_and_memory_is_steady():
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = _jpegs(64)
    ids = np.arange(len(bufs))
    dec = GPUDecoder(max_batch=64, split="auto")
    dec.warmup([len(b) for b in bufs], sizes[:, 0], sizes[:, 1])
    pool = cupy.get_default_memory_pool()
    fractions = []
    for epoch in range(6):
        win = random_windows(sizes[:, 0], sizes[:, 1], ids, 0, epoch)
        out = dec(bufs, win, random_flips(ids, 0, epoch), _hw(bufs))
        del out
        fractions.append(dec.cpu_fraction)
        if epoch == 1:
            before, allocs = pool.total_bytes(), dec.allocations
    assert pool.total_bytes() == before and dec.allocations == allocs  # nothing new after warm-up
    assert dec.ring.spills == 0 and dec.prealloc_error is None
    if dec.hw is not None:
        assert len(set(fractions)) > 1 and 0 < fractions[-1] < 0.9  # the share moved with measured rates


@gpu
def test_bad_jpeg_in_batch_is_reported():
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = _jpegs(8)
    hw = _hw(bufs)  # as the index says: the damage happened after packing
    bufs[2] = bufs[2][: len(bufs[2]) // 3]
    ids = np.arange(8)
    win = random_windows(sizes[:, 0], sizes[:, 1], ids, 0, 0)
    on_cpu = GPUDecoder(max_batch=8, dtype="uint8", split="cpu")
    on_cpu(bufs, win, np.zeros(8, bool), hw)
    assert [i for i, _ in on_cpu.last.errors] == [2]  # the CPU path names it
    # Neither the engines nor the hybrid decoder report a truncated stream (seen on the H200):
    # a file not ending in EOI is sent to libjpeg, which names it
    bufs[4] = bufs[4][: len(bufs[4]) // 3]
    assert hw[4] == HYBRID
    on_gpu = GPUDecoder(max_batch=8, dtype="uint8", layout="NHWC", split="gpu")
    out = cupy.asnumpy(on_gpu(bufs, win, np.zeros(8, bool), hw))
    assert sorted(i for i, _ in on_gpu.last.errors) == [2, 4], on_gpu.last
    assert on_gpu.last.cpu == 2 + int((hw == CPU).sum())
    ref = decode_crop_resize(bufs, win, on_error="skip")
    for k in set(range(8)) - {2, 4}:  # the rest of the batch is intact
        assert psnr(out[k], ref[k]) >= 40


@gpu
def test_dlpack_to_torch():
    torch = pytest.importorskip("torch")
    from recordtool.decode.gpu import GPUDecoder, to_torch

    bufs, sizes = _jpegs(8)
    win = random_windows(sizes[:, 0], sizes[:, 1], np.arange(8), 0, 0)
    dec = GPUDecoder(max_batch=8, dtype="float16")
    t = to_torch(dec(bufs, win, np.zeros(8, bool), _hw(bufs)), dec.stream)
    assert t.is_cuda and t.dtype == torch.float16 and tuple(t.shape) == (8, 3, 224, 224)
    assert torch.isfinite(t).all()


@pytest.fixture(scope="module")
def packed_mix(tmp_path_factory):
    """A small packed set with engine, hybrid (progressive, gray) and CPU (CMYK) files."""
    from conftest import write
    from recordtool.pack import pack

    root = tmp_path_factory.mktemp("gpu_loader")
    bufs, _ = _jpegs(40)
    for i, b in enumerate(bufs):
        write(str(root / "src" / f"c{i % 4}" / f"{i}.jpg"), b)
    cmyk = io.BytesIO()
    photo_like(200, 150, seed=99).convert("CMYK").save(cmyk, "JPEG", quality=90)
    write(str(root / "src" / "c0" / "cmyk.jpg"), cmyk.getvalue())
    pack(str(root / "src"), str(root / "out"), shards=2, progress=False)
    return str(root / "out")


@gpu
def test_cuda_loader_matches_cpu_loader_and_resumes(packed_mix):
    from recordtool.loader import Loader

    kw = dict(batch_size=8, size=64, seed=4, drop_last=False, as_torch=False, dtype="float32", layout="NHWC")
    cpu_batches = [(np.asarray(x), np.asarray(y)) for x, y in Loader(packed_mix, device="cpu", **kw)]
    gpu_loader = Loader(packed_mix, device="cuda", producers=3, **kw)
    gpu_batches = [(cupy.asnumpy(x), cupy.asnumpy(y)) for x, y in gpu_loader]
    assert len(gpu_batches) == len(cpu_batches) == 6
    std = np.array([0.229, 0.224, 0.225], np.float32)
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    for (xg, yg), (xc, yc) in zip(gpu_batches, cpu_batches):
        assert np.array_equal(yg, yc)
        for a, b in zip(xg, xc):  # back to 0..255 pixels to compare
            assert psnr((a * std + mean) * 255, (b * std + mean) * 255) >= 40
    split = gpu_loader.last_split
    assert split["gpu"] + split["hybrid"] + split["cpu"] == split["n"]
    # resume mid-epoch on the GPU: the same batches as the uninterrupted run (bit for bit with a
    # fixed split; the auto split moves images between engines and CPU by measured speed)
    kw["split"] = "gpu"
    gpu_batches = [(cupy.asnumpy(x), None) for x, _ in Loader(packed_mix, device="cuda", producers=3, **kw)]
    part = Loader(packed_mix, device="cuda", producers=2, **kw)
    it = iter(part)
    next(it), next(it)
    state = part.state_dict()
    del it
    part.close()
    resumed = Loader(packed_mix, device="cuda", producers=4, **kw)
    resumed.load_state_dict(state)
    rest = [cupy.asnumpy(x) for x, _ in resumed]
    assert len(rest) == 4
    for a, (b, _) in zip(rest, gpu_batches[2:]):
        assert np.array_equal(a, b)


@gpu
def test_cuda_loader_memory_fixed_after_warmup(packed_mix):
    torch = pytest.importorskip("torch")
    from recordtool.loader import Loader

    ld = Loader(packed_mix, batch_size=8, size=64, device="cuda", dtype="float16")
    pool = cupy.get_default_memory_pool()
    for epoch in range(4):
        ld.set_epoch(epoch)
        for x, y in ld:
            assert x.is_cuda and x.dtype == torch.float16
            x = x.float().sum()  # the consumer works on the batch on torch's stream
        torch.cuda.synchronize()
        if epoch == 0:
            before = pool.total_bytes()
    assert pool.total_bytes() == before and ld.ring.spills == 0
    assert ld.ring.free == ld.ring.slots  # every batch given back


@gpu
def test_cuda_loader_names_a_damaged_record(packed_mix, tmp_path):
    from test_loader import _damaged_copy

    from recordtool.loader import Loader, RecordError

    ix = __import__("recordtool").open(packed_mix).index
    engine = int(np.nonzero(route(ix.chroma, ix.progressive, ix.colorspace) == ENGINE)[0][3])
    path, shard, off = _damaged_copy(packed_mix, tmp_path, engine)
    ld = Loader(path, batch_size=8, size=64, device="cuda", as_torch=False)
    with pytest.raises(RecordError, match=f"record {engine} .*{shard}.*offset {off}"):
        for _ in ld:
            pass


# ------------------------------------------------------------------ the split planner (no GPU needed)

def test_planner_routes_eoi_and_fixed_splits():
    from recordtool.decode.gpu import SplitPlanner, ends_with_eoi

    routes = np.array([ENGINE] * 6 + [HYBRID] * 2 + [CPU] * 2, np.int8)
    bufs = [b"\xff\xd8..\xff\xd9"] * 10
    bufs[1] = b"\xff\xd8..truncated"  # no EOI: libjpeg must see it (GPU decoders do not report truncation)
    eoi = ends_with_eoi(bufs)
    assert eoi.tolist() == [True, False] + [True] * 8
    p = SplitPlanner("gpu").plan(routes, eoi)
    assert p.engine.tolist() == [0, 2, 3, 4, 5] and p.hybrid.tolist() == [6, 7]
    assert sorted(p.cpu.tolist()) == [1, 8, 9] and p.forced == 3 and p.n == 10
    p = SplitPlanner("cpu").plan(routes, eoi)
    assert len(p.engine) == len(p.hybrid) == 0 and sorted(p.cpu.tolist()) == list(range(10))
    p = SplitPlanner(0.5).plan(routes, eoi)  # half the batch on the CPU: forced ones + engine images
    assert len(p.cpu) == 5 and p.cpu[:3].tolist() == [1, 8, 9] and len(p.engine) == 3
    p = SplitPlanner("gpu", engines=True, hybrid=False).plan(routes, eoi)
    assert len(p.hybrid) == 0 and {6, 7} <= set(p.cpu.tolist())
    p = SplitPlanner("auto", engines=False).plan(routes, eoi)  # no engines here
    assert len(p.engine) == 0 and {0, 2, 3, 4, 5} <= set(p.cpu.tolist())
    with pytest.raises(ValueError):
        SplitPlanner(1.5)


def test_planner_auto_split_follows_measured_rates():
    from recordtool.decode.gpu import SplitPlanner

    pl = SplitPlanner("auto")
    routes = np.full(100, ENGINE, np.int8)
    eoi = np.ones(100, bool)
    assert len(pl.plan(routes, eoi).cpu) == 0
    pl.observe(100, 100, 0.01, 0, None)  # engines measured, CPU not yet: send it a few to measure
    assert 0 < len(pl.plan(routes, eoi).cpu) <= 10
    for _ in range(30):  # engines 4× as fast as the CPU: the CPU should get ~1/5
        p = pl.plan(routes, eoi)
        pl.observe(100, len(p.engine), len(p.engine) / 8000, len(p.cpu), len(p.cpu) / 2000)
    assert abs(pl.cpu_fraction - 0.2) < 0.02 and abs(len(pl.plan(routes, eoi).cpu) - 20) <= 2
    # the hybrid decoder gets what it finishes while the engines do their part, the rest the CPU
    routes[:50] = HYBRID
    pl.rates.hybrid = 500.0
    p = pl.plan(routes, eoi)
    t_engines = 50 * (1 - pl.cpu_fraction) / pl.rates.gpu
    assert len(p.hybrid) == max(2, int(500.0 * t_engines)) and p.n == 100


@gpu
@pytest.mark.parametrize("how", ["abandoned", "break", "collected"])
def test_cuda_script_leaving_a_loader_exits_cleanly(packed_mix, tmp_path, how):
    import subprocess
    import sys

    from test_loader import _EXIT_SCRIPT

    script = tmp_path / "leave.py"
    script.write_text(_EXIT_SCRIPT)
    p = subprocess.run([sys.executable, str(script), how, packed_mix, "cuda"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "end of script" in p.stdout, (p.returncode, p.stderr[-2000:])


@gpu
def test_cuda_keyed_user_op_same_for_any_producers_and_normalised_by_the_kernel(packed_mix):
    """Keyed ops get their keys with the call (no race between producers); the uint8 batch the
    op returns is normalised by the resize kernel at 1:1 into the output ring — the same values
    as normalising it on the host."""
    from recordtool.loader import Loader
    from recordtool.user_ops import Cutout

    kw = dict(batch_size=8, size=48, seed=2, split="gpu", as_torch=False, dtype="float32", layout="NCHW",
              user_op=Cutout(16))
    ref = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", producers=1, **kw)]
    got = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", producers=4, **kw)]
    assert all(np.array_equal(a, b) for a, b in zip(ref, got))
    raw = Loader(packed_mix, device="cuda", producers=1, **dict(kw, mean=(0, 0, 0), std=(1 / 255,) * 3))
    x = cupy.asnumpy(next(iter(raw))[0])
    assert np.abs(x - np.rint(x)).max() < 1e-3 and x.min() > -1e-3 and x.max() < 255.001  # pixels back
    assert (x == 0).all(axis=1).any()  # the cutout squares are there


def _image_ops():
    # the GPU form needs no Numba (only the CPU form is compiled by it)
    from recordtool.ops import ColorJitter, Cutout, RandomGrayscale

    return [RandomGrayscale(0.5), Cutout(9), ColorJitter(0.4, 0.4, 0.4), ColorJitter(0.9, 0.0, 2.0, seed=3)]


@gpu
@pytest.mark.parametrize("shape", [(5, 29, 23), (1, 16, 16), (3, 7, 300), (64, 224, 224)])
def test_image_op_cuda_kernels_equal_their_numpy_reference(shape):
    """Each compiled op's CUDA kernel (one launch over the batch) gives the NumPy reference's
    pixels exactly (integer arithmetic), with the params computed on the host as on the CPU."""
    from recordtool.loader import BatchKeys
    from recordtool.ops.cuda import launch

    n, h, w = shape
    rng = np.random.default_rng(h)
    for op in _image_ops():
        b = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
        b[0] = 255
        p = op.batch_params(n, BatchKeys(np.arange(n) + 3, 1, 2), h, w)
        d = cupy.asarray(b)
        launch(op, d, p)
        assert np.array_equal(cupy.asnumpy(d), op.reference(b.copy(), p)), op.name
        d = cupy.asarray(b)  # as a batch op on a CuPy batch: the same kernel
        assert np.array_equal(cupy.asnumpy(op(d, BatchKeys(np.arange(n) + 3, 1, 2))), op.reference(b.copy(), p))


@gpu
def test_cuda_loader_with_a_compiled_op_same_for_any_producers_and_equal_to_the_host_reference(packed_mix):
    """Loader(device="cuda", user_op=ImageOp): the kernel runs on the unmirrored uint8 batch, the
    normalising pass mirrors. Pointwise ops commute with the mirror, so the batches equal those
    of the op's NumPy reference run as a batch op on the host (ReferenceOp); Cutout is checked
    without flips (train=False)."""
    from recordtool.loader import Loader
    from recordtool.ops import ReferenceOp

    for op in _image_ops()[:3]:
        kw = dict(batch_size=8, size=48, seed=2, split="gpu", as_torch=False, dtype="float32", layout="NCHW",
                  train=op.name != "Cutout")
        one = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", producers=1, user_op=op, **kw)]
        four = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", producers=4, user_op=op, **kw)]
        ref = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", producers=2, user_op=ReferenceOp(op),
                                                  **kw)]
        assert len(one) == len(ref) > 0
        assert all(np.array_equal(a, b) for a, b in zip(one, four)), op.name
        assert all(np.array_equal(a, b) for a, b in zip(one, ref)), op.name


@gpu
def test_cuda_kernel_that_nvrtc_refuses_is_a_clear_error():
    from recordtool.errors import OpCompileError
    from recordtool.ops import Cutout
    from recordtool.ops.cuda import kernel

    class Broken(Cutout):
        cuda_source = Cutout.cuda_source.replace("q[0] = 0;", "q[0] = undefined_name;")

    with pytest.raises(OpCompileError, match="rt_cutout of Broken"):
        kernel(Broken(4))


# ------------------------------------------------------------------ the GPU/CPU fidelity bound
# nvJPEG's decoders (engines and hybrid) upsample 4:2:0 / 4:2:2 chroma by replication; libjpeg-turbo
# (our CPU path, and Pillow) by its "fancy" triangle filter. On the H200 the raw decoded regions
# equalled libjpeg-turbo's TJFLAG_FASTUPSAMPLE decode to 0.1 dB (34.6 dB vs fancy on the worst
# photo window, both ways), 4:4:4 bit-exact, gray ≥ 65 dB (scripts/gpu_fidelity.py). README states
# the resulting bound: GPU vs CPU ≥ 35 dB per image on real photos (1st percentile ≥ 40 dB).
BOUND_DB = 35.0


def _sharp_jpegs(side, subsampling, n=3, gray=False):
    from conftest import sharp_chroma

    out = []
    for k in range(n):
        im = sharp_chroma(side, side * 3 // 4, seed=k)
        buf = io.BytesIO()
        (im.convert("L") if gray else im).save(buf, "JPEG", quality=90, subsampling=subsampling)
        out.append(buf.getvalue())
    return out


@pytest.mark.parametrize("side", [500, 1600])
@pytest.mark.parametrize("subsampling", [2, 1, 0, "gray"])
def test_fidelity_bound_with_nvjpeg_upsampling_emulated(side, subsampling):
    """CPU-only proof of the bound's cause and size: the GPU path emulated as libjpeg-turbo with
    replicated chroma (what nvJPEG outputs) + the kernel's reference resample, against our CPU path."""
    from turbojpeg import TJFLAG_FASTUPSAMPLE, TJPF_RGB

    from recordtool.decode.reference import _turbojpeg

    gray = subsampling == "gray"
    bufs = _sharp_jpegs(side, 0 if gray else subsampling, n=2, gray=gray)
    worst = 99.0
    for k, data in enumerate(bufs):
        full = _turbojpeg().decode(data, pixel_format=TJPF_RGB, flags=TJFLAG_FASTUPSAMPLE)
        h0, w0 = full.shape[:2]
        ids = np.arange(10) + 100 * k
        win = random_windows(np.full(10, w0), np.full(10, h0), ids, 0, 0)
        cpu = decode_crop_resize([data] * 10, win)
        for i, (y, x, h, w) in enumerate(win):
            gpu = np.clip(np.rint(resize_normalize(full[y:y + h, x:x + w], (0, 0, w, h), 224, 224)), 0, 255)
            worst = min(worst, psnr(gpu, cpu[i]))
    assert worst >= BOUND_DB, worst
    if subsampling in (0, "gray"):  # no chroma upsampling: only resampling differences
        assert worst >= 42, worst


@gpu
@pytest.mark.parametrize("subsampling", [2, 1, 0, "gray"])
def test_gpu_vs_cpu_bound_on_sharp_chroma_edges(subsampling):
    from recordtool.decode.gpu import GPUDecoder

    gray = subsampling == "gray"
    bufs = _sharp_jpegs(1200, 0 if gray else subsampling, n=4, gray=gray)
    sizes = np.array([[1200, 900]] * len(bufs))
    ids = np.arange(len(bufs))
    win = random_windows(sizes[:, 0], sizes[:, 1], ids, 5, 0)
    dec = GPUDecoder(max_batch=8, dtype="uint8", layout="NHWC", split="gpu")
    out = cupy.asnumpy(dec(bufs, win, np.zeros(len(bufs), bool), _hw(bufs)))
    ref = decode_crop_resize(bufs, win)
    assert dec.last.cpu == 0  # every image went through a GPU decoder
    worst = min(psnr(out[k], ref[k]) for k in range(len(bufs)))
    assert worst >= BOUND_DB, (worst, dec.last)
    if subsampling == 0:
        assert worst >= 45, worst
    dec.close()


def test_hostile_multiscan_files_never_reach_the_hybrid_decoder():
    """A progressive file with thousands of scans, or one declaring 8192² in 156 bytes, is
    refused by the decoders' rule before nvJPEG's hybrid decoder sees it (no GPU needed to check
    the routing; on a GPU the CPU path then names it)."""
    from hostile_data import bomb_progressive, many_scans

    from recordtool.decode.gpu.decoder import _refused

    assert _refused(many_scans()) and _refused(bomb_progressive())
    assert not _refused(_jpegs(5)[0][4])  # an ordinary progressive file goes to the hybrid decoder


@gpu
def test_hostile_multiscan_files_in_a_gpu_batch_are_named():
    from hostile_data import bomb_progressive, many_scans

    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = _jpegs(6)
    bufs[1], bufs[3] = many_scans(), bomb_progressive()
    sizes[1], sizes[3] = (512, 512), (8192, 8192)
    win = random_windows(sizes[:, 0], sizes[:, 1], np.arange(6), 0, 0)
    routes = _hw(bufs)
    dec = GPUDecoder(max_batch=8, dtype="uint8", layout="NHWC", split="gpu")
    dec(bufs, win, np.zeros(6, bool), routes)
    assert sorted(i for i, _ in dec.last.errors) == [1, 3], dec.last.errors
    dec.close()

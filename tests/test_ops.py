"""Compiled per-image user ops (recordtool.ops): each op's Numba function, its native call inside
the fused decode pass and its ctypes reference against the op's NumPy reference (bit-exact:
integer arithmetic); keyed draws the same whatever the threads and producers; compile errors
that name the line; Numba optional."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import jpeg_bytes, write
from recordtool.decode import cpu, decode_crop_resize, normalize, random_flips, random_windows
from recordtool.decode.cpu import NativeOp, apply_op, apply_op_reference, mirror
from recordtool.errors import OpCompileError, OpError, RecordtoolError
from recordtool.loader import BatchKeys, Loader
from recordtool.pack import pack

pytest.importorskip("numba")

from recordtool.ops import ColorJitter, Cutout, ImageOp, RandomGrayscale, ReferenceOp  # noqa: E402

OPS = [RandomGrayscale(0.5), Cutout(9), ColorJitter(0.4, 0.4, 0.4), ColorJitter(0.9, 0.0, 2.0, seed=3)]
IDS = [f"{type(o).__name__}-{k}" for k, o in enumerate(OPS)]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("ops")
    src = root / "src"
    for i in range(32):
        write(str(src / f"c{i % 2}" / f"{i}.jpg"), jpeg_bytes(72 + 8 * (i % 4), 56 + 4 * (i % 5), seed=i))
    pack(str(src), str(root / "out"), shards=2, progress=False)
    return str(root / "out")


def _batch(n=12, h=29, w=23, seed=0):
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    b[0] = 255  # saturated and flat images: the clamps and the contrast mean
    if n > 2:
        b[1] = 7
    return b


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_compiled_op_equals_its_numpy_reference(op):
    b = _batch()
    p = op.batch_params(len(b), BatchKeys(np.arange(len(b)) * 5 + 1, 2, 7), b.shape[1], b.shape[2])
    ref = op.reference(b.copy(), p)
    assert not np.array_equal(ref, b)  # the op did something
    native = apply_op(b.copy(), op.native(p), threads=3)
    assert np.array_equal(native, ref)
    by_ctypes = b.copy()  # the Python reference of the native call: the same C function, image by image
    assert not apply_op_reference(by_ctypes, op.native(p)).any()
    assert np.array_equal(by_ctypes, ref)
    plain = b.copy()  # the uncompiled function is the same op
    for i in range(len(b)):
        type(op).image(plain[i], p[i])
    assert np.array_equal(plain, ref)


def test_color_jitter_exact_at_the_extreme_factors_and_a_luma_sum_beyond_float32():
    """ColorJitter's compiled function computes its integers in float32 (exact below 2**24):
    every corner of the factor range (0 … 5 × 1024, amplitude 4) on random, black and white
    images, and an image whose luma sum passes 2**24, against the int64 NumPy reference."""
    op = ColorJitter(4, 4, 4)
    corners = np.array([0, 1, 511, 1023, 1024, 1025, 2047, 5119, 5120], np.float64)
    p = np.stack(np.meshgrid(corners, corners, corners, indexing="ij"), -1).reshape(-1, 3)
    b = np.random.default_rng(5).integers(0, 256, (len(p), 11, 7, 3), dtype=np.uint8)
    b[::7], b[1::7] = 255, 0
    b[2::7, :, :3] = [255, 0, 128]
    ref = op.reference(b.copy(), p)
    assert np.array_equal(apply_op(b.copy(), op.native(p), threads=2), ref)
    big = np.random.default_rng(6).integers(160, 256, (3, 300, 280, 3), dtype=np.uint8)  # luma sum > 2**24
    pb = np.array([[1024, 1300, 700], [900, 5120, 2000], [5120, 0, 5120]], np.float64)
    assert np.array_equal(apply_op(big.copy(), op.native(pb)), op.reference(big.copy(), pb))


def test_params_are_keyed_by_seed_epoch_and_sample_id():
    op = ColorJitter(seed=1)
    ids = np.array([5, 9, 2, 40])
    a = op.batch_params(4, BatchKeys(ids, 3, 0), 32, 32)
    # the same sample gets the same draws in any batch, at any position
    b = op.batch_params(2, BatchKeys(ids[[2, 0]], 3, 0), 32, 32)
    assert np.array_equal(a[[2, 0]], b)
    assert not np.array_equal(a, op.batch_params(4, BatchKeys(ids, 4, 0), 32, 32))  # epoch
    assert not np.array_equal(a, op.batch_params(4, BatchKeys(ids, 3, 1), 32, 32))  # loader seed
    assert not np.array_equal(a, ColorJitter(seed=2).batch_params(4, BatchKeys(ids, 3, 0), 32, 32))
    lo, hi = np.rint(0.6 * 1024), np.rint(1.4 * 1024)
    assert ((a >= lo) & (a <= hi)).all()


@pytest.mark.parametrize("op", [Cutout(12, seed=2), RandomGrayscale(0.5, seed=1)], ids=["Cutout", "RandomGrayscale"])
def test_compiled_op_equals_its_array_code_as_a_batch_op(op):
    """One definition: the compiled op and `ReferenceOp(op)` (its array code on the whole batch,
    what runs without Numba) give the same pixels, and the op changes the batch."""
    b = _batch(16, 40, 36)
    keys = BatchKeys(np.arange(16) * 3, 1, 4)
    a = op(b.copy(), keys)
    assert np.array_equal(a, ReferenceOp(op)(b.copy(), keys)) and not np.array_equal(a, b)


def test_grayscale_within_one_level_of_torchvisions_float_luma():
    b = _batch(8, 20, 20)
    a = RandomGrayscale(1.0)(b.copy(), BatchKeys(np.arange(8), 0, 0)).astype(int)
    f = np.rint(b[..., 0] * 0.299 + b[..., 1] * 0.587 + b[..., 2] * 0.114).astype(int)[..., None]
    assert np.abs(a - f).max() <= 1 and (a[..., 0] == a[..., 2]).all()


def _jpegs(n=10):
    sizes = [(90, 70), (64, 96), (120, 80), (77, 51)]
    return [jpeg_bytes(*sizes[k % 4], seed=k) for k in range(n)], sizes


@pytest.mark.parametrize("op", OPS, ids=IDS)
@pytest.mark.parametrize("threads", [1, 3])
def test_op_inside_the_fused_pass_equals_decode_then_reference_then_mirror_and_normalize(op, threads):
    bufs, sizes = _jpegs()
    n = len(bufs)
    ids = np.arange(n) + 100
    w = np.array([sizes[k % 4][0] for k in range(n)])
    h = np.array([sizes[k % 4][1] for k in range(n)])
    win = random_windows(w, h, ids, 1, 0)
    flips = random_flips(ids, 1, 0)
    assert flips.any() and not flips.all()
    p = op.batch_params(n, BatchKeys(ids, 0, 1), 24, 20)
    raw = decode_crop_resize(bufs, win, (24, 20), threads=threads)
    ref_u8 = op.reference(raw.copy(), p)
    assert np.array_equal(decode_crop_resize(bufs, win, (24, 20), threads=threads, op=op.native(p)), ref_u8)
    for layout, dtype in (("NCHW", "float32"), ("NHWC", "float16")):
        ref = normalize(mirror(ref_u8.copy(), flips), layout=layout, dtype=dtype)
        got = cpu.decode_crop_resize_normalize(bufs, win, flips, (24, 20), layout=layout, dtype=dtype,
                                               threads=threads, op=op.native(p))
        assert np.array_equal(got, ref), (layout, dtype)


def test_op_runs_on_a_failed_image_too(packed):
    """A failed image is zeros before the op (as a batch op sees it); the failure is still listed."""
    bufs, sizes = _jpegs(4)
    bufs[2] = b"\xff\xd8 not a jpeg"
    win = np.array([[0, 0, 40, 40]] * 4)
    op = ColorJitter(0, 0, 0)  # factors 1: zeros stay zeros
    p = op.batch_params(4, None, 16, 16)
    errors = []
    out = decode_crop_resize(bufs, win, (16, 16), op=op.native(p), on_error="skip", errors=errors)
    assert [i for i, _ in errors] == [2] and not out[2].any() and out[0].any()


def _loader_batches(packed, op, producers, threads, **kw):
    ld = Loader(packed, batch_size=6, size=24, seed=5, user_op=op, producers=producers, threads=threads,
                as_torch=False, with_ids=True, **kw)
    out = []
    for epoch in range(2):
        ld.set_epoch(epoch)
        out += [(x.copy(), ids.copy(), epoch) for x, _, ids in ld]
    return out, ld


@pytest.mark.parametrize("op", OPS[:3], ids=IDS[:3])
def test_loader_with_a_compiled_op_same_batches_any_threads_producers_and_equal_to_the_reference(packed, op):
    ref, ld = _loader_batches(packed, op, 1, 1)
    for producers, threads in ((2, 2), (3, 1)):
        got, _ = _loader_batches(packed, op, producers, threads)
        assert len(got) == len(ref) and all(np.array_equal(a[0], b[0]) for a, b in zip(ref, got))
    recipe = ld.backend.recipe  # the reference: decode, NumPy op, mirror, normalize
    for x, ids, epoch in ref[::3]:
        b = recipe.inputs(ids, epoch)
        raw = decode_crop_resize(b.buffers, b.windows, (24, 24), fallback=True)
        raw = op.reference(raw, op.batch_params(len(ids), b.keys, 24, 24))
        assert np.array_equal(x, normalize(mirror(raw, b.flips)))


def test_loader_compiled_op_equals_the_batch_op_where_they_agree(packed):
    """No flips (train=False): compiled Cutout == ReferenceOp(Cutout) in the Loader (same keyed squares)."""
    a, _ = _loader_batches(packed, Cutout(10, seed=1), 2, 2, train=False)
    b, _ = _loader_batches(packed, ReferenceOp(Cutout(10, seed=1)), 2, 2, train=False)
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(a, b))
    plain, _ = _loader_batches(packed, None, 2, 2, train=False)
    assert not all(np.array_equal(x[0], y[0]) for x, y in zip(a, plain))


class _Refused(ImageOp):
    nparams = 1

    def params(self, n, keys, h, w):
        return np.zeros((n, 1))

    @staticmethod
    def image(img, p):
        table = {"gain": p[0]}  # fine in Numba
        img[0, 0, 0] = table["gain"]
        img[0, 0, 1] = undefined_helper(img)  # noqa: F821  (the line Numba refuses)


def test_a_function_numba_cannot_compile_gives_a_clear_error_naming_the_line(packed):
    with pytest.raises(OpCompileError) as e:
        _Refused().compiled()
    msg = str(e.value)
    assert isinstance(e.value, RecordtoolError)
    assert "_Refused.image" in msg and "test_ops.py" in msg and "undefined_helper(img)" in msg
    assert "line " in msg and "undefined_helper" in msg.split("\n", 1)[1]  # Numba's reason follows
    with pytest.raises(OpCompileError):  # the Loader compiles at construction: no batch is made
        Loader(packed, batch_size=4, size=16, user_op=_Refused(), as_torch=False)


class _Raises(ImageOp):
    nparams = 1

    def params(self, n, keys, h, w):
        return (np.asarray(keys.ids) % 7 == 3).astype(np.float64)[:, None]

    @staticmethod
    def image(img, p):
        if p[0] > 0:
            raise ValueError("bad image")
        img[0, 0, 0] = 1


def test_an_op_that_raises_surfaces_as_op_error_naming_the_samples(packed):
    ld = Loader(packed, batch_size=32, size=16, user_op=_Raises(), as_torch=False, producers=1)
    with pytest.raises(OpError) as e:
        next(iter(ld))
    assert "_Raises" in str(e.value) and "raised an exception" in str(e.value) and "sample ids" in str(e.value)
    assert all(status == -1 for _, status in e.value.failures)
    ld.close()


def test_native_op_arguments_checked_at_the_edge():
    op = Cutout(4)
    b = _batch(3, 8, 8)
    with pytest.raises(ValueError, match="params"):
        apply_op(b, NativeOp(op.compiled().address, np.zeros((2, 4))))
    with pytest.raises(ValueError, match="params"):
        apply_op(b, NativeOp(op.compiled().address, np.zeros((3, 4), np.float32)))
    with pytest.raises(ValueError, match="null"):
        apply_op(b, NativeOp(0, np.zeros((3, 4))))

    class Wrong(Cutout):
        def params(self, n, keys, h, w):
            return np.zeros((n, 2))

    with pytest.raises(ValueError, match=r"expected \(3, 4\)"):
        Wrong(4)(b)


_NO_NUMBA = textwrap.dedent("""
    import sys
    sys.modules["numba"] = None  # as if recordtool[numba] were not installed
    import numpy as np
    import recordtool, recordtool.ops
    from recordtool.errors import OpCompileError
    from recordtool.ops import Cutout, ReferenceOp
    ld = recordtool.Loader(sys.argv[1], batch_size=4, size=16, user_op=ReferenceOp(Cutout(8)), as_torch=False)
    x, _ = next(iter(ld))
    assert x.shape == (4, 3, 16, 16)
    ld.close()
    try:
        recordtool.Loader(sys.argv[1], batch_size=4, size=16, user_op=recordtool.ops.Cutout(8), as_torch=False)
    except OpCompileError as e:
        assert "recordtool[numba]" in str(e), e
        print("clear error")
""")


def test_numba_is_optional_and_imported_lazily(packed):
    p = subprocess.run([sys.executable, "-c", _NO_NUMBA, packed], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "clear error" in p.stdout, p.stderr[-2000:]
    lazy = subprocess.run([sys.executable, "-c", "import sys, recordtool, recordtool.ops, recordtool.loader; "
                           "print('numba' in sys.modules)"], capture_output=True, text=True, timeout=300)
    assert lazy.stdout.strip() == "False", lazy.stderr


@pytest.mark.skipif(not __import__("cuda_emu").available(), reason="no g++ to emulate the CUDA kernels")
@pytest.mark.parametrize("op", OPS, ids=IDS)
@pytest.mark.parametrize("shape", [(5, 29, 23), (1, 16, 16), (3, 7, 300)])
def test_cuda_kernel_source_emulated_on_the_cpu_equals_the_numpy_reference(op, shape, tmp_path_factory):
    """The GPU form of each op (its CUDA C, the launch grid of recordtool.ops.cuda) run on CPU
    threads; tests/gpu/test_user_ops.py runs the same comparison on a GPU."""
    import cuda_emu

    run = cuda_emu.build(op, str(tmp_path_factory.getbasetemp()))
    n, h, w = shape
    b = _batch(n, h, w, seed=h)
    p = op.batch_params(n, BatchKeys(np.arange(n) + 3, 1, 2), h, w)
    assert np.array_equal(run(b.copy(), p), op.reference(b.copy(), p))


def test_without_the_native_extension_the_op_runs_through_ctypes(monkeypatch):
    import warnings

    bufs, sizes = _jpegs(6)
    win = np.array([[0, 0, 50, 50]] * 6)
    flips = np.array([1, 0, 1, 0, 0, 1], bool)
    op = ColorJitter()
    p = op.batch_params(6, None, 20, 20)
    monkeypatch.setattr(cpu, "_native", None)
    monkeypatch.setattr(cpu, "_IMPORT_ERROR", "test", raising=False)
    monkeypatch.setattr(cpu, "_python_decoder", True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = decode_crop_resize(bufs, win, (20, 20))
        ref = op.reference(raw.copy(), p)
        assert np.array_equal(decode_crop_resize(bufs, win, (20, 20), op=op.native(p)), ref)
        got = cpu.decode_crop_resize_normalize(bufs, win, flips, (20, 20), op=op.native(p))
        assert np.array_equal(apply_op(raw.copy(), op.native(p)), ref)
    assert np.array_equal(got, normalize(mirror(ref, flips)))


def test_a_pillow_retried_image_gets_the_op_after_its_retry(monkeypatch):
    """fallback=True: an image libjpeg failed on is decoded by Pillow, then the op runs on it
    (with its own params row), then mirror and normalize — as for every other image."""
    from recordtool.decode import reference as R

    bufs, sizes = _jpegs(4)
    win = np.array([[0, 0, 50, 50]] * 4)
    flips = np.array([0, 1, 0, 1], bool)
    op = ColorJitter()
    p = op.batch_params(4, BatchKeys(np.arange(4), 0, 0), 20, 20)
    real = cpu._native

    class FailsImage1:  # the native decoder as if libjpeg had refused image 1
        def __getattr__(self, name):
            return getattr(real, name)

        def decode_crop_resize(self, *a):
            real.decode_crop_resize(*a)
            return [(1, "forced failure")]

        def decode_crop_resize_normalize(self, *a):
            real.decode_crop_resize_normalize(*a)
            return [(1, "forced failure")]

    monkeypatch.setattr(cpu, "_native", FailsImage1())
    pil = op.reference(R.truth(bufs[1], win[1], 20, 20)[None].copy(), p[1:2])
    u8 = decode_crop_resize(bufs, win, (20, 20), fallback=True, op=op.native(p))
    assert np.array_equal(u8[1], pil[0])
    got = cpu.decode_crop_resize_normalize(bufs, win, flips, (20, 20), fallback=True, op=op.native(p))
    assert np.array_equal(got[1], normalize(mirror(pil, flips[1:2]))[0])


def test_ops_by_name_the_tools_registry():
    from recordtool import ops
    from recordtool.tools import bench
    from recordtool.ops import registry

    assert {"grayscale", "cutout", "jitter"} <= set(ops.names())
    for name in ("colorjitter", "ColorJitter", "color_jitter", "jitter", " Color-Jitter "):
        op = ops.by_name(name)
        assert type(op) is ColorJitter and op.amp == (0.4, 0.4, 0.4)
    assert ops.by_name("RandomGrayscale").p == 0.2 and ops.by_name("cutout").size == 56
    op = ops.by_name("jitter:brightness=0.2, saturation=0", seed=4)
    assert op.amp == (0.2, 0.4, 0.0) and op.seed == 4
    assert ops.by_name("cutout:size=8", size=12).size == 12  # keyword arguments win over the spec
    assert ops.by_name("cutout:size=9") is not ops.by_name("cutout:size=9")  # a new op each time
    with pytest.raises(ValueError, match="unknown op 'blur'.*grayscale"):
        ops.by_name("blur")
    with pytest.raises(ValueError, match="not a number"):
        ops.by_name("cutout:size=big")
    with pytest.raises(ValueError, match="key=value"):
        ops.by_name("cutout:56")
    with pytest.raises(ValueError, match="'cutout' \\(Cutout\\).*radius"):
        ops.by_name("cutout:radius=3")
    with pytest.raises(ValueError, match="must be in"):  # the op's own validation
        ops.by_name("grayscale:p=2")
    compiled, batch = bench.bench_ops("colorjitter")  # bench --op builds its op here
    assert type(compiled) is ColorJitter and batch.op is not None
    with pytest.raises(ValueError, match="already registered"):
        ops.register("jitter", Cutout)
    with pytest.raises(ValueError, match="already registered"):
        ops.register("blur", Cutout, aliases=("ColorJitter",))
    with pytest.raises(TypeError):
        ops.register("nope", dict)

    class Gain(ImageOp):
        nparams = 0

        def __init__(self, level=1, seed=0):
            super().__init__(seed)
            self.level = level

    try:
        ops.register("gain", Gain, aliases=("more-gain",), level=3)
        assert type(ops.by_name("MoreGain")) is Gain and ops.by_name("gain:level=5").level == 5
        assert ops.by_name("gain").level == 3
    finally:
        with registry._lock:  # leave the registry as the other tests find it
            registry._entries.pop("gain", None)
            for k in ("gain", "moregain"):
                registry._names.pop(k, None)


def test_an_ops_fastmath_option_reaches_numba():
    from recordtool.ops.compile import compile_image

    plain = compile_image(Cutout.image, 4, "Cutout.image")
    fast = compile_image(Cutout.image, 4, "Cutout.image", fastmath={"contract"})
    assert fast is not plain and fast is compile_image(Cutout.image, 4, fastmath=frozenset({"contract"}))
    assert fast.kernel.targetoptions.get("fastmath") == {"contract"}
    assert ColorJitter().compiled().kernel.targetoptions.get("fastmath") == {"contract"}

    class Bogus(Cutout):
        fastmath = {"bogus"}

    with pytest.raises(OpCompileError, match="Bogus.image.*\n.*fastmath"):
        Bogus(4).compiled()


# ------------------------------------------------------------------ values checked where an op is made

@pytest.mark.parametrize("make", [
    lambda ops: ops.Cutout(size=float("inf")),
    lambda ops: ops.by_name("cutout:size=1e400"),
    lambda ops: ops.Cutout(size=1e30),
    lambda ops: ops.Cutout(size=7.5),
    lambda ops: ops.Cutout(size=0),
    lambda ops: ops.Cutout(seed="x"),
    lambda ops: ops.Cutout(seed=1.5),
    lambda ops: ops.Cutout(seed=None),
    lambda ops: ops.RandomGrayscale(seed=-1),
    lambda ops: ops.RandomGrayscale(p="0.5"),
    lambda ops: ops.RandomGrayscale(p=float("nan")),
    lambda ops: ops.ColorJitter(contrast=None),
    lambda ops: ops.by_name("jitter:brightness=inf"),
    lambda ops: ops.by_name("cutout", seed="7"),
    lambda ops: ops.register("blur:soft", Cutout),
    lambda ops: ops.register("blur2", Cutout, aliases=("soft:blur",)),
    lambda ops: ops.register(7, Cutout),
], ids=["size-inf", "spec-1e400", "size-1e30", "size-7.5", "batch-size-0", "seed-str", "seed-float", "seed-none",
        "seed-negative", "batch-p-str", "p-nan", "jitter-none", "spec-inf", "by-name-seed-str", "name-colon",
        "alias-colon", "name-int"])
def test_op_values_are_checked_when_the_op_is_made(make):
    """A bad size, amplitude or seed is an ConfigError (a ValueError) when the op is made — not
    an OverflowError, and not a failure at the first batch inside a producer thread; a name
    `by_name` could never reach is refused by `register`."""
    from recordtool import ops
    from recordtool.errors import ConfigError

    before = ops.names()
    with pytest.raises(ConfigError):
        make(ops)
    assert ops.names() == before


def test_whole_float_sizes_and_numpy_seeds_are_taken():
    from recordtool import ops

    assert ops.Cutout(size=32.0).size == 32 and ops.by_name("cutout:size=9.0").size == 9
    assert ops.Cutout(seed=np.uint64(5)).seed == 5 and type(ops.Cutout(seed=np.int32(3)).seed) is int


# ------------------------------------------------------------------ a compiled op indexing past its image

_OUT_OF_BOUNDS = textwrap.dedent("""
    import sys
    import numpy as np
    import recordtool
    from recordtool.errors import OpError, RecordtoolError
    from recordtool.ops import ImageOp
    from recordtool.tools import bench

    class PastTheEnd(ImageOp):
        nparams = 1

        def params(self, n, keys, h, w):
            return np.full((n, 1), float(sys.argv[2]))

        @staticmethod
        def image(img, p):
            img[img.shape[0] + int(p[0]), 0, 0] = 255  # p[0] rows past the last one

    for rows in (0, 1 << 20):  # one row past (the decoder's heap), a megarow past (unmapped)
        sys.argv[2] = str(rows)
        ld = recordtool.Loader(sys.argv[1], batch_size=4, size=16, user_op=PastTheEnd().with_checks(),
                               as_torch=False)
        try:
            next(iter(ld))
        except OpError as e:
            assert isinstance(e, RecordtoolError) and "PastTheEnd" in str(e) and "past the image" in str(e), e
            print("checked", rows)
        finally:
            ld.close()
    # bench --op runs the op checked before it times the unchecked one
    bench.bench_ops = lambda name: (PastTheEnd(), None)
    plain = recordtool.Loader(sys.argv[1], batch_size=4, size=16, as_torch=False, threads=1)
    try:
        bench.op_costs(plain, "past", 2)
    except OpError:
        print("bench stopped")
""")


def test_an_op_indexing_past_its_image_is_an_op_error_when_checked(packed):
    """`op.with_checks()` compiles the op with Numba's bounds checks: an index one row or a
    million rows past the image is an OpError naming the op, not a silent write into the
    decoder's memory or a crash (a child process, so a crash would show as its exit status);
    `bench --op`'s op_costs runs that checked epoch before timing anything."""
    p = subprocess.run([sys.executable, "-c", _OUT_OF_BOUNDS, packed, "0"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:])
    assert p.stdout.split("\n")[:3] == ["checked 0", f"checked {1 << 20}", "bench stopped"], p.stdout


def test_with_checks_is_a_copy_with_its_own_compiled_function():
    op = Cutout(9, seed=2)
    checked = op.with_checks()
    assert checked is not op and checked.checked and not op.checked and checked.size == 9 and checked.seed == 2
    assert checked.compiled() is not op.compiled() and checked.compiled() is Cutout(9).with_checks().compiled()
    assert checked.compiled().kernel.targetoptions.get("boundscheck") is True
    from recordtool.errors import ConfigError

    with pytest.raises(ConfigError):
        op.with_checks("yes")


class _ParamsRaise(ImageOp):
    nparams = 1

    def params(self, n, keys, h, w):
        raise KeyError("no such draw")

    @staticmethod
    def image(img, p):
        img[0, 0, 0] = 1


def _batch_op_raises(batch):
    raise ZeroDivisionError("user code")


@pytest.mark.parametrize("op,name,cause", [(_batch_op_raises, "user_op _batch_op_raises raised ZeroDivisionError",
                                            ZeroDivisionError),
                                           (_ParamsRaise(), "_ParamsRaise.params raised KeyError", KeyError),
                                           (ReferenceOp(_ParamsRaise()), "user_op ReferenceOp raised KeyError",
                                            KeyError)])
def test_python_code_of_an_op_that_raises_is_an_op_error_naming_the_op(packed, op, name, cause):
    ld = Loader(packed, batch_size=4, size=16, user_op=op, as_torch=False, producers=1, threads=1, with_ids=True)
    with pytest.raises(OpError) as e:
        next(iter(ld))
    ids = [int(i) for i in ld.batch_ids(0)[0]]
    assert name in str(e.value) and f"sample ids {ids}, epoch 0" in str(e.value)
    assert isinstance(e.value.__cause__, cause) and e.value.failures == []
    ld.close()

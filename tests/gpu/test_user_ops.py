"""User ops on the GPU: keyed and batch ops, their results checked, compiled ops' CUDA kernels
against their NumPy reference, a pass queued in one call, and nvrtc's refusals."""
import numpy as np
import pytest

from .device import cupy, needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]


def test_cuda_keyed_user_op_same_for_any_producers_and_normalised_by_the_kernel(packed_mix):
    """Keyed ops get their keys with the call (no race between producers); the uint8 batch the
    op returns is normalised by the resize kernel at 1:1 into the output ring — the same values
    as normalising it on the host."""
    from recordtool.loader import Loader
    from recordtool.ops import Cutout, ReferenceOp

    kw = dict(batch_size=8, size=48, seed=2, split="gpu", as_torch=False, dtype="float32", layout="NCHW",
              user_op=ReferenceOp(Cutout(16)))  # array code on the CuPy batch
    ref = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", producers=1, **kw)]
    got = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", producers=4, **kw)]
    assert all(np.array_equal(a, b) for a, b in zip(ref, got))
    raw = Loader(packed_mix, device="cuda", producers=1, **dict(kw, mean=(0, 0, 0), std=(1 / 255,) * 3))
    x = cupy.asnumpy(next(iter(raw))[0])
    assert np.abs(x - np.rint(x)).max() < 1e-3 and x.min() > -1e-3 and x.max() < 255.001  # pixels back
    assert (x == 0).all(axis=1).any()  # the cutout squares are there


@pytest.mark.parametrize("returns", ["none", "numpy", "float"])
def test_cuda_user_op_returning_something_else_than_its_batch_is_named(packed_mix, returns):
    """On the GPU too each batch checks what the op returned: the CuPy uint8 batch (or one of its
    kind, dtype and shape); a host array, None or a float array is an OpResultError naming the op."""
    from recordtool.errors import OpResultError
    from recordtool.loader import Loader

    def make(batch):
        return {"none": None, "numpy": cupy.asnumpy(batch), "float": batch.astype(cupy.float32)}[returns]

    ld = Loader(packed_mix, device="cuda", batch_size=8, size=48, as_torch=False, user_op=make)
    with pytest.raises(OpResultError, match="make"):
        next(iter(ld))
    ld.close()
    ok = Loader(packed_mix, device="cuda", batch_size=8, size=48, as_torch=False, layout="NHWC", mean=(0, 0, 0),
                std=(1, 1, 1), user_op=lambda b: cupy.full_like(b, 255))  # a new CuPy batch: normalised
    assert np.all(cupy.asnumpy(next(iter(ok))[0]) == 1.0)
    ok.close()


def _image_ops():
    # the GPU form needs no Numba (only the CPU form is compiled by it)
    from recordtool.ops import ColorJitter, Cutout, RandomGrayscale

    return [RandomGrayscale(0.5), Cutout(9), ColorJitter(0.4, 0.4, 0.4), ColorJitter(0.9, 0.0, 2.0, seed=3)]


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


class _Invert:
    """A parameter-free compiled op (nparams = 0): its pass uploads no params."""

    @staticmethod
    def make():
        from recordtool.ops import ImageOp

        class Invert(ImageOp):
            nparams = 0
            cuda_name = "rt_invert"
            cuda_source = r"""extern "C" __global__ void rt_invert(unsigned char* b, int n, int h, int w,
                const double* p, int k) {
                long long i = (long long)blockIdx.y * h * w * 3 + ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 3;
                if ((blockIdx.x * blockDim.x + threadIdx.x) >= h * w) return;
                b[i] = 255 - b[i]; b[i + 1] = 255 - b[i + 1]; b[i + 2] = 255 - b[i + 2];
            }"""

            def params(self, n, keys, h, w):
                return np.zeros((n, 0))

            @staticmethod
            def image(img, p):
                img[...] = 255 - img

            def reference(self, batch, params):
                batch[...] = 255 - batch
                return batch

        return Invert()


@pytest.mark.parametrize("dtype, layout", [("float32", "NCHW"), ("float16", "NHWC")])
def test_cuda_user_op_pass_queued_in_one_call_equals_its_cupy_calls(packed_mix, monkeypatch, dtype, layout):
    """A user op's pass (params and samples up, the op's kernel, the normalising kernel, the
    event) queued in one GIL-free call (StreamWork, _nvsubmit.queue) gives the batches of the
    same CuPy calls made one by one (GPUBackend.native_queue = False): compiled ops with and
    without params, a batch op; the parameter-free op equals its host reference too."""
    from recordtool.decode.gpu.backend import GPUBackend
    from recordtool.decode.gpu.work import native_available
    from recordtool.loader import Loader
    from recordtool.ops import ColorJitter, Cutout, ReferenceOp

    assert native_available()
    kw = dict(batch_size=8, size=48, seed=4, split="gpu", as_torch=False, dtype=dtype, layout=layout, producers=2)
    for op in (ColorJitter(0.5, 0.5, 0.5), _Invert.make(), ReferenceOp(Cutout(12))):
        native = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", user_op=op, **kw)]
        with monkeypatch.context() as m:
            m.setattr(GPUBackend, "native_queue", False)
            calls = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", user_op=op, **kw)]
        assert len(native) == len(calls) > 1
        assert all(np.array_equal(a, b) for a, b in zip(native, calls)), type(op).__name__
    inv = _Invert.make()
    ref = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", user_op=ReferenceOp(inv), **kw)]
    got = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", user_op=inv, **kw)]
    assert all(np.array_equal(a, b) for a, b in zip(ref, got))


def test_cuda_kernel_that_nvrtc_refuses_is_a_clear_error():
    from recordtool.errors import OpCompileError
    from recordtool.ops import Cutout
    from recordtool.ops.cuda import kernel

    class Broken(Cutout):
        cuda_source = Cutout.cuda_source.replace("q[0] = 0;", "q[0] = undefined_name;")

    with pytest.raises(OpCompileError, match="rt_cutout of Broken"):
        kernel(Broken(4))

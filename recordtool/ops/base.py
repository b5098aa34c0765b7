"""`ImageOp`: a per-image user op written in plain Python, run at native speed.

Three parts, so the CPU, the GPU and the tests agree on every value:

- `params(n, keys, h, w)` (NumPy, once per batch): everything random about each image — the
  keyed draws of `BatchKeys` (a pure function of seed, epoch, sample id) turned into an (n, k)
  float64 array. Computed the same way whatever the device, threads or producers.
- `image(img, p)` (a static function, plain Python): one (h, w, 3) uint8 RGB image edited in
  place from its params row. Compiled by Numba (recordtool.ops.compile) and called by the
  native decode threads on each image while it is in cache — after the resize, before mirror
  and normalize — without the GIL.
- `cuda_source` / `cuda_name`: the same op as a CUDA C kernel over the whole uint8 batch, one
  launch per batch on the GPU loader (`extern "C" __global__ void NAME(unsigned char* batch,
  int n, int h, int w, const double* params, int k)`); `cuda_block_per_image` picks the grid.

`reference(batch, params)` is its NumPy reference (tests; `ReferenceOp` runs it as a batch op
without Numba). An ImageOp is also a batch op (`op(batch, keys)`), so it works wherever
`user_op=` takes one.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from .batch import KeyedOp, _xp


class ImageOp(KeyedOp):
    """Base of compiled per-image ops; subclasses set `nparams` and define `params`, `image`,
    `reference` and (for device="cuda") `cuda_source`/`cuda_name`.

    The op object holds only its configuration: producers call it concurrently, and all
    per-batch state is in the params array.

    Args:
        seed: mixed into the op's draws (beside the loader's seed in the keys).
    """

    nparams = 0
    fastmath: bool | frozenset = False  # Numba's fastmath for `image` (True, or LLVM flags such as {"contract"})
    # Numba's bounds checks on `image` (see `with_checks`): False is full speed, and an index
    # past the image writes into the decoder's memory or kills the process
    checked = False
    cuda_source: str | None = None
    cuda_name: str | None = None
    cuda_block_per_image = False  # True: one block of 256 threads per image (per-image reductions)
    reference_on_device = False  # True: `reference` is array code that also takes a CuPy batch

    def params(self, n: int, keys, h: int, w: int) -> np.ndarray:
        """float64 (n, nparams): each image's parameters from its keyed draws (`self.draws`)."""
        raise NotImplementedError

    @staticmethod
    def image(img, p) -> None:
        """Edit one uint8 (h, w, 3) image in place from its params row `p` (compiled by Numba)."""
        raise NotImplementedError

    def reference(self, batch: np.ndarray, params: np.ndarray) -> np.ndarray:
        """NumPy reference over a uint8 NHWC batch (in place; returned)."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        return type(self).__name__

    def batch_params(self, n: int, keys, h: int, w: int) -> np.ndarray:
        """`params`, checked: C-contiguous float64 (n, nparams)."""
        p = np.ascontiguousarray(self.params(n, keys, h, w), np.float64)
        if p.shape != (n, self.nparams):
            raise ValueError(f"{self.name}.params gave shape {p.shape}, expected ({n}, {self.nparams})")
        return p

    def with_checks(self, checked: bool = True) -> "ImageOp":
        """A copy of this op whose `image` is compiled with Numba's bounds checks (`checked`): an
        index past the image raises — the Loader's OpError naming the op — instead of writing
        into the decoder's memory (silently, one row past) or crashing the process (farther).
        The checks cost speed; the tests and `recordtool bench --op` run ops checked. Use it
        while writing an op."""
        import copy

        if not isinstance(checked, (bool, np.bool_)):
            raise ConfigError(f"{self.name}: checked must be True or False, not {checked!r}")
        op = copy.copy(self)
        op.checked = bool(checked)
        return op

    def compiled(self):
        """The Numba-compiled C function (compiled on first use, cached per class and mode)."""
        from .compile import compile_image

        return compile_image(type(self).image, self.nparams, f"{self.name}.image", fastmath=self.fastmath,
                             checked=self.checked)

    def native(self, params: np.ndarray):
        """This op with a batch's params, as the CPU decoder runs it."""
        from ..decode.cpu import NativeOp

        return NativeOp(self.compiled().address, params, self.name)

    def prepare(self, gpu_id: int | None = None) -> None:
        """Compile the op for the device that runs it — its Numba function for the CPU's native
        decode threads (gpu_id None), else its CUDA kernel on GPU `gpu_id` — so that a refused op
        fails when the Loader is made (OpCompileError), not in a batch. The Loader calls it and
        hands the op to its backend (decode.backend.CompiledOp)."""
        if gpu_id is None:
            self.compiled()
            return
        import cupy

        from .cuda import kernel

        with cupy.cuda.Device(gpu_id):
            kernel(self)

    def cuda_launch(self, batch, params_dev) -> tuple:
        """(kernel, grid, block, args) of the op's CUDA kernel over a C-contiguous uint8 NHWC CuPy
        batch with its params on the device (ops.cuda.call): what the GPU backend's normalising
        pass queues."""
        from .cuda import call

        return call(self, batch, params_dev)

    def __call__(self, batch, keys=None):
        """The op as a batch op on a uint8 NHWC batch (numpy: the compiled function on the native
        pool; CuPy: the CUDA kernel, one launch)."""
        n, h, w = batch.shape[:3]
        p = self.batch_params(n, keys, h, w)
        if _xp(batch) is not np:
            from .cuda import launch

            launch(self, batch, p)
            return batch
        from ..decode.cpu import apply_op

        return apply_op(batch, self.native(p))


class ReferenceOp(KeyedOp):
    """An ImageOp's NumPy reference as a batch op — the op as array code on the whole batch, as
    it is written without Numba (`recordtool bench --op` measures it beside the compiled op).
    A CuPy batch stays on the GPU when the op's reference takes one (`reference_on_device`),
    else it goes to the host and back.

    Args:
        op: the ImageOp.
    """

    def __init__(self, op: ImageOp):
        super().__init__(op.seed)
        self.op = op

    def __call__(self, batch, keys=None):
        n, h, w = batch.shape[:3]
        p = self.op.batch_params(n, keys, h, w)
        if _xp(batch) is np or self.op.reference_on_device:
            return self.op.reference(batch, p)
        import cupy

        batch[...] = cupy.asarray(self.op.reference(cupy.asnumpy(batch), p))
        return batch

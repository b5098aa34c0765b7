"""The CPU batcher: a batch's JPEGs → fused native decode + crop + resize + mirror + normalize
straight into a recycled output array — with a compiled per-image op (recordtool.ops) inside
that pass; with a batch user op, uint8 first, then the op, then normalize."""
from __future__ import annotations

import collections
import ctypes
import functools
import threading
import time
import types

import numpy as np

from ..decode import cpu
from ..errors import ConfigError, OpError, OpResultError, RecordtoolError
from .recipe import ProducedBatch, Recipe


class HostRing:
    """Host output batches allocated once and recycled, like the GPU's OutputRing: a slot comes
    back when the last array viewing it (numpy, or a torch tensor made by from_numpy) dies.
    Every batch a fresh 150 MB array would cost page faults on each of its pages (glibc maps
    such blocks anew each time); a held slot is never reused — when all are held the batch is a
    new array and counts in `spills`.

    Args:
        shape: the full batch shape.
        dtype: element type.
        slots: batches alive at once.
    """

    def __init__(self, shape, dtype, slots: int):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        ring = self

        class Owner(ctypes.c_uint8 * nbytes):
            __slots__ = ("k",)

            def __del__(self):
                ring._give_back(self.k)

        self._owner = Owner
        self._mem = [np.empty(nbytes, np.uint8) for _ in range(slots)]
        for m in self._mem:
            m.fill(0)  # touch every page now, not in the first epoch
        self._free = collections.deque(range(slots))
        self._lock = threading.Lock()
        self.spills = 0

    @property
    def slots(self) -> int:
        return len(self._mem)

    @property
    def free(self) -> int:
        return len(self._free)

    def acquire(self, n: int) -> np.ndarray:
        shape = (n,) + self.shape[1:]
        with self._lock:
            k = self._free.popleft() if self._free else None
            if k is None:
                self.spills += 1
        if k is None:
            return np.empty(shape, self.dtype)
        owner = self._owner.from_buffer(self._mem[k])
        owner.k = k
        return np.frombuffer(owner, self.dtype, int(np.prod(shape))).reshape(shape)

    def _give_back(self, k: int) -> None:
        with self._lock:
            self._free.append(k)


class CPUBatcher:
    """Makes the batches of a CPU Loader.

    Args:
        recipe: what a batch is (windows, flips, labels from seed, epoch and ids) and its
            output (recipe.output: size, normalisation, dtype, layout, memory format).
        threads: native decode threads per call.
        user_op: optional op on the uint8 NHWC batch before normalisation (see ops.batch), or a
            compiled per-image op (recordtool.ops.ImageOp) run inside the fused pass.
        slots: output batches alive at once (queued + being made + held by the consumer).
        max_batch: images per batch at most.
        producers: producer slots; each gets its own native thread pool.
    """

    def __init__(self, recipe: Recipe, *, threads: int, user_op, slots: int, max_batch: int, producers: int = 1):
        self.recipe, self.threads = recipe, threads
        spec = recipe.output
        self.user_op = user_op
        self.image_op = image_op(user_op)
        if self.image_op is not None:
            self.image_op.compiled()  # compile now: a refused function fails the Loader, not a batch
        h, w = spec.size
        self.ring = HostRing(spec.buffer_shape(max_batch), spec.storage_dtype, slots)
        # producer slot → its uint8 batch for the user op (each producer writes only its own)
        self._scratch = [np.empty((max_batch, h, w, 3), np.uint8) for _ in range(producers)] \
            if user_op is not None and self.image_op is None else []
        # one native pool per producer slot: batches of different producers decode at the same
        # time, so one batch's tail (its last, largest images) overlaps the next one's start
        self._pools = [cpu.new_pool_id() for _ in range(producers)]
        ix = recipe.ds.index
        try:
            for pool in self._pools:
                cpu.reserve(ix.width, ix.height, threads, pool)  # its threads' decode buffers, now
        except BaseException:  # ThreadStartError: the pool stopped what it started; its id goes back
            self.close()
            raise

    def __call__(self, ids, epoch: int, slot: int, drawn: tuple | None = None):
        """The batch of these ids in this epoch, made by producer `slot`; drawn: its (windows,
        flips) when the stream drew them (Recipe.draws)."""
        t0 = time.perf_counter()
        b = self.recipe.inputs(ids, epoch, drawn)
        t1 = time.perf_counter()
        errors: list = []
        out = self.ring.acquire(len(ids))
        spec = self.recipe.output
        pool = self._pools[slot]
        if self.user_op is None or self.image_op is not None:
            op = None
            if self.image_op is not None:
                h, w = spec.size
                op = self.image_op.native(op_params(self.image_op, len(ids), b.keys, h, w))
            try:
                cpu.decode_crop_resize_normalize(b.buffers, b.windows, b.flips, spec.size, spec.mean, spec.std,
                                                 spec.buffer_layout, spec.dtype, out=out, threads=self.threads,
                                                 on_error="skip", fallback=True, errors=errors, pool=pool, op=op)
            except OpError as e:
                raise OpError(e.failures, e.name,
                              f" (sample ids {[int(ids[i]) for i, _ in e.failures[:5]]}, epoch {epoch})") from None
            t2 = t3 = time.perf_counter()
        else:
            raw = cpu.decode_crop_resize(b.buffers, b.windows, spec.size, self.threads, self._scratch[slot][:len(ids)],
                                         on_error="skip", fallback=True, errors=errors, pool=pool)
            raw[b.flips] = raw[b.flips, :, ::-1]  # the user sees the batch as training will
            t2 = time.perf_counter()
            raw = call_user_op(self.user_op, raw, b.keys)
            t3 = time.perf_counter()
            cpu.normalize(raw, spec.mean, spec.std, spec.buffer_layout, spec.dtype, threads=self.threads, out=out)
        return ProducedBatch(out, b.labels, errors, {"inputs": t1 - t0, "decode": t2 - t1, "user_op": t3 - t2,
                                                     "normalize": time.perf_counter() - t3})

    def close(self) -> None:
        for pool in self._pools:
            cpu.release_pool_id(pool)
        self._pools = []
        self._scratch = []


def image_op(op):
    """`op` when it is a compiled per-image op (recordtool.ops.ImageOp), else None."""
    if op is None:
        return None
    from ..ops import ImageOp

    return op if isinstance(op, ImageOp) else None


def _where(keys) -> str:
    """Which batch an op failed on, for OpError: its first sample ids and epoch."""
    ids = [int(i) for i in keys.ids[:5]]
    more = f" (+{len(keys.ids) - 5} more)" if len(keys.ids) > 5 else ""
    return f" on the batch of sample ids {ids}{more}, epoch {keys.epoch}"


def op_params(op, n: int, keys, h: int, w: int):
    """A compiled op's params for a batch (ImageOp.batch_params): its `params` is the op's own
    Python code, so an exception there is an OpError naming the op and the batch (the original
    as its cause), not a bare error out of a producer thread."""
    try:
        return op.batch_params(n, keys, h, w)
    except RecordtoolError:
        raise
    except Exception as e:
        raise OpError([], f"{op.name}.params", _where(keys), raised=e) from e


def call_user_op(op, batch, keys):
    """op(batch, keys) for keyed ops (ops.batch.KeyedOp or `keyed = True`), else op(batch);
    what it returned, checked against the contract (OpResultError): an array of the batch's
    own kind (NumPy, or CuPy on the GPU), uint8, of the batch's shape — usually the batch itself,
    edited in place. Anything else would be normalised into a wrong batch, or fail later with a
    message about something else. An exception the op raises is an OpError naming the op and
    the batch, with the original as its cause (recordtool's own errors pass as they are)."""
    try:
        out = op(batch, keys) if getattr(op, "keyed", False) else op(batch)
    except RecordtoolError:
        raise
    except Exception as e:
        raise OpError([], f"user_op {_op_name(op)}", _where(keys), raised=e) from e
    if out is batch:
        return out
    name = _op_name(op)
    if out is None:
        raise OpResultError(f"user_op {name} returned None: a user op returns the batch it was given (edited in "
                            "place) or a new uint8 array of its shape")
    if not isinstance(out, type(batch)) or out.dtype != np.uint8 or tuple(out.shape) != tuple(batch.shape):
        got = f"{type(out).__module__}.{type(out).__qualname__}"
        if hasattr(out, "shape") and hasattr(out, "dtype"):
            got += f" of {out.dtype} {tuple(out.shape)}"
        raise OpResultError(f"user_op {name} returned a {got}; a user op returns the uint8 NHWC batch it was given "
                            f"({type(batch).__module__}.{type(batch).__qualname__} of uint8 {tuple(batch.shape)}), "
                            "edited in place, or a new array of that type, dtype and shape")
    return out


def _op_name(op) -> str:
    return getattr(op, "__qualname__", None) or type(op).__qualname__


# what a torchvision transform a user passes as user_op is in recordtool (by class name)
_TORCHVISION_EQUIVALENTS = {
    "ColorJitter": "recordtool.ops.ColorJitter(brightness=, contrast=, saturation=) (compiled, "
                   "needs recordtool[numba])",
    "RandomErasing": "recordtool.ops.Cutout(size=) (one square of zeros per image; without Numba "
                     "recordtool.ops.ReferenceOp(recordtool.ops.Cutout(size=)))",
    "RandomGrayscale": "recordtool.ops.RandomGrayscale(p=) (without Numba "
                       "recordtool.ops.ReferenceOp(recordtool.ops.RandomGrayscale(p=)))",
    "Grayscale": "recordtool.ops.RandomGrayscale(p=1.0)",
}
_LOADER_DOES = ("RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip", "Normalize", "ToTensor",
                "ToImage", "ToDtype", "ConvertImageDtype", "PILToTensor", "ToPureTensor")


def _torchvision_advice(op) -> list:
    """For each transform in `op` (a Compose's members in turn), what to pass instead."""
    members = getattr(op, "transforms", None)
    if type(op).__name__ == "Compose" and isinstance(members, (list, tuple)):
        return [a for m in members for a in _torchvision_advice(m)]
    name = type(op).__name__
    if name in _TORCHVISION_EQUIVALENTS:
        return [f"for {name}, {_TORCHVISION_EQUIVALENTS[name]}"]
    if name in _LOADER_DOES:
        return [f"{name} the Loader does itself (train=True: RandomResizedCrop and flips; train=False: resize and "
                "centre crop; size=, mean=, std=, dtype=)"]
    return []


def _is_torch_module(op) -> bool:
    """An instance of torch.nn.Module, told without importing torch."""
    return any(c.__name__ == "Module" and c.__module__ == "torch.nn.modules.module" for c in type(op).__mro__)


def check_user_op(op):
    """`op` if the Loader can run it as a user op, else ConfigError saying what to pass instead.

    Refused: what is not callable; torchvision transforms (and functions of
    torchvision.transforms) — they work on PIL images and torch tensors: torchvision's v2
    transforms hand a NumPy batch back untouched, a silent no-op, others fail inside; and any
    torch.nn.Module, which takes tensors, not the uint8 NHWC NumPy / CuPy batch a user op gets."""
    if op is None:
        return None
    if not callable(op):
        raise ConfigError(f"user_op must be callable (op(batch) or a recordtool.ops op), not {op!r}")
    target = op
    while isinstance(target, functools.partial):
        target = target.func
    plain = isinstance(target, (types.FunctionType, types.BuiltinFunctionType, types.MethodType))
    module = (getattr(target, "__module__", None) if plain else type(target).__module__) or ""
    what = _op_name(target) if plain else type(target).__qualname__
    instead = ("A user op is recordtool.ops.ColorJitter, Cutout or RandomGrayscale (ReferenceOp(op) without Numba), or "
               "a function op(batch) that edits the uint8 NHWC batch (NumPy; CuPy on device='cuda') and returns "
               "it; or apply the transform to the Loader's output tensors in the training loop")
    if module == "torchvision" or module.startswith("torchvision."):
        advice = "; ".join(dict.fromkeys(_torchvision_advice(getattr(target, "__self__", target))))
        raise ConfigError(f"user_op={what} ({module}) is a torchvision transform: torchvision works on torch "
                          "tensors and PIL images, and on the Loader's NumPy batch its v2 transforms change nothing "
                          "(a silent no-op) while others fail. " + (f"Instead: {advice}. " if advice else "")
                          + instead + ".")
    if _is_torch_module(target) or _is_torch_module(getattr(target, "__self__", None)):  # a module, or its forward
        raise ConfigError(f"user_op={what} is a torch.nn.Module, which takes torch tensors; a user op gets the "
                          "uint8 NHWC batch before normalisation as a NumPy array (CuPy on device='cuda'). "
                          + instead + ".")
    return op

"""CPU fused decode → crop → resize (→ mirror → normalize), batched, on the native thread pool;
`normalize` and `mirror` on their own for a decoded uint8 batch, and the eval transform.

Without the native extension the first decode raises NativeDecoderMissing with the fix: a
training script must not run on a slower decoder because an install went wrong and a warning
scrolled by. The Python decoder of decode/reference.py (PyTurboJPEG + Pillow, same API and results
within 45 dB) runs only after the program asks for it with allow_python_decoder()."""
from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import DecodeError, NativeDecoderMissing, OnError, OpError, ConfigError, on_error as _on_error
from ..format.jpeg import DEFAULT_MAX_PIXELS  # noqa: F401  (callers import it from here too)
from ..util import ForkLock, cores  # noqa: F401  (cpu.cores: the default thread count)
from . import reference
from .reference import refusal
from .spec import MAX_OUTPUT_SIDE  # noqa: F401  (callers import it from here too)
from .spec import IMAGENET_MEAN, IMAGENET_STD, out_dtype, scale_bias
from .windows import center_windows

try:
    from .. import _native
except ImportError as e:  # extension not built: NativeDecoderMissing at the first decode
    _native = None
    _IMPORT_ERROR = str(e)

_python_decoder = False  # allow_python_decoder() was called


def native_available() -> bool:
    return _native is not None


def allow_python_decoder(allow: bool = True) -> None:
    """Opt in (for this process) to the Python decoder where the native one is not built:
    PyTurboJPEG + Pillow, the same API and results within 45 dB, slower (a full decode, then
    crop and resize in Python, where the native one decodes only the window). Without this
    call a missing native decoder is NativeDecoderMissing at the first decode. It warns when
    it takes effect, so the slow path shows in the program's output. Processes started with
    "spawn" (pack's process engine, DataLoader workers) do not inherit it: call it in them too.
    No effect where the native decoder is there."""
    global _python_decoder
    if not isinstance(allow, bool):
        raise ConfigError(f"allow_python_decoder(allow=): True or False, not {allow!r}")
    _python_decoder = allow
    if _python_decoder and _native is None:
        warnings.warn(f"recordtool: the native decoder is not built ({_IMPORT_ERROR}); decoding with the "
                      "Python decoder (PyTurboJPEG + Pillow), about 3x slower", RuntimeWarning, stacklevel=2)


def require_native() -> None:
    """NativeDecoderMissing unless the native decoder is there or the Python one was allowed."""
    if _native is None and not _python_decoder:
        raise NativeDecoderMissing(
            f"recordtool's native decoder (recordtool._native) is not in this install ({_IMPORT_ERROR}). "
            "Fix: pip install --force-reinstall a platform wheel of recordtool (it carries the decoder "
            "and libjpeg-turbo), or rebuild from source with a C++ compiler and libjpeg62-turbo-dev installed; "
            "or call recordtool.decode.allow_python_decoder() to decode about 3x slower in Python")


_pool_lock = ForkLock()  # a producer may give its pool back (close) while another process forks
_free_pools = list(range(1, 64))  # native pool ids not in use (0 is the default pool)
_free_background = list(range(64, 128))  # pools whose threads run at BACKGROUND_NICE
_shared_pools = itertools.count()

# The nice increment of background pools' threads: a GPU loader's CPU share, which helps the
# engines only while a core is free and must give it up to the training loop when both want it.
BACKGROUND_NICE = 10


def new_pool_id(background: bool = False) -> int:
    """A native thread-pool id for a caller that decodes while others do: each pool serves one
    call at a time, so concurrent callers (the producers of a Loader) get their own threads
    instead of queueing. Give it back with release_pool_id: a pool's threads and buffers live
    for the process, so ids are reused rather than new pools made (past 63 in use, pools are
    shared in turn). background: a pool whose threads run at BACKGROUND_NICE (never handed to
    a normal caller: a thread's nice, once raised, may not come down again)."""
    with _pool_lock:
        free, first = (_free_background, 64) if background else (_free_pools, 1)
        pool = free.pop() if free else first + next(_shared_pools) % 63
    if background and _native is not None:
        _native.set_pool_nice(pool, BACKGROUND_NICE)
    return pool


def release_pool_id(pool: int) -> None:
    """The pool is free for the next new_pool_id of its kind (its threads stay, idle)."""
    with _pool_lock:
        free = _free_background if pool >= 64 else _free_pools
        if 1 <= pool <= 127 and pool not in free:
            free.append(pool)


def reserve(widths, heights, threads: int, pool: int = 0) -> None:
    """Size each decode thread's buffer for the largest of these images now, so resident memory
    does not grow later as threads meet larger images. No-op without the native decoder."""
    if _native is not None and len(widths):
        big = int((np.asarray(widths, np.int64) * np.asarray(heights, np.int64)).max()) * 3
        _native.reserve(big, int(threads), int(pool))


@dataclass(frozen=True)
class NativeOp:
    """A compiled per-image op as the decoder runs it (made by recordtool.ops): the address of
    `int32 op(uint8* img, int64 h, int64 w, int64 stride, const double* params)` (a Numba cfunc,
    kept alive by its maker) and this batch's params, row n for image n. It runs on each image
    after the resize, before mirror and normalize (failed images too: zeros).

    Args:
        address: the C function pointer.
        params: float64 (N, k), C-contiguous.
        name: for error messages.
    """

    address: int
    params: np.ndarray
    name: str = "user op"

    def checked(self, n: int) -> "NativeOp":
        p = self.params
        if not (isinstance(p, np.ndarray) and p.dtype == np.float64 and p.ndim == 2 and p.shape[0] == n
                and p.flags.c_contiguous):
            raise ValueError(f"{self.name}: params must be C-contiguous float64 ({n}, k), got "
                             f"{getattr(p, 'dtype', type(p))} {getattr(p, 'shape', '')}")
        if not self.address:
            raise ValueError(f"{self.name}: null op address")
        return self

    def rows(self, i: int, j: int) -> "NativeOp":
        return NativeOp(self.address, np.ascontiguousarray(self.params[i:j]), self.name)

    def check(self, status: np.ndarray) -> None:
        bad = np.nonzero(status)[0]
        if len(bad):
            raise OpError([(int(i), int(status[i])) for i in bad], self.name)


def apply_op(batch: np.ndarray, op: NativeOp, threads: int | None = None, pool: int = 0) -> np.ndarray:
    """Run a compiled per-image op on each image of a uint8 NHWC batch, in place, on the native
    pool (or through ctypes without the extension); OpError if it fails on any image."""
    if batch.ndim != 4 or batch.shape[3] != 3 or batch.dtype != np.uint8 or not batch.flags.c_contiguous:
        raise ValueError(f"batch must be C-contiguous uint8 (N, H, W, 3), got {batch.dtype} {batch.shape}")
    n = batch.shape[0]
    op = op.checked(n)
    status = np.zeros(n, np.int32)
    if n == 0:
        return batch
    if _native is not None:
        _native.apply_op(batch, int(op.address), op.params, status, int(threads or cores()), int(pool))
    else:
        status[:] = apply_op_reference(batch, op)
    op.check(status)
    return batch


def apply_op_reference(batch: np.ndarray, op: NativeOp) -> np.ndarray:
    """Python reference of the native op call (and the path without the extension): the same C
    function through ctypes, image by image, with the ABI's arguments; returns the statuses."""
    import ctypes

    fn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(ctypes.c_uint8), ctypes.c_int64, ctypes.c_int64,
                          ctypes.c_int64, ctypes.POINTER(ctypes.c_double))(int(op.address))
    n, h, w = batch.shape[:3]
    status = np.zeros(n, np.int32)
    for i in range(n):
        img, par = batch[i], op.params[i]
        status[i] = fn(img.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), h, w, w * 3,
                       par.ctypes.data_as(ctypes.POINTER(ctypes.c_double)))
    return status


class _StillFailed(Exception):
    """The Pillow retry did not help; str() is the reason for the failure list."""


def _pillow_retry(data, window, ow: int, oh: int, max_pixels: int, reason: str) -> np.ndarray:
    """`fallback=True`: Pillow full decode → crop → resize of one image libjpeg failed on —
    unless the image is refused for its cost (then Pillow must not pay it either)."""
    if refusal(data, max_pixels):
        raise _StillFailed(reason)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # Pillow's truncation warnings → failure
            return reference.truth(data, window, ow, oh)
    except Exception as e:
        raise _StillFailed(f"{reason}; Pillow fallback: {type(e).__name__}: {e}") from None


def decode_crop_resize(buffers, windows, size=(224, 224), threads: int | None = None, out=None,
                       on_error: OnError | str = "raise", fallback: bool = False,
                       max_pixels: int = DEFAULT_MAX_PIXELS, errors: list | None = None,
                       scale_margin: float = reference.SCALE_MARGIN, pool: int = 0,
                       op: NativeOp | None = None) -> np.ndarray:
    """Decode each JPEG's crop window and resize it to `size` (h, w): uint8 (N, h, w, 3) RGB.

    Args:
        buffers: JPEG bytes-likes (bytes, memoryviews into shards, numpy arrays).
        windows: (N, 4) (y, x, h, w) in source pixels (int, or float for the eval transform).
        size: output (h, w).
        threads: native decode threads (default: cores).
        out: a preallocated C-contiguous uint8 (N, h, w, 3) array (e.g. pinned memory) to fill.
        on_error: an image that fails — "raise" (DecodeError after the whole batch), "warn" (a
            warning, slot zero) or "skip" (slot zero). Failures are appended to `errors` as
            (index, reason) when a list is given.
        fallback: retry a failed image with Pillow (full decode + crop + resize) before it counts
            as failed — for files libjpeg refuses but Pillow takes.
        max_pixels: images declaring more pixels fail (decompression bombs).
        scale_margin: DCT scaling (1/4, 1/2) is used only while the scaled window stays ≥
            margin × size (1.0 = fastest; 1.1 keeps PSNR ≥ 39.8 dB against Pillow's crop+resize
            on real photos, README "Fidelity").
        pool: native thread-pool id; callers decoding at the same time should use different ids.
            -1: decode on the calling thread, no pool (`threads` unused) — for many threads each
            decoding a few images at once (pack's transcoding workers), which would otherwise
            queue on one pool (a pool serves one call at a time).
        op: a compiled per-image op run by the decode thread on each resized image (failed ones
            too, and Pillow-retried ones after their retry); OpError when it fails on any.
    """
    on_error = _on_error(on_error)
    n = len(buffers)
    op = op.checked(n) if op is not None else None
    oh, ow = int(size[0]), int(size[1])
    if not (0 < oh <= MAX_OUTPUT_SIDE and 0 < ow <= MAX_OUTPUT_SIDE):
        raise ValueError(f"output size {oh}x{ow}: each side must be in 1..{MAX_OUTPUT_SIDE}")
    win = np.ascontiguousarray(np.asarray(windows, dtype=np.float64).reshape(n, 4))
    if out is None:
        out = np.empty((n, oh, ow, 3), np.uint8)
    elif out.shape != (n, oh, ow, 3) or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous uint8 {(n, oh, ow, 3)}, got {out.dtype} {out.shape}")
    threads = 1 if pool == -1 else threads or cores()
    if n == 0:
        return out
    status = np.zeros(n, np.int32)
    if _native is not None:
        failures = _native.decode_crop_resize(list(buffers), win, out, int(threads), int(max_pixels),
                                              0, float(scale_margin), int(pool),
                                              *((op.address, op.params, status) if op else ()))
    else:
        require_native()
        failures = reference.python_batch(buffers, win, out, threads, max_pixels, scale_margin)
        if op is not None:
            status[:] = apply_op_reference(out, op)
    if op is not None:
        op.check(status)
    if failures and fallback:  # a failed slot is zeros already (native and Python paths)
        def write(i, img):
            out[i] = img
            if op is not None:  # the op ran on the zero slot; now on the retried image
                apply_op(out[i:i + 1], op.rows(i, i + 1), threads=1, pool=-1)

        failures = _retry(failures, buffers, win, ow, oh, max_pixels, write)
    _settle(failures, errors, on_error)
    return out


def _retry(failures, buffers, win, ow, oh, max_pixels, write) -> list:
    """fallback=True: Pillow's decode of each failed image, write(i, uint8 image) for those it
    decodes; returns the failures left."""
    still = []
    for i, reason in failures:
        try:
            img = _pillow_retry(buffers[i], win[i], ow, oh, max_pixels, reason)
        except _StillFailed as e:
            still.append((i, str(e)))
            continue
        write(i, img)
    return still


def _settle(failures, errors, on_error) -> None:
    """List the failures in `errors`, then apply the on_error policy to them."""
    if errors is not None:
        errors.extend(failures)
    if failures:
        if on_error is OnError.RAISE:
            raise DecodeError(failures)
        if on_error is OnError.WARN:
            warnings.warn(f"recordtool: {DecodeError(failures)}", RuntimeWarning, stacklevel=3)


def normalize(batch: np.ndarray, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout: str = "NCHW",
              dtype=np.float32, flips=None, threads: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """(x / 255 - mean) / std per channel (torchvision's units), to NCHW or NHWC float32/float16/
    bfloat16 (bits in uint16); images with flips[n] true are mirrored on the way (saves a separate
    mirror pass); written into `out` when given (C-contiguous, that shape and dtype)."""
    if layout not in ("NCHW", "NHWC"):
        raise ValueError("layout must be NCHW or NHWC")
    name, dtype = out_dtype(dtype)
    scale, bias = scale_bias(mean, std)
    n, h, w, _ = batch.shape
    flips = np.zeros(n, bool) if flips is None else np.ascontiguousarray(flips, bool)
    shape = (n, 3, h, w) if layout == "NCHW" else (n, h, w, 3)
    if out is not None and (out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous):
        raise ValueError(f"out must be C-contiguous {dtype} {shape}, got {out.dtype} {out.shape}")
    if _native is not None and batch.dtype == np.uint8:
        out = np.empty(shape, dtype) if out is None else out
        _native.normalize(np.ascontiguousarray(batch), flips, out, scale.tolist(), bias.tolist(),
                          layout == "NCHW", threads or cores())
        return out
    ref = reference.normalize(batch, scale, bias, layout, name, flips)
    if out is None:
        return ref
    out[...] = ref
    return out


def decode_crop_resize_normalize(buffers, windows, flips=None, size=(224, 224), mean=None, std=None,
                                 layout: str = "NCHW", dtype="float32", out=None, threads: int | None = None,
                                 on_error: OnError | str = "raise", fallback: bool = False,
                                 max_pixels: int = DEFAULT_MAX_PIXELS, errors: list | None = None,
                                 scale_margin: float = reference.SCALE_MARGIN, pool: int = 0,
                                 op: NativeOp | None = None) -> np.ndarray:
    """`normalize(decode_crop_resize(..., op=op), flips=flips)` in one native pass: each image is
    decoded, resampled, mirrored, normalised and written as float32/float16 NCHW/NHWC by the
    same thread while it is in cache — no uint8 batch, no second pass (what the GPU kernel does).
    bfloat16 is written as its bit patterns into a uint16 array (numpy has no bfloat16).

    Args:
        buffers, windows, size, threads, on_error, fallback, max_pixels, errors, scale_margin, pool:
            as decode_crop_resize.
        flips: bool (N,) horizontal mirror per image (default none).
        mean, std: per channel in 0..1 units (default ImageNet's): value = (p / 255 - mean) / std.
        layout: "NCHW" or "NHWC".
        dtype: "float32", "float16" or "bfloat16".
        out: a preallocated C-contiguous output of that shape and dtype (uint16 for bfloat16) to fill.
        op: a compiled per-image op (see decode_crop_resize): it runs on each image after the
            resize, before the mirror and normalize, on the same thread while the image is in cache.
    A failed image (after the Pillow fallback, when asked) is the normalised zero image.
    """
    on_error = _on_error(on_error)
    n = len(buffers)
    oh, ow = int(size[0]), int(size[1])
    if not (0 < oh <= MAX_OUTPUT_SIDE and 0 < ow <= MAX_OUTPUT_SIDE):
        raise ValueError(f"output size {oh}x{ow}: each side must be in 1..{MAX_OUTPUT_SIDE}")
    if layout not in ("NCHW", "NHWC"):
        raise ValueError("layout must be NCHW or NHWC")
    name, dtype = out_dtype(dtype)
    shape = (n, 3, oh, ow) if layout == "NCHW" else (n, oh, ow, 3)
    if out is None:
        out = np.empty(shape, dtype)
    elif out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous {dtype} {shape}, got {out.dtype} {out.shape}")
    flips = np.zeros(n, bool) if flips is None else np.ascontiguousarray(flips, bool).reshape(n)
    mean = IMAGENET_MEAN if mean is None else mean
    std = IMAGENET_STD if std is None else std
    scale, bias = scale_bias(mean, std)
    op = op.checked(n) if op is not None else None
    if n == 0:
        return out
    win = np.ascontiguousarray(np.asarray(windows, dtype=np.float64).reshape(n, 4))
    if _native is None:  # the Python decoder (when allowed): decode, then normalize
        require_native()
        errs: list = []
        img = decode_crop_resize(buffers, win, size, threads, on_error="skip", fallback=fallback, max_pixels=max_pixels,
                                 errors=errs, scale_margin=scale_margin, op=op)
        normalize(img, mean, std, layout, name, flips=flips, out=out)
        failures = errs
        fallback = False
    else:
        status = np.zeros(n, np.int32)
        failures = _native.decode_crop_resize_normalize(list(buffers), win, flips, out, scale.tolist(),
                                                        bias.tolist(), layout == "NCHW", int(threads or cores()),
                                                        int(max_pixels), float(scale_margin), int(pool),
                                                        *((op.address, op.params, status) if op else ()))
        if op is not None:
            op.check(status)
    if failures and fallback:
        def write(i, img):
            img = np.array(img[None], np.uint8, order="C")  # Pillow's array is read-only; the op writes
            if op is not None:
                apply_op(img, op.rows(i, i + 1), threads=1, pool=-1)
            out[i] = normalize(img, mean, std, layout, name, flips=flips[i:i + 1])[0]

        failures = _retry(failures, buffers, win, ow, oh, max_pixels, write)
    _settle(failures, errors, on_error)
    return out


def eval_transform(buffers, widths, heights, resize=256, crop=224, **kw) -> np.ndarray:
    """Resize (shorter side to `resize`, or to cover (rh, rw): center_windows), centre crop
    `crop` (side or (h, w)) — one native crop+resize pass."""
    size = (crop, crop) if np.isscalar(crop) else tuple(crop)
    return decode_crop_resize(buffers, center_windows(widths, heights, resize, crop), size=size, **kw)


def mirror(batch: np.ndarray, flags) -> np.ndarray:
    """Flip NHWC images horizontally where flags is true, in place."""
    flags = np.asarray(flags, dtype=bool)
    if flags.any():
        idx = np.nonzero(flags)[0]
        batch[idx] = batch[idx, :, ::-1]
    return batch

"""Numba compilation of a per-image op into the C function the native decode threads call.

The user's function `image(img, p)` — img a (h, w, 3) uint8 array edited in place, p the
image's float64 params — is compiled in nopython mode (`njit(nogil=True)`) for exactly those
types, then wrapped in a `cfunc` of the decoder's ABI (recordtool.decode.cpu.NativeOp):

    int32 op(uint8* img, int64 h, int64 w, int64 stride, const double* params)

The wrapper returns 0, OP_RAISED when the function raised (Numba's try/except: no exception
crosses into C), or OP_BAD_STRIDE for rows that are not packed (every caller passes w × 3).

Numba does not check indices by default: an unchecked function that indexes past its image
writes into whatever memory follows it (the decoder's heap) or kills the process. `checked`
compiles it with Numba's bounds checks (`boundscheck=True`): such an index raises, the wrapper
returns OP_RAISED and the Loader raises OpError naming the op — at the checks' cost in speed.
Numba is imported here only, when an op is first compiled: `recordtool[numba]` is optional.
"""
from __future__ import annotations

import linecache
from dataclasses import dataclass

import numpy as np

from ..errors import OP_BAD_STRIDE, OP_RAISED, OpCompileError
from ..util import ForkLock

_lock = ForkLock()  # producers look their op up here every batch: a forked child gets it unlocked
_cache: dict = {}  # (function, k, fastmath, checked) → Compiled; kept for the process: the C pointers stay valid


@dataclass(frozen=True)
class Compiled:
    """A compiled op: `address` is what the decoder calls; `entry` (the cfunc) and `kernel` (the
    njit function) keep the machine code alive."""

    address: int
    entry: object
    kernel: object


def _numba():
    try:
        import numba

        return numba
    except ImportError as e:
        raise OpCompileError(f"compiled per-image ops need Numba ({e}): pip install 'recordtool[numba]'; "
                             "or pass the op as array code on the whole batch: recordtool.ops.ReferenceOp(op)") from None


def _where(e, fn) -> str:
    """'file, line N: <source line>' of a Numba error, from its location (else the function's)."""
    loc = getattr(e, "loc", None)
    if loc is not None and getattr(loc, "line", None):
        filename, line = loc.filename, loc.line
    else:
        code = getattr(fn, "__code__", None)
        filename, line = (code.co_filename, code.co_firstlineno) if code else ("?", 0)
    text = linecache.getline(filename, line).strip()
    return f"{filename}, line {line}" + (f": {text}" if text else "")


def _reason(e) -> str:
    """Numba's message without its pipeline-trace lines."""
    keep = [ln for ln in str(e).splitlines() if ln.strip() and not ln.startswith("During:")
            and not ln.startswith("Failed in nopython mode pipeline")]
    return "\n".join(keep)


def compile_image(fn, k: int, name: str | None = None, fastmath: bool | frozenset = False,
                  checked: bool = False) -> Compiled:
    """Compile `fn(img, p)` (img uint8 (h, w, 3), p float64 (k,)) into the decoder's C ABI;
    cached per (fn, k, fastmath, checked). `fastmath`: Numba's option (False, True or a set of
    LLVM fast-math flags) — only for a function whose floating-point results do not depend on
    it. `checked`: Numba's bounds checks on every index (module docstring).
    OpCompileError names the line Numba refused and why."""
    if not isinstance(fastmath, bool):
        fastmath = frozenset(fastmath)
    if not isinstance(checked, (bool, np.bool_)):
        raise OpCompileError(f"checked must be True or False, not {checked!r}")
    checked = bool(checked)
    key = (fn, int(k), fastmath, checked)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            return hit
        numba = _numba()
        from numba import types

        name = name or getattr(fn, "__qualname__", repr(fn))
        if not callable(fn):
            raise OpCompileError(f"user op {name}: image must be a function, not {type(fn).__name__}")
        try:
            kernel = numba.njit(nogil=True, boundscheck=checked,
                                fastmath=fastmath if isinstance(fastmath, bool) else set(fastmath))(fn)
            kernel.compile((types.Array(types.uint8, 3, "C"), types.Array(types.float64, 1, "C")))
        except Exception as e:  # Numba's TypingError, UnsupportedError, …: a user error
            raise OpCompileError(f"cannot compile user op {name} with Numba (nopython mode) at {_where(e, fn)}\n"
                                 f"{_reason(e)}") from e
        entry = _entry(numba, kernel, int(k))
        c = Compiled(int(entry.address), entry, kernel)
        _cache[key] = c
        return c


def _entry(numba, kernel, k: int):
    from numba import carray, types

    sig = types.int32(types.CPointer(types.uint8), types.int64, types.int64, types.int64,
                      types.CPointer(types.float64))
    raised, bad_stride = OP_RAISED, OP_BAD_STRIDE

    @numba.cfunc(sig, nopython=True)
    def entry(ptr, h, w, stride, params):
        if stride != 3 * w:
            return bad_stride
        img = carray(ptr, (h, w, 3))
        p = carray(params, (k,))
        try:
            kernel(img, p)
        except Exception:  # noqa: BLE001  (in nopython mode: no exception may reach C)
            return raised
        return 0

    return entry

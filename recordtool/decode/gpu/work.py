"""`StreamWork`: a stream's host-to-device copies and kernel launches, gathered on the host and
queued in one call.

Why: each CuPy call that queues work (a copy, a launch, an event) gives the GIL up and must
take it back — from a training loop that holds it, at worst one switch interval later. A user
op's pass (the op's params and the normalising pass's samples up, the op's kernel, the
normalising kernel, the event after them) is one call of `_nvsubmit.queue` without the GIL;
the reference (`native=False`) makes the same calls through CuPy, one by one.

Invariant: what is queued reads its host sources when the stream reaches it — they must be
pinned and left alone until `done` has passed (the caller's double buffering).
"""
from __future__ import annotations

import numpy as np

from ...errors import RecordtoolError
from . import nvjpeg
from .nvjpeg import _addr, _driver, _nvsubmit

_CALLS = {1: "cuEventSynchronize", 2: "cuStreamWaitEvent", 3: "cuMemcpyHtoDAsync", 4: "cuLaunchKernel",
          5: "cuEventRecord"}
_fns = None
_SCALARS = (np.int32, np.uint32, np.float32, np.int64, np.uint64, np.float64)


class CudaError(RecordtoolError, RuntimeError):
    """A CUDA driver call of a queued pass failed (`.call`, `.status`: the driver's code)."""

    def __init__(self, call: str, status: int, what: str = ""):
        self.call, self.status = call, status
        super().__init__(f"{call}{what} failed with CUDA error {status}")


def native_available() -> bool:
    """Whether the GIL-free queue (native/nvjpeg_submit.cpp `queue`) is built."""
    return _nvsubmit is not None and hasattr(_nvsubmit, "queue")


def _functions() -> np.ndarray:
    global _fns
    if _fns is None:
        cu = _driver()
        _fns = np.array([_addr(f) for f in (cu.cuEventSynchronize, cu.cuStreamWaitEvent, cu.cuMemcpyHtoDAsync_v2,
                                            cu.cuLaunchKernel, cu.cuEventRecord)], np.int64)
    return _fns


class StreamWork:
    """Copies and launches for one stream, in the order: waits, copies, launches (`queue`)."""

    def __init__(self):
        self.waits: list = []     # cupy Events the stream waits for
        self.copies: list = []    # (device array, pinned numpy array)
        self.launches: list = []  # (cupy Function, grid, block, args, shared bytes)

    def wait(self, event) -> None:
        self.waits.append(event)

    def copy(self, dst, src: np.ndarray) -> None:
        """src (C-contiguous numpy over pinned memory) into the start of dst (a CuPy array)."""
        if not src.flags.c_contiguous or src.nbytes > dst.nbytes:
            raise ValueError(f"copy: a C-contiguous source of at most {dst.nbytes} bytes, not {src.nbytes}")
        self.copies.append((dst, src))

    def launch(self, fn, grid, block, args, shared: int = 0) -> None:
        """fn: a cupy RawKernel or Function; grid, block: up to 3 dimensions (the rest 1);
        args: CuPy arrays (their pointers) and NumPy scalars of the kernel's parameter types
        (int32, uint32, float32, int64, uint64, float64)."""
        for a in args:
            if isinstance(a, np.generic) and not isinstance(a, _SCALARS) or \
                    not isinstance(a, _SCALARS) and not hasattr(getattr(a, "data", None), "ptr"):
                raise TypeError(f"launch: a kernel argument must be a CuPy array or a NumPy scalar of "
                                f"{', '.join(t.__name__ for t in _SCALARS)}, not {type(a).__name__}")
        grid, block = _dims(grid), _dims(block)
        self.launches.append((getattr(fn, "kernel", fn), grid, block, tuple(args), int(shared)))

    def queue(self, stream, prev=None, done=None, native: bool = True) -> None:
        """Wait (on the host) for the event `prev`, then queue everything on `stream` (of the
        current device) and record `done` after it. native: one GIL-free call when it is built,
        else the same CuPy calls one by one."""
        if native and native_available():
            self._native(stream, prev, done)
            return
        import cupy

        if prev is not None:
            prev.synchronize()
        for ev in self.waits:
            stream.wait_event(ev)
        for dst, src in self.copies:
            cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.ctypes.data, src.nbytes,
                                          cupy.cuda.runtime.memcpyHostToDevice, stream.ptr)
        for fn, grid, block, args, shared in self.launches:
            fn(grid, block, args, shared_mem=shared, stream=stream)
        if done is not None:
            done.record(stream)

    def _native(self, stream, prev, done) -> None:
        nvjpeg.context_current()
        waits = np.array([ev.ptr for ev in self.waits], np.int64)
        copies = np.array([(dst.data.ptr, src.ctypes.data, src.nbytes) for dst, src in self.copies],
                          np.int64).reshape(-1, 3)
        launches = np.array([(fn.ptr, *grid, *block, shared, len(args))
                             for fn, grid, block, args, shared in self.launches], np.int64).reshape(-1, 9)
        slots = pack_args([a for *_, args, _ in self.launches for a in args])
        status, call, at = _nvsubmit.queue(_functions(), stream.ptr, 0 if prev is None else prev.ptr, waits, copies,
                                           launches, slots, 0 if done is None else done.ptr)
        if call:
            what = f" (launch {at + 1} of {len(self.launches)})" if call == 4 else \
                f" (copy {at + 1} of {len(self.copies)})" if call == 3 else ""
            raise CudaError(_CALLS[call], status, what)


def _dims(d) -> tuple:
    """Up to 3 launch dimensions, each ≥ 1, as 3 (as CuPy's launch pads them)."""
    d = tuple(int(v) for v in (d if isinstance(d, tuple | list) else (d,)))
    if not 1 <= len(d) <= 3 or min(d) < 1:
        raise ValueError(f"launch: 1 to 3 dimensions of at least 1, not {d}")
    return d + (1,) * (3 - len(d))


def pack_args(args) -> np.ndarray:
    """Kernel arguments as 8-byte slots (native `queue`): a CuPy array's pointer, a 64-bit
    scalar in all 8 bytes, a 32-bit one in the low 4."""
    slots = np.zeros(len(args), np.int64)
    for i, a in enumerate(args):
        if isinstance(a, _SCALARS):
            slots[i: i + 1].view(np.uint8)[: a.itemsize] = np.frombuffer(a.tobytes(), np.uint8)
        else:
            slots[i] = a.data.ptr
    return slots

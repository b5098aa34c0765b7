"""How host threads wait for a GPU's CUDA context: `set_host_wait_policy` (cuCtxSetFlags).

Why it is a call of its own, made only where asked: the scheduling policy belongs to the
device's primary context, shared by every thread of the process — the training loop's waits
too — so the library never sets it by default; a measurement that compares the policies makes
this call itself, once, before the Loader.
"""
from __future__ import annotations

from ...errors import ConfigError

HOST_WAIT_POLICIES = {"auto": 0, "spin": 1, "yield": 2, "block": 4}  # CU_CTX_SCHED_*


def set_host_wait_policy(gpu_id: int, mode: str) -> int:
    """Set how every host thread of this process waits for device `gpu_id`'s primary context
    (auto, spin, yield or block: CUDA's scheduling flags; anything else is a ConfigError) and
    return the context's flags after the call. Needs a CUDA 12.1 or later driver."""
    if mode not in HOST_WAIT_POLICIES:
        raise ConfigError(f"host wait policy must be one of {', '.join(HOST_WAIT_POLICIES)}, not {mode!r}")
    import ctypes

    import cupy

    with cupy.cuda.Device(gpu_id):
        cupy.cuda.runtime.free(0)  # the device's primary context is current on this thread
        lib = ctypes.CDLL("libcuda.so.1")
        if not hasattr(lib, "cuCtxSetFlags"):
            raise ConfigError("setting the host wait policy needs cuCtxSetFlags (a CUDA 12.1 or later driver)")
        rc = lib.cuCtxSetFlags(ctypes.c_uint(HOST_WAIT_POLICIES[mode]))
        flags = ctypes.c_uint(0)
        rc = rc or lib.cuCtxGetFlags(ctypes.byref(flags))
        if rc:
            raise RuntimeError(f"cuCtxSetFlags / cuCtxGetFlags failed with CUDA error {rc}")
        return flags.value

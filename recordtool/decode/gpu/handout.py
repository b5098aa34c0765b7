"""What the consumer of a cuda Loader gets, and when: `to_torch` hands a GPU batch to PyTorch
through DLPack (no copy), and `RunAhead` bounds how far the consumer may run ahead of the GPU
(GPUOptions.run_ahead) — GPUBackend.pace and GPUBackend.handout.

An eager training loop queues a step's kernels and comes back for the next batch long before
the GPU has run them. Unbounded, it goes on until CUDA's launch queue is full, and from then on
each of its kernel launches blocks inside torch's op with the GIL held: the Loader's producer
threads wait for the GIL between their stages, and their own CUDA submissions (nvJPEG's) queue
behind the full launch queue. `RunAhead` bounds the loop instead: before batch k is handed out,
the consuming thread sleeps — on a blocking-sync event, the GIL released, no core spinning —
until the GPU has finished what that thread's stream held when batch k - steps was handed out.
With steps = 1 the GPU still has the previous step queued while the loop queues the next one.

Invariant: one event per hand-out of the last `steps + 1`, recorded on the consumer's current
stream (torch's when torch is loaded, as OutputRing's give-back events); a wait never targets an
event that has not been recorded.
"""
from __future__ import annotations


def to_torch(array, stream=None):
    """Hand a CuPy array to PyTorch through DLPack; PyTorch's current stream waits for `stream`
    (None: the array is complete, or torch's stream already waits for it)."""
    import torch

    if stream is not None:
        dev = torch.device("cuda", array.device.id)
        torch.cuda.current_stream(dev).wait_stream(torch.cuda.ExternalStream(stream.ptr, device=dev))
    return torch.from_dlpack(array)


class RunAhead:
    """Bounds a consumer to `steps` hand-outs of queued GPU work (see the module).

    Args:
        steps: hand-outs whose work may still be queued, at least 1 (1: the step before the
            one the consumer is starting may still run, so the GPU is never left without work).
        device: the CUDA device of the Loader.
    """

    def __init__(self, steps: int, device: int):
        if int(steps) < 1:
            raise ValueError(f"steps must be at least 1, not {steps}")
        import cupy

        self.steps, self.device = int(steps), int(device)
        with cupy.cuda.Device(self.device):
            self._events = [cupy.cuda.Event(block=True, disable_timing=True) for _ in range(self.steps + 1)]
        self._handed = 0  # hand-outs recorded so far
        self._record = self._record_on_consumer_stream

    def before(self) -> float:
        """Sleep until the work queued before hand-out (next - steps) is done; the seconds slept
        (GPUBackend.pace adds them to Loader.stage_seconds["run_ahead"])."""
        import time

        k = self._handed - self.steps
        if k < 0:  # fewer hand-outs than steps so far
            return 0.0
        ev = self._events[k % (self.steps + 1)]
        t = time.perf_counter()
        ev.synchronize()  # cudaEventSynchronize without the GIL; a blocking-sync event sleeps
        return time.perf_counter() - t

    def handed(self) -> None:
        """A batch was handed out: mark what the consumer's stream holds now."""
        self._record(self._events[self._handed % (self.steps + 1)])
        self._handed += 1

    def _record_on_consumer_stream(self, ev) -> None:
        import cupy

        from .buffers import consumer_stream

        with cupy.cuda.Device(self.device):
            cupy.cuda.runtime.eventRecord(ev.ptr, consumer_stream(self.device))

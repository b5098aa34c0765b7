"""The hand-off of a GPU batch to PyTorch: `to_torch`, through DLPack (no copy)."""
from __future__ import annotations


def to_torch(array, stream=None):
    """Hand a CuPy array to PyTorch through DLPack; PyTorch's current stream waits for `stream`
    (None: the array is complete, or torch's stream already waits for it)."""
    import torch

    if stream is not None:
        dev = torch.device("cuda", array.device.id)
        torch.cuda.current_stream(dev).wait_stream(torch.cuda.ExternalStream(stream.ptr, device=dev))
    return torch.from_dlpack(array)

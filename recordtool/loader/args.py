"""The Loader's user op, checked once at construction (the inner layers trust what it gives):
`check_user_op` refuses what would do nothing or fail inside (torchvision transforms, torch
modules: ConfigError naming what to pass instead), and `compiled_op` compiles a per-image op
(recordtool.ops.ImageOp) for the device that runs it, so the backend gets it compiled
(decode.backend.CompiledOp) and the decode stage imports nothing of recordtool.ops.
"""
from __future__ import annotations

import functools
import types

from ..decode.backend import op_name
from ..errors import ConfigError


def compiled_op(op, gpu_id: int | None):
    """`op` when it is a compiled per-image op (recordtool.ops.ImageOp), compiled now for the
    device that runs it (ImageOp.prepare: GPU `gpu_id`, or the CPU for None): a refused op fails
    the Loader, not a batch. None for a batch op, or none."""
    if op is None:
        return None
    from ..ops import ImageOp

    if not isinstance(op, ImageOp):
        return None
    op.prepare(gpu_id)
    return op


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
    what = op_name(target) if plain else type(target).__qualname__
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

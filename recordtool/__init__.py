"""recordtool: OFRecord shards + a size-sorted index for fast image-classification input."""
from .version import __version__  # noqa: F401

from .errors import (AccessDenied, BadState, CacheChanged, CacheFull, Cancelled, ConfigError, DatasetChanged, DatasetNotFound,  # noqa: E402,F401
                     DecodeError, DeviceUnavailable, FormatError, NativeDecoderMissing, NoBucket, NotADataset,
                     OnError, OpCompileError, OpError, OpResultError, OutputExists, PackError, RecordError,
                     RecordtoolError, Rejected, RemoteError, TFRecordError, ThreadStartError, UnsafePath,
                     WorkerLost)
from .datasets import open_dataset as open  # noqa: E402,F401  (recordtool.open)
from .reader import Dataset  # noqa: E402,F401
from .sampler import BlockSampler, Sampler  # noqa: E402,F401


_CONFIG = ("Output", "TrainCrop", "EvalCrop", "GPUOptions", "RemoteOptions")


def __getattr__(name):
    # the Loader pulls in the decode stage, pack the sources and the writer: imported when asked for
    if name == "Loader":
        from .loader import Loader

        return Loader
    if name in _CONFIG:  # the Loader's configuration parts (recordtool.loader.config)
        from .loader import config

        return getattr(config, name)
    if name == "pack":  # the package recordtool.pack, callable: recordtool.pack(src, out, ...)
        import importlib

        return importlib.import_module(".pack", __name__)
    raise AttributeError(f"module 'recordtool' has no attribute {name!r}")


__all__ = ["Dataset", "Sampler", "BlockSampler", "Loader", "Output", "TrainCrop", "EvalCrop", "GPUOptions",
           "RemoteOptions", "open", "pack", "OnError", "RecordtoolError",
           "FormatError", "UnsafePath", "PackError", "WorkerLost", "Rejected", "OutputExists", "DecodeError",
           "RecordError", "RemoteError", "CacheFull", "NativeDecoderMissing", "ConfigError", "BadState",
           "NotADataset", "DeviceUnavailable", "DatasetNotFound", "NoBucket", "CacheChanged", "TFRecordError",
           "OpCompileError", "OpError", "OpResultError", "ThreadStartError", "Cancelled", "AccessDenied",
           "DatasetChanged", "__version__"]

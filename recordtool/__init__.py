"""recordtool: OFRecord shards + a size-sorted index for fast image-classification input."""
__version__ = "0.1.0"

from .datasets import open_dataset as open  # noqa: E402,F401  (recordtool.open)
from .reader import BlockSampler, Dataset, Sampler  # noqa: E402,F401


def __getattr__(name):
    # the Loader pulls in the decode stage; import it only when asked for
    if name == "Loader":
        from .loader import Loader

        return Loader
    raise AttributeError(f"module 'recordtool' has no attribute {name!r}")


__all__ = ["Dataset", "Sampler", "BlockSampler", "Loader", "open", "__version__"]

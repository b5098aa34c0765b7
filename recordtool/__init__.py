"""recordtool: OFRecord shards + a size-sorted index for fast image-classification input."""
__version__ = "0.1.0"

from .reader import Dataset, Sampler, open_dataset as open  # noqa: E402,F401  (recordtool.open)

__all__ = ["Dataset", "Sampler", "open", "__version__"]

"""Where records come from: ImageNet-style folders (and, later, TFRecord files)."""

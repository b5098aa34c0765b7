"""Where records come from: ImageNet-style folders, TFRecord files, OFRecord part files (registry.py: the kinds by name)."""

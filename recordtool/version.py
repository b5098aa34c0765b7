"""The package's version, in a module of its own: the modules that write it into manifests and
plans (pack, format/scan.py) and the CLI read it here, not from the package's `__init__`, which
imports them in turn (an import cycle)."""
__version__ = "0.1.0"

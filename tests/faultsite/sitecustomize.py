"""Runs as every Python process starts whose PYTHONPATH holds this folder (`faults.env()`: the
processes of a pack a crash test starts): installs the kill points when RECORDTOOL_FAULT is set."""
import os

if os.environ.get("RECORDTOOL_FAULT"):
    import importlib.util
    import sys

    _spec = importlib.util.spec_from_file_location(
        "recordtool_test_faults", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "faults.py"))
    _faults = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _faults
    _spec.loader.exec_module(_faults)
    _faults.install()

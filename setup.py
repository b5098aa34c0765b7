"""Builds the optional native extension; everything else is in pyproject.toml.

The extension is optional: without a compiler or libjpeg headers, pip still installs and
recordtool.decode falls back to PyTurboJPEG + Pillow with one warning.
"""
from setuptools import Extension, setup

try:
    import pybind11

    include = [pybind11.get_include()]
except ImportError:  # no pybind11: the build of the extension fails → optional → fallback
    include = []

setup(
    ext_modules=[
        Extension(
            "recordtool._native",
            sources=["native/fused.cpp"],
            depends=["native/resample.h"],
            include_dirs=include + ["native"],
            libraries=["jpeg"],
            extra_compile_args=["-O3", "-std=c++17", "-fvisibility=hidden", "-Wall", "-msse4.1"],
            language="c++",
            optional=True,
        )
    ]
)

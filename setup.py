"""Builds the optional native extension; everything else is in pyproject.toml.

The extension is optional: without a compiler or libjpeg headers, pip still installs and
recordtool.decode falls back to PyTurboJPEG + Pillow with one warning.
"""
import os
import shutil

from setuptools import Extension, setup
from setuptools.command.build_py import build_py


class build_py_with_kernel(build_py):
    """Ship native/gpu_resize.cu inside the package: CuPy compiles it at first use."""

    def run(self):
        super().run()
        dst = os.path.join(self.build_lib, "recordtool", "decode")
        os.makedirs(dst, exist_ok=True)
        shutil.copy(os.path.join("native", "gpu_resize.cu"), dst)


try:
    import pybind11

    include = [pybind11.get_include()]
except ImportError:  # no pybind11: the build of the extension fails → optional → fallback
    include = []

setup(
    cmdclass={"build_py": build_py_with_kernel},
    ext_modules=[
        Extension(
            "recordtool._native",
            sources=["native/fused.cpp"],
            depends=["native/resample.h"],
            include_dirs=include + ["native"],
            libraries=["jpeg"],
            extra_compile_args=["-O3", "-std=c++17", "-fvisibility=hidden", "-Wall", "-msse4.1",
                                # value · scale + bias never fused into one rounding (the GPU kernel rounds twice too)
                                "-ffp-contract=off"],
            language="c++",
            optional=True,
        ),
        # nvJPEG's hardware batch submission without the GIL (no CUDA at build time: nvJPEG's
        # functions are passed by address at run time); optional like the decoder
        Extension(
            "recordtool._nvsubmit",
            sources=["native/nvjpeg_submit.cpp"],
            include_dirs=include,
            extra_compile_args=["-O2", "-std=c++17", "-fvisibility=hidden", "-Wall"],
            language="c++",
            optional=True,
        ),
    ]
)

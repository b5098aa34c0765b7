"""Builds the native extensions; everything else is in pyproject.toml.

The extensions are optional for the build: without a compiler or libjpeg headers pip still
installs, and the first decode raises recordtool.NativeDecoderMissing with the fix (the Python
decoder runs only when a program asks for it: recordtool.decode.allow_python_decoder()).

`_native` also links libturbojpeg, which it does not call: the platform wheels'
`auditwheel repair` copies every library an extension links into recordtool.libs/, so this
link is what puts PyTurboJPEG's library (pack's encoder, the reference decoder) in the wheel
beside libjpeg; recordtool/_bundled.py finds it there.
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


def turbojpeg_link() -> list:
    """Link flags for libturbojpeg's runtime library (libturbojpeg0: no -dev package needed),
    or none where it is not installed: a source build then still has the decoder, and
    PyTurboJPEG looks for the library itself. --no-as-needed keeps the unused library a
    DT_NEEDED entry where the toolchain defaults to --as-needed (Ubuntu's does)."""
    import ctypes.util

    name = ctypes.util.find_library("turbojpeg")  # e.g. "libturbojpeg.so.0"
    return ["-Wl,--no-as-needed", f"-l:{name}"] if name else []


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
            extra_link_args=turbojpeg_link(),
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

"""What a platform wheel carries: libjpeg-turbo in recordtool.libs/, found by the native decoder
(its RPATH) and handed to PyTurboJPEG (recordtool/_bundled.py). The installed-wheel checks run
where the suite tests an install (RECORDTOOL_TEST_INSTALLED=1: scripts/test.sh, .ci/run)."""
import os
import shutil

import pytest

import recordtool
from recordtool import _bundled, codec

INSTALLED = os.environ.get("RECORDTOOL_TEST_INSTALLED") == "1"


def _loaded(name: str) -> set:
    """Paths of the mapped files of this process whose name starts with `name`."""
    with open("/proc/self/maps") as f:
        return {line.split()[-1] for line in f if os.path.basename(line.split()[-1]).startswith(name)}


def test_pyturbojpeg_gets_the_bundled_library(tmp_path, monkeypatch):
    import ctypes.util

    system = ctypes.util.find_library("turbojpeg")
    if system is None:
        pytest.skip("no libturbojpeg on this machine to stand for a bundled one")
    libs = tmp_path / "recordtool.libs"
    libs.mkdir()
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"):
        if os.path.exists(os.path.join(d, system)):
            shutil.copy(os.path.join(d, system), libs / "libturbojpeg-0a1b2c3d.so.0.2.0")
            break
    else:
        pytest.skip(f"{system} not in the usual folders")
    monkeypatch.setattr(_bundled, "LIBS", str(libs))
    assert _bundled.turbojpeg_path() == str(libs / "libturbojpeg-0a1b2c3d.so.0.2.0")
    seen = []
    import turbojpeg

    real = turbojpeg.TurboJPEG
    monkeypatch.setattr(turbojpeg, "TurboJPEG", lambda lib_path=None: seen.append(lib_path) or real(lib_path))
    monkeypatch.setattr(codec, "_tj", None)
    assert codec.turbojpeg().encode is not None
    assert seen == [str(libs / "libturbojpeg-0a1b2c3d.so.0.2.0")]
    monkeypatch.setattr(_bundled, "LIBS", str(tmp_path / "absent"))  # a source build: PyTurboJPEG searches
    assert _bundled.turbojpeg_path() is None


@pytest.mark.skipif(not INSTALLED, reason="tests an installed wheel (RECORDTOOL_TEST_INSTALLED=1)")
def test_the_suite_runs_against_the_installed_wheel():
    """Not the source tree: the package, its native decoder and libjpeg-turbo come from the
    installed wheel (site-packages, or pip's --target folder on the GPU machine)."""
    from recordtool import _native  # noqa: F401  (maps libjpeg)
    from recordtool.decode import cpu

    tree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert os.path.dirname(os.path.abspath(recordtool.__file__)) != os.path.join(tree, "recordtool"), recordtool.__file__
    assert cpu.native_available()
    codec.turbojpeg()
    libs = os.path.realpath(_bundled.LIBS)
    mapped = _loaded("libjpeg") | _loaded("libturbojpeg")  # (Pillow's wheel maps a libjpeg of its own)
    ours = {os.path.basename(p).split("-")[0] for p in mapped if os.path.realpath(p).startswith(libs + os.sep)}
    assert ours == {"libjpeg", "libturbojpeg"}, mapped
    assert not any(p.startswith(("/usr/", "/lib")) for p in mapped), mapped  # none of the system's
    here = os.path.dirname(recordtool.__file__)
    assert os.path.isfile(os.path.join(here, "decode", "gpu_resize.cu"))  # the CUDA kernel's source ships

"""The several-process launch path on CPU (gloo): ranks together cover every sample once."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import jpeg_bytes, write
from recordtool.pack import pack

torch = pytest.importorskip("torch", reason="torch.distributed needed")
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "examples", "distributed_loader.py")


@pytest.mark.parametrize("world", [2, 3])
def test_torchrun_gloo_exact_cover(tmp_path, world):
    src = tmp_path / "src"
    for i in range(36):  # divisible by 2 and 3: every sample exactly once
        write(str(src / f"c{i % 3}" / f"{i}.jpg"), jpeg_bytes(48, 40, seed=i))
    pack(str(src), str(tmp_path / "out"), shards=3, progress=False)
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    p = subprocess.run([torchrun, f"--nproc_per_node={world}", "--master_port", str(29500 + world), SCRIPT,
                        str(tmp_path / "out"), "--device", "cpu", "--batch", "4", "--epochs", "2", "--threads", "1"],
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "coverage OK" in p.stdout and p.stdout.count("every sample exactly once: True") == 2

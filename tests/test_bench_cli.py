"""`recordtool bench` end to end on a tiny dataset: every stage measured, JSON and PNG written."""
import json
import subprocess
import sys

from PIL import Image

from conftest import jpeg_bytes, write
from recordtool.pack import pack


def test_bench_cli(tmp_path):
    src = tmp_path / "src"
    for i in range(40):
        write(str(src / f"c{i % 2}" / f"{i}.jpg"), jpeg_bytes(300, 220, seed=i))
    pack(str(src), str(tmp_path / "out"), shards=2, progress=False)
    p = subprocess.run([sys.executable, "-m", "recordtool.cli", "bench", str(tmp_path / "out"), "--batch-size", "8",
                        "--epochs", "2", "--threads", "2", "--json", str(tmp_path / "b.json"), "--plot",
                        str(tmp_path / "b.png"), "-q"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "full loader" in p.stdout and "baseline" in p.stdout
    r = json.loads((tmp_path / "b.json").read_text())
    for key in ("read", "decode", "loader", "baseline_pil"):
        assert next(iter(r[key].values())) > 0
    assert r["loader"]["batches"] >= 4 and r["loader"]["p99_ms"] >= r["loader"]["p50_ms"] > 0
    assert Image.open(tmp_path / "b.png").size == (720, 360)
    h = subprocess.run([sys.executable, "-m", "recordtool.cli", "bench", "--help"], capture_output=True, text=True)
    for flag in ("--device", "--batch-size", "--threads", "--epochs", "--json", "--plot"):
        assert flag in h.stdout

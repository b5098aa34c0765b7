"""The `recordtool` command end to end, as a user runs it."""
import json
import os
import subprocess
import sys

from conftest import write

CLI = [sys.executable, "-m", "recordtool.cli"]


def run(*args):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True)


def test_pack_inspect_verify(folder, tmp_path):
    out = tmp_path / "out"
    p = run("pack", folder, out, "--shards", "2", "--workers", "2", "-q")
    assert p.returncode == 0, p.stderr
    assert "packed 21 records into 2 shards" in p.stdout
    p = run("inspect", out)
    assert p.returncode == 0 and "21 records, 3 classes, 2 shards" in p.stdout and "4:2:0" in p.stdout
    s = json.loads(run("inspect", out, "--json").stdout)
    assert s["records"] == 21 and sum(s["chroma"].values()) == 21 and s["progressive"] > 0
    p = run("verify", out, "--decode", "-q")
    assert p.returncode == 0 and "OK: 21 records verified, 21 decoded" in p.stdout
    b = bytearray((out / "part-00001").read_bytes())
    b[100] ^= 1
    (out / "part-00001").write_bytes(bytes(b))
    p = run("verify", out, "-q")
    assert p.returncode == 1 and "FAILED" in p.stderr and "part-00001" in p.stderr


def test_pack_reports_skips_and_strict(tmp_path, folder):
    write(str(folder / "cat" / "broken.JPEG"), b"\xff\xd8\xff")
    p = run("pack", folder, tmp_path / "a", "-q")
    assert p.returncode == 0 and "skipped 1" in p.stdout and "cat/broken.JPEG" in p.stderr
    p = run("pack", folder, tmp_path / "b", "-q", "--strict")
    assert p.returncode == 1 and "broken.JPEG" in p.stderr and "Traceback" not in p.stderr
    assert not os.path.exists(tmp_path / "b" / "manifest.json")


def test_clear_errors_not_tracebacks(tmp_path, folder):
    p = run("inspect", tmp_path)
    assert p.returncode == 1 and "not a finished recordtool dataset" in p.stderr
    assert "Traceback" not in p.stderr
    p = run("index", tmp_path)
    assert p.returncode == 1 and "no part files" in p.stderr
    p = run("pack", folder, tmp_path / "o", "--shards", "2", "--shard-size", "1MB")
    assert p.returncode == 1 and "not both" in p.stderr


def test_every_command_has_the_same_error_policy(tmp_path, folder):
    """One error policy for every command: a value an option's type refuses is a
    usage error (exit 2) and one checked inside the command a one-line error (exit 1), never a
    traceback, whichever command gets it (verify used to let a ValueError out as a traceback)."""
    assert run("pack", folder, tmp_path / "ds", "-q").returncode == 0
    p = run("verify", tmp_path / "ds", "--cache-limit", "lots")
    assert p.returncode == 2 and "Error:" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_classes_from_and_inspect_classes_of(folder, tmp_path):
    """`pack --classes-from TRAIN` numbers a validation folder missing a class as TRAIN does;
    `inspect --classes-of TRAIN` says when the lists differ (missing, extra, renumbered)."""
    import shutil

    assert run("pack", folder, tmp_path / "train", "-q").returncode == 0
    val = tmp_path / "val"
    for cls in ("dog", "eel"):
        shutil.copytree(folder / cls, val / cls)
    write(str(val / ".ipynb_checkpoints" / "x.JPEG"), (folder / "dog" / "dog_0.JPEG").read_bytes())
    p = run("pack", val, tmp_path / "plain", "-q")
    assert p.returncode == 0 and "skipped .ipynb_checkpoints: hidden folder" in p.stderr
    p = run("inspect", tmp_path / "plain", "--classes-of", tmp_path / "train")
    assert p.returncode == 0, p.stderr
    assert (f"warning: classes differ from {tmp_path / 'train'}: missing ['cat'], renumbered 2 ('dog' 1 → 0, "
            "'eel' 2 → 1)") in p.stdout
    s = json.loads(run("inspect", tmp_path / "plain", "--json", "--classes-of", tmp_path / "train").stdout)
    assert s["classes_of"]["missing"] == ["cat"] and not s["classes_of"]["same"]
    p = run("pack", val, tmp_path / "val-out", "-q", "--classes-from", tmp_path / "train")
    assert p.returncode == 0, p.stderr
    assert "no folder in SRC (labels kept): 'cat' (0)" in p.stderr
    p = run("inspect", tmp_path / "val-out", "--classes-of", tmp_path / "train" / "manifest.json")
    assert "classes: the same as" in p.stdout and "warning" not in p.stdout
    write(str(val / "fox" / "f.JPEG"), (folder / "dog" / "dog_0.JPEG").read_bytes())
    p = run("pack", val, tmp_path / "refused", "-q", "--classes-from", tmp_path / "train")
    assert p.returncode == 1 and "class folder 'fox' is not in the class list" in p.stderr
    assert "Traceback" not in p.stderr
    p = run("pack", "--from", "ofrecord", tmp_path / "train", tmp_path / "re", "--classes-from", tmp_path / "train")
    assert p.returncode == 2 and "applies to --from folder" in p.stderr

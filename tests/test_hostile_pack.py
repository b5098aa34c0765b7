"""Hostile suite, pack side: an OUT that is SRC under another name, and the process
engine under signals — the driver stops its workers on SIGTERM/SIGHUP as on Ctrl-C, workers
die with their driver, and a worker killed under the driver is a named error, not a traceback.

Each case runs `recordtool pack` in a subprocess with timeouts; RECORDTOOL_FAULT (tests/
faults.py) slows, hangs or kills the workers at exact records so nothing depends on timing.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import faults
from conftest import jpeg_bytes, tree, write

CLI = [sys.executable, "-m", "recordtool.cli", "pack", "-q"]


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    for i in range(24):
        write(str(root / f"c{i % 3}" / f"{i}.jpg"), jpeg_bytes(40 + i, 32, seed=i))
    return root


def _reference(src, tmp_path, *args):
    ref = tmp_path / "ref"
    subprocess.run(CLI + list(args) + [str(src), str(ref)], check=True, timeout=300)
    return tree(ref)


# ------------------------------------------------------------------ OUT is SRC under another name

def _bind_mount_works() -> bool:
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _bind_mount_works(), reason="no mount namespace here (unshare -rm)")
@pytest.mark.parametrize("inside", [False, True])
def test_out_bind_mounted_over_src_is_refused(src, tmp_path, inside):
    """B is a bind mount of dataset A: `pack --from ofrecord A B --overwrite` (or into B/sub)
    must be refused before anything is removed (paths differ, (st_dev, st_ino) do not)."""
    from recordtool.verify import verify

    a, b = tmp_path / "A", tmp_path / "B"
    subprocess.run(CLI + ["--shards", "2", str(src), str(a)], check=True, timeout=300)
    b.mkdir()
    before = tree(a)
    out = b / "sub" if inside else b
    script = 'mount --bind "$1" "$2" && exec "$3" -m recordtool.cli pack -q --from ofrecord "$1" "$4" --overwrite'
    p = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", str(a), str(b), sys.executable, str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    assert ("inside the source" if inside else "is the source") in p.stderr and "Traceback" not in p.stderr
    assert tree(a) == before and verify(str(a)).ok and not (a / "sub").exists()


def test_out_a_symlink_to_src_is_refused(src, tmp_path):
    a = tmp_path / "A"
    subprocess.run(CLI + ["--shards", "2", str(src), str(a)], check=True, timeout=300)
    os.symlink(a, tmp_path / "alias")
    before = tree(a)
    p = subprocess.run(CLI + ["--from", "ofrecord", str(a), str(tmp_path / "alias"), "--overwrite"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "is the source" in p.stderr
    assert tree(a) == before


# ------------------------------------------------------------------ the process engine under signals

def _children(pid: int) -> list:
    """The worker processes (multiprocessing spawn_main) among `pid`'s children."""
    kids = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            kids += [int(k) for k in f.read().split()]
    workers = []
    for k in kids:
        try:
            with open(f"/proc/{k}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    workers.append(k)
        except OSError:
            pass
    return workers


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _reap(workers) -> None:
    """Kill what a failed case left running (the test's own worker processes)."""
    for w in workers:
        if _alive(w):
            os.kill(w, signal.SIGKILL)


# the driver starts with SIGTERM and SIGHUP at their default action (or ignored: "ignore"),
# whatever this process inherited (a run under nohup ignores SIGHUP, and exec keeps that)
_WITH_SIGNALS = ("import os, signal, sys; [signal.signal(s, signal.SIG_IGN if sys.argv[1] == 'ignore' else "
                 "signal.SIG_DFL) for s in (signal.SIGTERM, signal.SIGHUP)]; os.execv(sys.executable, "
                 "[sys.executable] + sys.argv[2:])")


def _start_pack(src, out, action: str, fault: str = "record:1", signals: str = "default"):
    """A planned process-engine pack whose workers are slowed ("slow": 0.5 s per record, still
    checking the stop event) or hung ("hang") from their first record, its driver's SIGTERM and
    SIGHUP at their default action (or `signals="ignore"`); returns once both workers are
    writing part files (and their pids)."""
    env = faults.env(fault, action)
    p = subprocess.Popen([sys.executable, "-c", _WITH_SIGNALS, signals] + CLI[1:]
                         + ["--engine", "process", "--workers", "2", "--shards", "4", str(src), str(out)], env=env)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        partial = out / ".partial"
        writing = [n for n in os.listdir(partial) if n.endswith(".tmp")] if partial.is_dir() else []
        if len(writing) >= 2:
            return p, _children(p.pid)
        assert p.poll() is None, "pack ended before its workers were seen writing"
        time.sleep(0.1)
    p.kill()
    raise AssertionError("workers never started writing")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_stops_the_process_engines_workers(src, tmp_path, sig):
    expected = _reference(src, tmp_path, "--shards", "4")
    out = tmp_path / "out"
    p, workers = _start_pack(src, out, "slow")
    try:
        assert len(workers) == 2
        p.send_signal(sig)
        assert p.wait(timeout=120) == -sig  # the driver ends by the signal it got, after stopping its workers
        assert not [w for w in workers if _alive(w)]  # none left writing into OUT/.partial without the lock
    finally:
        _reap(workers)
    assert not (out / "manifest.json").exists()
    subprocess.run(CLI + ["--shards", "4", str(src), str(out)], check=True, timeout=300)
    assert tree(out) == expected


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_the_caller_ignores_is_left_ignored(src, tmp_path, sig):
    """pack handles SIGTERM / SIGHUP only where they have their default action: a driver
    started with them ignored (nohup, a supervisor's choice) packs on to the end."""
    from recordtool.verify import verify

    out = tmp_path / "out"
    p, workers = _start_pack(src, out, "slow", signals="ignore")
    try:
        assert len(workers) == 2
        p.send_signal(sig)
        assert p.wait(timeout=120) == 0
    finally:
        _reap(workers)
    assert verify(str(out)).ok


def test_workers_die_with_a_killed_driver(src, tmp_path):
    out = tmp_path / "out"
    p, workers = _start_pack(src, out, "hang")
    try:
        assert len(workers) == 2
        p.kill()
        p.wait(timeout=60)
        deadline = time.monotonic() + 60  # PR_SET_PDEATHSIG: at once; hung workers would never end by themselves
        while [w for w in workers if _alive(w)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [w for w in workers if _alive(w)]
    finally:
        _reap(workers)


def test_a_killed_worker_is_a_named_error_and_the_rerun_resumes(src, tmp_path):
    expected = _reference(src, tmp_path, "--shards", "4")
    out = tmp_path / "out"
    env = faults.env("record@part-00001:2")  # SIGKILL at its 2nd record
    cmd = CLI + ["--engine", "process", "--workers", "2", "--shards", "4", str(src), str(out)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    assert "worker process of --engine process died (killed by SIGKILL" in p.stderr
    assert "run the same command again to resume" in p.stderr and "Traceback" not in p.stderr
    assert not (out / "manifest.json").exists()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert tree(out) == expected

"""What a failed or killed pack leaves behind: a full disk leaves no part file (the cleanup
writes nothing), and the semaphores of a process-engine pack killed with its whole process
group are removed by the next pack.

The full disk is real where a mount namespace can be had (`unshare -rm`: a small tmpfs, the
pack run inside it); the same cases also run everywhere on a file whose writes fail with ENOSPC
past a few kilobytes, as a full disk's do.
"""
from __future__ import annotations

import errno
import io
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import faults
from conftest import jpeg_bytes, write

CLI = [sys.executable, "-m", "recordtool.cli", "pack", "-q"]


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    for i in range(48):
        write(str(root / f"c{i % 3}" / f"{i}.jpg"), jpeg_bytes(64 + i, 48, seed=i))
    return root


def _files(root) -> list:
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root) for n in names)


# ------------------------------------------------------------------ a full disk

def _mount_namespace() -> bool:
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# a 32 KiB tmpfs over $1 in a mount namespace of its own, the pack into $1/out, then what is
# left there (the mount goes with the namespace)
_FULL = ('disk="$1" py="$3"; mount -t tmpfs -o size=32k tmpfs "$disk" && cd "$2" && shift 3 && '
         '"$py" -m recordtool.cli pack -q "$@" 2>&1; echo "exit=$?"; cd "$disk" && find . -type f')


@pytest.mark.skipif(not _mount_namespace(), reason="no mount namespace here (unshare -rm)")
@pytest.mark.parametrize("engine, args", [("local", []), ("process", []), ("local", ["--shards", "2"]),
                                          ("process", ["--shards", "2"])])
def test_a_full_disk_leaves_no_part_file(src, tmp_path, engine, args):
    """ENOSPC while writing part files: one line naming the file, exit 1, and nothing written
    left on the disk (a by-size pack drops .partial; a planned one keeps only what a re-run
    reuses — no half-written part file)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run(["unshare", "-rm", "sh", "-c", _FULL, "sh", str(disk), repo, sys.executable,
                        "--engine", engine, "--workers", "2"] + args + [str(src), str(disk / "out")],
                       capture_output=True, text=True, timeout=300)
    text, _, left = p.stdout.partition("exit=")
    code, *files = left.split()
    assert code == "1", p.stdout + p.stderr
    assert [f for f in files if "part-" in f] == [], files
    assert set(files) <= {"./out/.recordtool.lock", "./out/.partial/pack.json"}, files
    assert len(text.splitlines()) == 1 and text.startswith("Error: [Errno 28] No space left on device: ")
    assert "part-0000" in text  # names the part file


class _FullRaw(io.FileIO):
    """A file on a disk with `room` bytes left: writes past it fail with ENOSPC, as a full
    disk's do (through the same BufferedWriter the local file system gives the writer)."""

    room = 6000

    def write(self, b):
        if self.tell() + memoryview(b).nbytes > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(b)


@pytest.mark.parametrize("shards", [None, 2])
def test_a_write_refused_for_room_leaves_no_part_file(src, tmp_path, monkeypatch, shards):
    from recordtool.io import files
    from recordtool.io.fs import LocalFS
    from recordtool.pack import pack

    monkeypatch.setattr(LocalFS, "open_write",
                        lambda self, path: io.BufferedWriter(_FullRaw(files.create_exclusive(path), "wb")))
    out = tmp_path / "out"
    with pytest.raises(OSError) as e:
        pack(str(src), str(out), shards=shards, engine="local", workers=2, progress=False)
    assert [f for f in _files(out) if "part-" in f] == []
    assert e.value.errno == errno.ENOSPC and "part-0000" in str(e.value)


def test_the_writer_drops_a_shard_without_writing(tmp_path):
    """`DatasetWriter.abort` must not flush: what it drops may be what the disk has no room for."""
    from recordtool.format.jpeg import probe
    from recordtool.format.writer import DatasetWriter

    out = tmp_path / "out"
    w = DatasetWriter(str(out))
    w.new_shard()
    w.writers[-1]._f = io.BufferedWriter(_FullRaw(os.path.join(w.tmp, "part-00000"), "wb"), buffer_size=1 << 20)
    jpeg = jpeg_bytes(160, 120, seed=1)
    for _ in range(_FullRaw.room // len(jpeg) + 1):  # in the buffer: more than the disk has room for
        w.add(jpeg, probe(jpeg), 0, b"a.jpg")
    w.abort()
    assert not os.path.exists(w.tmp)


# ------------------------------------------------------------------ semaphores of a killed pack

def _semaphores(pid: int) -> set:
    """The named semaphores process `pid` has open: the files of /dev/shm whose inodes it maps
    (glibc maps a semaphore's file under a temporary name, then links it to its own)."""
    inodes = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/sem."):
                inodes.add(int(fields[4]))
    names = set()
    for name in os.listdir("/dev/shm"):
        try:
            if name.startswith("sem.") and os.lstat(os.path.join("/dev/shm", name)).st_ino in inodes:
                names.add(os.path.join("/dev/shm", name))
        except OSError:
            pass
    return names


@pytest.mark.skipif(not (sys.platform.startswith("linux") and os.path.isdir("/dev/shm")), reason="Linux /dev/shm")
def test_the_semaphores_of_a_killed_process_pack_are_removed_by_the_next(src, tmp_path):
    out = tmp_path / "out"
    env = faults.env("record:1", "hang")
    cmd = ["--engine", "process", "--workers", "2", "--shards", "4", str(src), str(out)]
    p = subprocess.Popen(CLI + cmd, env=env, start_new_session=True)  # its group: driver, tracker, workers
    try:
        deadline = time.monotonic() + 240
        partial = out / ".partial"
        while not (partial.is_dir() and len([n for n in os.listdir(partial) if n.endswith(".tmp")]) >= 2):
            assert p.poll() is None, "pack ended before its workers were seen writing"
            assert time.monotonic() < deadline, "workers never started writing"
            time.sleep(0.05)
        left = _semaphores(p.pid)
        assert left  # the queues and events the workers share
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # all of it: no resource tracker survives to clean up
        p.wait(timeout=60)
    assert all(os.path.exists(s) for s in left), (left, os.listdir("/dev/shm"))  # what the kill leaves
    subprocess.run(CLI + cmd, check=True, timeout=300)  # the next run (it resumes the same pack)
    assert not [s for s in left if os.path.exists(s)]


@pytest.mark.skipif(not (sys.platform.startswith("linux") and os.path.isdir("/dev/shm")), reason="Linux /dev/shm")
def test_the_sweep_removes_only_what_a_gone_pack_named(tmp_path):
    """Names of a live creator, of another pid namespace and of other programs stay; a name
    whose pid now belongs to another process (or to none) goes."""
    from recordtool.pack import semaphores

    ns, pid, start = semaphores._identity()
    tag = f"sem.{semaphores.TAG}"
    other = str(int(start) + 1)  # this pid, another start time: the creator is gone, the pid reused
    names = {f"{tag}.{ns}.{pid}.{start}-live0001": True, f"{tag}.{ns}.{pid}.{other}-gone0001": False,
             f"{tag}.{int(ns) + 1}.{pid}.{other}-elsewhere": True, f"sem.mp-{os.getpid()}notours": True,
             f"{tag}.{ns}.{pid}.{other}-dir": True}
    try:
        for name in names:
            if name.endswith("-dir"):
                os.mkdir(os.path.join("/dev/shm", name))  # not a semaphore's file: never removed
            else:
                open(os.path.join("/dev/shm", name), "wb").close()
        removed = semaphores.sweep()
        assert f"{tag}.{ns}.{pid}.{other}-gone0001" in removed
        assert {n: os.path.lexists(os.path.join("/dev/shm", n)) for n in names} == names
    finally:
        for name in names:
            path = os.path.join("/dev/shm", name)
            if os.path.isdir(path):
                os.rmdir(path)
            elif os.path.lexists(path):
                os.unlink(path)

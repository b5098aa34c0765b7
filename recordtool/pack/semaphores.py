"""The POSIX named semaphores of the process engine, and what a killed pack leaves of them.

Spawned worker processes find the driver's queues and events by name, so multiprocessing
creates each lock as a named semaphore (Linux: a file `/dev/shm/sem.mp-…`) and unlinks it when
the driver lets it go — or its resource tracker does, when the driver dies. A pack killed
together with its tracker (SIGKILL to the process group, the out-of-memory killer, a stopped
container) leaves a dozen such files for good. So the driver names its semaphores after itself
(`named`: pid namespace, pid and start time), and every pack first removes those whose creator
is gone (`sweep`); names of other programs are never touched.

Linux only (where /dev/shm and /proc show both); elsewhere both are no-ops.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import stat

from ..util import owner_gone, process_identity

SHM = "/dev/shm"
TAG = "mp-rt"  # after multiprocessing's own "mp" prefix: sem.mp-rt.<pid ns>.<pid>.<start>-<random>
_NAME = re.compile(r"sem\." + re.escape(TAG) + r"\.(\d+)\.(\d+)\.(\d+)-[A-Za-z0-9_]+\Z")


def _identity() -> tuple | None:
    """This process's (pid namespace, pid, start time) where /dev/shm holds the semaphores."""
    return process_identity() if os.path.isdir(SHM) else None


@contextlib.contextmanager
def named():
    """For the block, the semaphores this process creates carry its identity in their names
    (multiprocessing's name prefix, its `semprefix`), so that a later pack can tell whether
    their creator still lives. Another thread's semaphore created meanwhile gets the same
    prefix: it is this process's too, and goes only when this process is gone."""
    config = getattr(multiprocessing.current_process(), "_config", None)
    me = _identity()
    if me is None or not isinstance(config, dict) or not isinstance(config.get("semprefix"), str):
        yield
        return
    old = config["semprefix"]
    config["semprefix"] = "/" + ".".join((TAG,) + me)
    try:
        yield
    finally:
        config["semprefix"] = old


def sweep() -> list:
    """Remove the semaphores that packs of this pid namespace named (`named`) and whose creator
    is gone (no such pid, or another process under it); only regular files of this user. The
    names removed."""
    me = _identity()
    if me is None:
        return []
    try:
        names = os.listdir(SHM)
    except OSError:
        return []
    removed = []
    for name in names:
        m = _NAME.match(name)
        if m is None or not owner_gone(*m.groups()):
            continue
        path = os.path.join(SHM, name)
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                os.unlink(path)
                removed.append(name)
        except OSError:  # gone meanwhile (another pack's sweep)
            pass
    return removed

"""Kill points for the crash tests: RECORDTOOL_FAULT=name:N kills the process (SIGKILL) at the
N-th hit of `name`, so a test can stop a pack at an exact moment (mid-shard, between two
renames of a publish) and prove that a killed pack never looks finished and that a re-run is
byte-identical.

Points: `record` (after each record written, any shard), `record@part-NNNNN` (after each
record of that part file), `publish` (before each file moved into OUT, the manifest apart),
`published` (after the manifest is in place, before .partial is removed), `worker-start` (in a
spawned worker process as its interpreter starts: before its initializer ran).
`name:N:FLAG` fires only in the one process that creates the file FLAG first (a worker
killed once, then retried by Ray). RECORDTOOL_FAULT_ACTION changes what a firing point
does, for the tests of a driver's signals: `hang` sleeps for good (a hung worker), `slow`
sleeps 0.5 s at this and every later hit, then goes on (a worker that is still busy);
`pause:DIR` creates DIR/paused.<pid> and waits until DIR/go exists (at most 10 minutes): the
test knows the process is at that point, does what it tests, then lets it go on.

None of this is in the package: `env()` gives a pack's environment the fault and a PYTHONPATH
that starts with tests/faultsite/, whose `sitecustomize` calls `install()` as each Python process
of that pack starts (driver, spawned workers, Ray workers: they all inherit the environment), and
`install` wraps the writer's methods from outside.
"""
from __future__ import annotations

import functools
import os
import signal
import sys
import time

from recordtool.io import files

SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faultsite")

_hits: dict = {}


def hit(name: str) -> None:
    """Count one pass through point `name`; kill (or hang) when RECORDTOOL_FAULT says so."""
    want, _, rest = os.environ.get("RECORDTOOL_FAULT", "").partition(":")
    if want != name:
        return
    count, _, flag = rest.partition(":")
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] < int(count or 1):
        return
    if flag:
        try:
            os.close(files.create_exclusive(flag))
        except FileExistsError:
            return
    action = os.environ.get("RECORDTOOL_FAULT_ACTION", "kill")
    if action.startswith("pause:"):
        folder = action[len("pause:"):]
        os.close(files.create_exclusive(os.path.join(folder, f"paused.{os.getpid()}")))
        deadline = time.monotonic() + 600
        while not os.path.exists(os.path.join(folder, "go")) and time.monotonic() < deadline:
            time.sleep(0.02)
        return
    if action == "slow":
        time.sleep(0.5)
        return
    if action == "hang":
        while True:
            time.sleep(3600)
    os.kill(os.getpid(), signal.SIGKILL)


def install() -> None:
    """Wrap the writer's methods with the kill points (once per process)."""
    from recordtool.format import writer

    if getattr(writer.ShardWriter.add, "_fault", False):
        return
    if "--multiprocessing-fork" in getattr(sys, "orig_argv", sys.argv):  # a spawned worker, unpickling its work
        hit("worker-start")
    add, move, published = writer.ShardWriter.add, writer.DatasetWriter._move, writer.DatasetWriter._published

    @functools.wraps(add)
    def add_point(self, *args, **kwargs):
        add(self, *args, **kwargs)
        hit("record")
        hit("record@" + self.name)

    @functools.wraps(move)
    def move_point(self, name):
        hit("publish")
        move(self, name)

    @functools.wraps(published)
    def published_point(self):
        hit("published")
        published(self)

    add_point._fault = True
    writer.ShardWriter.add, writer.DatasetWriter._move, writer.DatasetWriter._published = (
        add_point, move_point, published_point)


def pythonpath() -> str:
    """tests/faultsite/ (its sitecustomize installs the kill points), then the directory of the
    recordtool these tests import (the installed wheel, or the tree), then the PYTHONPATH
    inherited: a pack's processes import the recordtool under test, from their first line on."""
    import recordtool

    home = os.path.dirname(os.path.dirname(os.path.abspath(recordtool.__file__)))
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([SITE, home] + rest)


def env(fault: str, action: str | None = None) -> dict:
    """The environment of a pack killed (or slowed, hung, paused: `action`) at `fault`."""
    e = dict(os.environ, RECORDTOOL_FAULT=fault, PYTHONPATH=pythonpath())
    if action is not None:
        e["RECORDTOOL_FAULT_ACTION"] = action
    return e

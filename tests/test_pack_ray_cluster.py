"""pack --engine ray on a two-node Ray cluster (ray.cluster_utils.Cluster): the same bytes as
the local engine; a worker killed mid-shard is retried by Ray; a shard whose every attempt
dies fails the job, and the re-run redoes only that shard."""
import contextlib
import os

import pytest

import faults
from conftest import tree
from recordtool.pack import ray_tasks as pack_ray
from recordtool.errors import PackError
from recordtool.pack import pack

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    yield c
    c.shutdown()


@contextlib.contextmanager
def job(cluster, fault=None):
    """One driver connection (a Ray job); RECORDTOOL_FAULT set in its workers only, with the
    kill points' sitecustomize on their PYTHONPATH."""
    env = {"env_vars": {"RECORDTOOL_FAULT": fault, "PYTHONPATH": faults.pythonpath()}} if fault else None
    ray.init(address=cluster.address, runtime_env=env, logging_level="WARNING")
    try:
        cluster.wait_for_nodes()
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The local engine's pack of a folder made for this module."""
    from conftest import jpeg_bytes, write

    root = tmp_path_factory.mktemp("data")
    for i in range(24):
        write(str(root / "src" / f"c{i % 3}" / f"{i}.jpg"), jpeg_bytes(48 + i, 40, seed=i))
    pack(str(root / "src"), str(root / "ref"), shards=4, seed=1, progress=False)
    return root / "src", tree(root / "ref")


def test_two_nodes_same_bytes(cluster, reference, tmp_path):
    src, expected = reference
    with job(cluster):
        s = pack(str(src), str(tmp_path / "out"), shards=4, seed=1, progress=False, engine="ray")
    assert (s.records, s.retried, s.reused) == (24, 0, [])
    assert tree(tmp_path / "out") == expected


@pytest.mark.parametrize("at", [3, 1])
def test_worker_killed_mid_shard_is_retried(cluster, reference, tmp_path, at):
    """The retry is counted by the driver that submits it again (not from the task's own
    message to an actor, which is lost when the worker dies before sending it): at=1
    kills the worker at its first record, as soon as it can die."""
    src, expected = reference
    flag = tmp_path / "killed-once"
    with job(cluster, fault=f"record@part-00002:{at}:{flag}"):
        s = pack(str(src), str(tmp_path / "out"), shards=4, seed=1, progress=False, engine="ray")
    assert flag.exists()  # a worker did die (SIGKILL at its at-th record of part-00002)
    assert s.retried == 1 and s.reused == []
    assert tree(tmp_path / "out") == expected


def test_shard_dying_every_time_then_rerun_redoes_only_it(cluster, reference, tmp_path, monkeypatch):
    src, expected = reference
    out = tmp_path / "out"
    monkeypatch.setattr(pack_ray, "MAX_RETRIES", 1)  # 2 attempts, both killed
    with job(cluster, fault="record@part-00001:2"), pytest.raises(PackError, match="part-00001: shard task lost"):
        pack(str(src), str(out), shards=4, seed=1, progress=False, engine="ray")
    assert not (out / "manifest.json").exists()
    done = sorted(n for n in os.listdir(out / ".partial") if n.endswith(".done.json"))
    assert done == ["part-00000.done.json", "part-00002.done.json", "part-00003.done.json"]
    inodes = {n: os.stat(out / ".partial" / n).st_ino for n in ("part-00000", "part-00002", "part-00003")}
    with job(cluster):
        s = pack(str(src), str(out), shards=4, seed=1, progress=False, engine="ray")
    assert s.reused == ["part-00000", "part-00002", "part-00003"]
    assert tree(out) == expected
    assert {n: os.stat(out / n).st_ino for n in inodes} == inodes  # reused files, not rewritten

"""The several-process launch path on CPU (gloo): ranks together cover every sample once; a
Loader's rank and world size against a real process group (made before it, refused when
contradicted)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import jpeg_bytes, packed_folder, write
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
    # --standalone: a rendezvous on a free port (a fixed port collides with another run's)
    p = subprocess.run([torchrun, "--standalone", f"--nproc_per_node={world}", SCRIPT,
                        str(tmp_path / "out"), "--device", "cpu", "--batch", "4", "--epochs", "2", "--threads", "1"],
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "coverage OK" in p.stdout and p.stdout.count("every sample exactly once: True") == 2


GROUP_SCRIPT = r"""
import json, os, sys
import torch.distributed as dist
import torch.multiprocessing as mp
from recordtool.errors import ConfigError
from recordtool.loader import Loader


def refused(make):
    try:
        make()
    except ConfigError as e:
        return str(e)
    return None


def run(rank, data, out):
    kw = dict(batch_size=4, size=16, threads=1, as_torch=False, with_ids=True)
    os.environ.pop("RANK", None)
    os.environ["WORLD_SIZE"] = "2"  # as Lightning's launcher leaves it: no RANK
    early = Loader(data, **kw)  # made before the group: its rank comes from the group
    del os.environ["WORLD_SIZE"]
    own = Loader(data, rank=0, world_size=1, **kw)
    used = Loader(data, **kw)
    next(iter(used))  # a batch as rank 0 of 1: its place is fixed
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "store"), rank=rank, world_size=2)
    r = {"early": [early.rank, early.world_size, len(early)],
         "ids": [int(i) for _, _, ids in early for i in ids],
         "own_split": [own.rank, own.world_size, len(own)],
         "alone": Loader(data, rank=rank, **kw).world_size,
         "contradicts": refused(lambda: Loader(data, rank=1 - rank, world_size=2, **kw)),
         "rank_alone": refused(lambda: Loader(data, rank=1 - rank, **kw)),
         "world_alone": refused(lambda: Loader(data, world_size=3, **kw)),
         "moved": refused(lambda: next(iter(used)))}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(r, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(sys.argv[1], sys.argv[2]), nprocs=2)
"""


def test_rank_and_world_size_against_a_process_group(tmp_path):
    data = packed_folder(tmp_path, 24)
    script = tmp_path / "group.py"
    script.write_text(GROUP_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    p = subprocess.run([sys.executable, str(script), data, str(tmp_path)], capture_output=True, text=True,
                       timeout=240, env=dict(env, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    r = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    assert [x["early"] for x in r] == [[0, 2, 3], [1, 2, 3]]  # made before the group, placed by it
    assert sorted(r[0]["ids"] + r[1]["ids"]) == list(range(24))  # every sample once across the ranks
    assert [x["own_split"] for x in r] == [[0, 1, 6]] * 2  # both given, another world: the caller's split
    assert [x["alone"] for x in r] == [2, 2]  # a rank alone that agrees takes the group's world size
    for k, x in enumerate(r):
        assert f"makes this process rank {k} of 2" in x["contradicts"]
        assert "rank=" in x["rank_alone"] and f"rank {k} of 2" in x["rank_alone"]
        assert "world_size=3 given without rank" in x["world_alone"]
        assert "made its batches as rank 0 of 1" in x["moved"] and f"rank {k} of 2" in x["moved"]

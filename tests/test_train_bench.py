"""`recordtool bench --train` (recordtool.tools.train_bench) in its CPU form on a tiny dataset: every
pipeline runs through the CLI, the table and JSON report what was measured, a failing pipeline
is reported as failed (never as a number), and the per-thread CPU accounting adds up."""
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from conftest import jpeg_bytes, write
from recordtool.tools import peers, train_bench, train_step
from recordtool.pack import pack


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("train_bench")
    for i in range(48):
        write(str(root / "src" / f"c{i % 3}" / f"{i}.jpg"), jpeg_bytes(200, 150, seed=i))
    pack(str(root / "src"), str(root / "out"), shards=2, progress=False)
    return root


def test_train_bench_cli_cpu_form(data, tmp_path):
    pipes = "synthetic;recordtool;synthetic+recordtool;recordtool:producers=1" + (";dali;dali:op=jitter"
                                                                                  if peers.dali_available() else "")
    p = subprocess.run([sys.executable, "-m", "recordtool.cli", "bench", str(data / "out"), "--train", "resnet18",
                        "--device", "cpu", "--batch-size", "8", "--steps", "3", "--repeats", "2", "--threads", "2",
                        "--consumer-ms", "5", "--pipelines", pipes, "--dali-files", str(data / "src"),
                        "--json", str(tmp_path / "t.json")], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "training throughput" in p.stdout and "recordtool:producers=1" in p.stdout
    r = json.loads((tmp_path / "t.json").read_text())
    names = [x["pipeline"] for x in r["runs"]]
    assert names == pipes.split(";") * 2  # interleaved repeats
    for run in r["runs"]:
        assert run["error"] is None, run
        assert run["img_s"] > 0 and run["steps"] == 3 and run["cores"]["total"] >= 0
    s = r["summary"]
    assert s["synthetic"]["vs_synthetic"] == pytest.approx(1.0)
    assert s["recordtool"]["spread"] >= 1.0 and len(s["recordtool"]["runs"]) == 2
    assert s["synthetic+recordtool"]["wait_ms"] >= 0
    # 15 warm-up + 3 steps = 3 whole epochs of 6 batches: counted by the run, not by the epoch position
    stages = next(run["cores"]["loader_stage_ms_per_batch"] for run in r["runs"] if run["pipeline"] == "recordtool")
    assert stages["decode"] > 0, stages  # the producers' time per batch, by stage
    for run in r["runs"]:  # the Loader ran beside the training steps (how many batches depends on the load)
        if run["pipeline"] == "synthetic+recordtool":
            assert run["cores"]["beside_batches"] >= 1, run


def test_a_failing_pipeline_is_reported_not_measured(data):
    res = train_bench.run(str(data / "out"), None, "resnet18", 64, 8, 2, 1, 1,
                          ["recordtool:size=0", "dali", "nonsense"], 2, "cpu", consumer_ms=1, log=lambda m: None)
    rows = res.summary()
    assert set(rows) == {"recordtool:size=0", "dali", "nonsense"}
    assert all("error" in row for row in rows.values()), rows
    assert "needs the original files" in rows["dali"]["error"] and "unknown pipeline" in rows["nonsense"]["error"]
    assert "failed" in train_bench.table(res)


def test_thread_accounting_sees_a_busy_thread():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    t = threading.Thread(target=spin, name="spinner-7")
    before = train_step.threads_cpu()
    t0 = time.perf_counter()
    t.start()
    time.sleep(0.5)
    after = train_step.threads_cpu()
    stop.set()
    t.join()
    cores = train_step.cores_busy(before, after, time.perf_counter() - t0)
    assert cores.get("spinner", 0) > 0.1 and cores["total"] >= cores["spinner"]  # grouped without its number


def test_ddp_form_two_ranks_on_cpu(data, tmp_path):
    """The DDP form under torchrun, two ranks on the CPU (gloo): both train, every sample is seen
    once per epoch across ranks, and a mid-epoch resume is identical on each rank."""
    pytest.importorskip("torch")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        "-m", "recordtool.tools.train_bench", str(data / "out"), "--ddp", "--device", "cpu", "--arch",
                        "tiny", "--size", "32", "--batch", "4", "--steps", "3", "--warmup", "1", "--repeats", "1",
                        "--threads", "1", "--pipelines", "synthetic;recordtool", "--json", str(tmp_path / "d.json")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((tmp_path / "d.json").read_text())
    assert r["world"] == 2 and r["backend"] == "gloo"
    assert [x["pipeline"] for x in r["runs"]] == ["synthetic", "recordtool"]
    for run in r["runs"]:
        assert all(rank["error"] is None and rank["img_s"] > 0 for rank in run["ranks"]), run
    assert r["every_sample_once"] is True and r["resume_identical"] == [True, True]
    assert "every sample once per epoch across ranks: True" in p.stdout


def test_a_pipeline_names_a_compiled_op_by_its_registry_name(data):
    """`recordtool:op=cutout` — the training benchmark's Loader with that compiled op (issue 27's
    op in training), the other options passed through."""
    pytest.importorskip("numba")
    from recordtool.ops import Cutout
    from recordtool.tools.train_pipelines import make_loader, parse_options

    ld = make_loader(str(data / "out"), 4, 32, "cpu", parse_options("op=cutout,producers=1"))
    try:
        assert isinstance(ld.user_op, Cutout) and ld.user_op.size == 56 and ld.producers == 1
        x, _ = next(iter(ld))
        assert x.shape[0] == 4
    finally:
        ld.close()


def test_option_env_sets_the_env_pseudo_options_for_the_block_only(monkeypatch):
    """`env.NAME=VALUE` in a pipeline's options (train_bench, gpu_neighbour): taken out of the
    options, set while the block runs, and the environment as it was after — also on an error."""
    from recordtool.tools.train_pipelines import option_env, parse_options

    monkeypatch.setenv("RECORDTOOL_GPU_SYNC", "block")
    monkeypatch.delenv("RECORDTOOL_GPU_PLANAR", raising=False)
    opts = parse_options("split=gpu,env.RECORDTOOL_GPU_SYNC=spin,env.RECORDTOOL_GPU_PLANAR=whole")
    with pytest.raises(RuntimeError):
        with option_env(opts):
            assert opts == {"split": "gpu"}
            assert os.environ["RECORDTOOL_GPU_SYNC"] == "spin" and os.environ["RECORDTOOL_GPU_PLANAR"] == "whole"
            raise RuntimeError("a run that fails")
    assert os.environ["RECORDTOOL_GPU_SYNC"] == "block" and "RECORDTOOL_GPU_PLANAR" not in os.environ


def test_split_state_reports_the_planner_and_the_demand():
    """The training benchmark's split diagnostic reads a cuda Loader's last BatchReport and its
    Demand (plain objects here: no GPU needed)."""
    from types import SimpleNamespace

    from recordtool.decode.gpu.decoder import BatchReport
    from recordtool.decode.gpu.plan import Demand
    from recordtool.tools.train_bench import split_state

    rep = BatchReport(n=10, gpu=4, cpu=6, cpu_fraction=0.61234, gpu_rate=4000.4, cpu_rate=None)
    ld = SimpleNamespace(last_split=rep, batcher=SimpleNamespace(demand=Demand(allowed=0.25)))
    assert split_state(ld) == {"balanced_cpu": 0.612, "gpu_rate": 4000, "cpu_rate": None, "first": "cpu",
                               "allowed": 0.25}
    ld.batcher = SimpleNamespace()  # RECORDTOOL_GPU_DEMAND=off: no Demand
    assert "allowed" not in split_state(ld)

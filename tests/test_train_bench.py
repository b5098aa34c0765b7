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
from recordtool.errors import ConfigError
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
    """--cores 1: every run pinned to the first CPU of the process's affinity (the union of what
    every thread of the process, the Loader's and DALI's included, was allowed at the end of the
    timed steps), --threads following it; each DALI pipeline once per --dali-load."""
    dali = peers.dali_available()
    pipes = "synthetic;recordtool;synthetic+recordtool;recordtool:producers=1" + (";dali;dali:op=jitter"
                                                                                  if dali else "")
    p = subprocess.run([sys.executable, "-m", "recordtool.cli", "bench", str(data / "out"), "--train", "resnet18",
                        "--device", "cpu", "--batch-size", "8", "--steps", "3", "--repeats", "2", "--cores", "1",
                        "--dali-load", "0.65,0.99", "--consumer-ms", "5", "--pipelines", pipes,
                        "--dali-files", str(data / "src"), "--json", str(tmp_path / "t.json")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "training throughput" in p.stdout and "recordtool:producers=1" in p.stdout
    for column in ("cores", "GPU MiB", "RSS MiB", "anon MiB", "1 core(s)"):
        assert column in p.stdout
    r = json.loads((tmp_path / "t.json").read_text())
    first = min(os.sched_getaffinity(0))
    assert r["config"]["cores"] == 1 and r["config"]["cpus"] == [first] and r["config"]["threads"] == 1
    expected = pipes.replace("dali;dali:op=jitter", "dali:load=0.65;dali:load=0.99;dali:op=jitter,load=0.65;"
                                                    "dali:op=jitter,load=0.99").split(";")
    names = [x["pipeline"] for x in r["runs"]]
    assert names == expected * 2  # interleaved repeats
    for run in r["runs"]:
        assert run["error"] is None, run
        assert run["img_s"] > 0 and run["steps"] == 3 and run["cores"]["total"] >= 0
        assert run["affinity"] == [first], run  # pinned, the pipeline's own threads included
        assert run["cores_busy"] > 0 and run["rss_mib"] > 0 and run["gpu_mib"] is None, run
        assert 0 < run["anon_mib"] <= run["rss_mib"], run
    s = r["summary"]
    for row in s.values():
        assert row["cores_busy"] > 0 and row["rss_mib"] > 0 and row["gpu_mib"] is None, row
        assert 0 < row["anon_mib"] <= row["rss_mib"], row
    if dali:  # the ratio is against the faster plain DALI row, never the op's
        best = max(("dali:load=0.65", "dali:load=0.99"), key=lambda k: s[k]["median"])
        assert r["best_dali"] == best and s[best]["vs_dali"] == pytest.approx(1.0)
        assert f"against {best}" in p.stdout
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
                          ["recordtool:size=0", "dali", "nonsense", "synthetic:host_wait=block"], 2, "cpu",
                          consumer_ms=1, log=lambda m: None)
    rows = res.summary()
    assert set(rows) == {"recordtool:size=0", "dali", "nonsense", "synthetic:host_wait=block"}
    assert all("error" in row for row in rows.values()), rows
    assert "needs the original files" in rows["dali"]["error"] and "unknown pipeline" in rows["nonsense"]["error"]
    assert "cuda pipeline's option" in rows["synthetic:host_wait=block"]["error"]  # CUDA's flags: cuda only
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
    """`recordtool:op=cutout` — the training benchmark's Loader with that compiled op (the op in
    training), the other options passed through."""
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


def test_split_state_reports_the_planner_and_the_demand():
    """The training benchmark's split diagnostic reads a cuda Loader's last BatchReport and its
    Demand (plain objects here: no GPU needed)."""
    from types import SimpleNamespace

    from recordtool.decode.gpu.decoder import BatchReport
    from recordtool.decode.gpu.plan import Demand
    from recordtool.tools.train_bench import split_state

    rep = BatchReport(n=10, gpu=4, cpu=6, cpu_fraction=0.61234, gpu_rate=4000.4, cpu_rate=None)
    ld = SimpleNamespace(last_split=rep, backend=SimpleNamespace(demand=Demand(allowed=0.25)))
    assert split_state(ld) == {"balanced_cpu": 0.612, "gpu_rate": 4000, "cpu_rate": None, "first": "engines",
                               "allowed": 0.25}
    ld.backend = SimpleNamespace()  # a backend without a Demand
    assert "allowed" not in split_state(ld)


def test_a_run_at_one_core_pins_every_thread_and_restores_them(data):
    """run(cores=1) in this process: the threads alive before it (a sleeping one here) are pinned
    too, not only the calling one, and each thread's affinity is what it was afterwards; a child
    process started before the run (another test's server, here a sleeping one) is not the
    pipeline's: neither pinned nor counted in the run's affinity."""
    before = os.sched_getaffinity(0)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="bystander")
    t.start()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        seen = []
        res = train_bench.run(str(data / "out"), None, "resnet18", 32, 8, 2, 1, 1, ["synthetic"], None, "cpu",
                              consumer_ms=1, log=lambda m: seen.append(os.sched_getaffinity(t.native_id)), cores=1)
        assert res.runs[0].error is None and res.runs[0].affinity == [min(before)] and res.threads == 1
        assert seen == [{min(before)}]  # the bystander, pinned while the run was measured
        assert os.sched_getaffinity(0) == before and os.sched_getaffinity(t.native_id) == before
        assert os.sched_getaffinity(other.pid) == before
    finally:
        other.kill()
        other.wait()
        stop.set()
        t.join()


def test_node_cpus_and_dali_loads_refuse_what_cannot_be_measured():
    avail = sorted(os.sched_getaffinity(0))
    assert train_bench.node_cpus(None) == avail and train_bench.node_cpus(1) == avail[:1]
    for bad in (0, -1, len(avail) + 1, 1.5, True):
        with pytest.raises(ConfigError, match="--cores"):
            train_bench.node_cpus(bad)
    assert train_bench.dali_loads(None, "cuda") == (0.65, 0.75, 0.9, 0.99)
    assert train_bench.dali_loads(None, "cpu") == ()  # the value means nothing to DALI's CPU decoder
    assert train_bench.dali_loads("0.65, 0.99,0.65") == (0.65, 0.99) and train_bench.dali_loads(0.5) == (0.5,)
    for bad in ("", "0.5,x", "1.5", "nan", [-0.1]):
        with pytest.raises(ConfigError, match="--dali-load"):
            train_bench.dali_loads(bad)
    assert train_bench.with_loads(["synthetic", "dali", "dali:op=jitter", "dali:load=0.8"], (0.65, 0.99)) == [
        "synthetic", "dali:load=0.65", "dali:load=0.99", "dali:op=jitter,load=0.65", "dali:op=jitter,load=0.99",
        "dali:load=0.8"]
    assert train_bench.with_loads(["dali"], ()) == ["dali"]


def test_summary_against_the_best_dali_and_the_pipelines_gpu_memory_beside_the_model():
    """vs_dali against the fastest plain DALI row (an op's DALI row is no reference); GPU MiB the
    process's least reading minus the synthetic pipeline's (its model and optimiser alone), the
    least because what an earlier pipeline leaves in the process adds to later readings."""
    from recordtool.tools.train_bench import Result, Run

    res = Result("resnet18", 176, 8, "cuda", 4, [0, 1, 2, 3], 4)
    for rate, gpu in ((1000, 1100), (1000, 1000)):
        res.runs.append(Run("synthetic", rate, 0.0, 3, cores_busy=1.0, gpu_mib=gpu, rss_mib=900))
    for name, rate in (("dali:load=0.65", 100), ("dali:load=0.99", 150), ("dali:op=jitter,load=0.9", 300)):
        res.runs.append(Run(name, rate, 1.0, 3, cores_busy=2.0, gpu_mib=2500, rss_mib=1500))
    for gpu, rss, anon in ((3200, 2600, 1200), (3000, 2000, 1300)):
        res.runs.append(Run("recordtool", 180, 1.0, 3, cores_busy=3.5, gpu_mib=gpu, rss_mib=rss, anon_mib=anon))
    res.runs.append(Run("recordtool", float("nan"), float("nan"), 0, "RuntimeError: a failed run counts for nothing"))
    s = res.summary()
    assert train_bench.best_dali(s) == "dali:load=0.99"
    assert s["recordtool"]["vs_dali"] == pytest.approx(1.2) and s["dali:op=jitter,load=0.9"]["vs_dali"] == 2.0
    assert s["recordtool"]["gpu_mib"] == 2000 and s["synthetic"]["gpu_mib"] == 0 and s["dali:load=0.65"]["gpu_mib"] == 1500
    assert s["recordtool"]["cores_busy"] == 3.5 and s["recordtool"]["rss_mib"] == 2000
    assert s["recordtool"]["anon_mib"] == 1200 and s["synthetic"]["anon_mib"] is None  # not measured: None
    text = train_bench.table(res)
    assert "against dali:load=0.99" in text and "4 core(s) (CPUs 0-3)" in text and "median of 3 run(s)" in text
    line = next(x for x in text.splitlines() if x.startswith("recordtool"))
    assert line.split()[-4:] == ["3.5", "2,000", "2,000", "1,200"]
    assert "GPU MiB" in text and "RSS MiB" in text and "anon MiB" in text
    res.runs = [r for r in res.runs if r.pipeline != "synthetic"]  # no model-alone reading: not measured
    assert res.summary()["recordtool"]["gpu_mib"] is None and "–" in train_bench.table(res)
    assert "median of 3 run(s)" in train_bench.table(res)  # the repeats, with no synthetic pipeline too
    assert train_bench.best_dali({"recordtool": {"median": 1.0}}) is None


def test_probe_reports_cores_busy_rss_and_affinity_and_no_gpu_in_the_cpu_form():
    probe = train_step.Probe("cpu", every=0.01)
    probe.start()
    end = time.thread_time() + 0.2
    while time.thread_time() < end:
        pass
    rep = probe.stop()
    assert 0 < rep["cores_busy"] and rep["rss_mib"] > 10 and rep["gpu_mib"] is None
    assert 0 < rep["anon_mib"] <= rep["rss_mib"]
    assert rep["affinity"] == sorted(os.sched_getaffinity(0))


def test_probes_anonymous_rss_leaves_out_a_mapped_files_pages(tmp_path):
    """A file read through mmap (as the Loader reads its shards) counts in the probe's RSS while
    mapped, not in its anonymous RSS: the figure compared between pipelines."""
    import mmap

    path = tmp_path / "shard"
    path.write_bytes(os.urandom(1 << 20) * 64)  # 64 MiB, in the page cache once written
    probe = train_step.Probe("cpu", every=0.01)
    probe.start()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        touched = sum(mm[i] for i in range(0, len(mm), mmap.PAGESIZE))  # every page resident in this process
        rep = probe.stop()
    assert touched > 0  # (random bytes)
    before = train_step.memory_mib()
    assert rep["rss_mib"] - rep["anon_mib"] >= 60, rep  # the file's 64 MiB counted in RSS only
    assert rep["anon_mib"] < before["anon"] + 32, (rep, before)  # and not in the anonymous part


def test_gpu_memory_from_nvidia_smi_for_this_pid_else_none(tmp_path, monkeypatch):
    """The per-process figure nvidia-smi gives for this pid; another pid's line is not this
    process's, and with no CUDA library loaded nothing else answers: None, never a failure."""
    smi = tmp_path / "nvidia-smi"
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    for pid, want in ((os.getpid(), 1234.0), (os.getpid() + 1, None)):
        smi.write_text(f"#!/bin/sh\necho '1, 77'\necho '{pid}, 1234'\n")
        smi.chmod(0o755)
        assert train_step.gpu_used_mib("cuda") == want
    assert train_step.gpu_used_mib("cpu") is None  # the CPU form asks nothing
    smi.write_text("#!/bin/sh\nexit 9\n")
    assert train_step.gpu_used_mib("cuda") is None

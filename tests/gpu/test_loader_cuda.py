"""Loader(device="cuda"): the CPU Loader's batches and pixels, resume, look-ahead, engines ahead, sizes and
crops, run-ahead bound, the split's lead, damaged records, clean exits, bfloat16 / channels_last
and device spellings, the training benchmark on the GPU."""
import time

import numpy as np
import pytest

from gpu_data import psnr
from recordtool.decode.gpu import route
from recordtool.decode.gpu.plan import ENGINE

from .device import NGPU, cupy, needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]


def test_cuda_loader_matches_cpu_loader_and_resumes(packed_mix):
    from recordtool.loader import Loader

    kw = dict(batch_size=8, size=64, seed=4, drop_last=False, as_torch=False, dtype="float32", layout="NHWC")
    cpu_batches = [(np.asarray(x), np.asarray(y)) for x, y in Loader(packed_mix, device="cpu", **kw)]
    gpu_loader = Loader(packed_mix, device="cuda", producers=3, **kw)
    gpu_batches = [(cupy.asnumpy(x), cupy.asnumpy(y)) for x, y in gpu_loader]
    assert len(gpu_batches) == len(cpu_batches) == 6
    std = np.array([0.229, 0.224, 0.225], np.float32)
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    for (xg, yg), (xc, yc) in zip(gpu_batches, cpu_batches):
        assert np.array_equal(yg, yc)
        for a, b in zip(xg, xc):  # back to 0..255 pixels to compare
            assert psnr((a * std + mean) * 255, (b * std + mean) * 255) >= 40
    split = gpu_loader.last_split
    assert split.gpu + split.hybrid + split.cpu == split.n
    assert sum(gpu_loader.decoded.values()) == 41 and set(gpu_loader.decoded) == {"gpu", "hybrid", "cpu"}
    # resume mid-epoch on the GPU: the same batches as the uninterrupted run (bit for bit with a
    # fixed split; the auto split moves images between engines and CPU by measured speed)
    kw["split"] = "gpu"
    gpu_batches = [(cupy.asnumpy(x), None) for x, _ in Loader(packed_mix, device="cuda", producers=3, **kw)]
    part = Loader(packed_mix, device="cuda", producers=2, **kw)
    it = iter(part)
    next(it), next(it)
    state = part.state_dict()
    del it
    part.close()
    resumed = Loader(packed_mix, device="cuda", producers=4, **kw)
    resumed.load_state_dict(state)
    rest = [cupy.asnumpy(x) for x, _ in resumed]
    assert len(rest) == 4
    for a, (b, _) in zip(rest, gpu_batches[2:]):
        assert np.array_equal(a, b)


def test_engines_ahead_give_the_batches_of_one_phase_across_epochs_and_resume(packed_mix):
    """engines_ahead=True: each producer submits its next batch's engines' call while it
    finishes this one — the batches, across an epoch's end and after a resume, are those of
    engines_ahead=False bit for bit (split="gpu"), whatever the producers; the batches after a
    producer's first are begun ahead; off, no second phase is made."""
    from recordtool.loader import Loader

    kw = dict(batch_size=5, size=64, seed=9, drop_last=False, as_torch=False, split="gpu")
    assert not Loader(packed_mix, device="cuda", **kw).gpu.engines_ahead  # off by default
    ref = Loader(packed_mix, device="cuda", producers=1, **kw)
    want = []
    for epoch in range(2):
        ref.set_epoch(epoch)
        want += [cupy.asnumpy(x) for x, _ in ref]
    assert len(ref.backend.decoder(0).phases) == 1
    ref.close()
    for producers in (1, 2, 3):
        ld = Loader(packed_mix, device="cuda", producers=producers, engines_ahead=True, **kw)
        reports, got = [], []
        for epoch in range(2):
            ld.set_epoch(epoch)
            for x, _ in ld:
                got.append(cupy.asnumpy(x))
                reports.append(ld.last_split)
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want)), producers
        dec = ld.backend.decoder(0)
        if dec.hw is not None:
            assert dec.engines_ahead and len(dec.phases) == 2
            assert sum(r.begun_ahead for r in reports) >= len(reports) - 2 * producers, (producers, reports)
        ld.close()
    part = Loader(packed_mix, device="cuda", producers=2, engines_ahead=True, **kw)
    it = iter(part)
    next(it), next(it), next(it)
    state = part.state_dict()
    del it
    part.close()
    resumed = Loader(packed_mix, device="cuda", producers=2, engines_ahead=True, **kw)
    resumed.load_state_dict(state)
    rest = [cupy.asnumpy(x) for x, _ in resumed]
    assert len(rest) == len(want) // 2 - 3 and all(np.array_equal(a, b) for a, b in zip(rest, want[3:]))
    resumed.close()


@pytest.mark.parametrize("dtype,split", [("float32", "auto"), ("float32", "gpu"), ("float16", "gpu")])
def test_cuda_loader_gives_4_4_4_and_gray_bit_for_bit(packed_layouts, dtype, split):
    """same_pixels=True: a cuda Loader's 4:4:4 and gray images are device="cpu"'s,
    bit for bit, normalised values included; the others within the fidelity bound. Without
    it the GPU decodes them and they are not."""
    import recordtool
    from recordtool.decode.gpu.plan import SAME_PIXELS_CHROMA
    from recordtool.loader import Loader

    ds = recordtool.open(packed_layouts)
    same = np.isin(ds.index.chroma, SAME_PIXELS_CHROMA)
    assert same.sum() == 16 and (~same).sum() == 12
    kw = dict(batch_size=8, size=64, seed=3, drop_last=False, as_torch=False, dtype=dtype, layout="NCHW",
              with_ids=True)
    cpu = {i: x for xs, _, ids in Loader(ds, device="cpu", **kw) for i, x in zip(np.asarray(ids).tolist(), xs)}
    std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
    mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
    for same_pixels in (True, False):
        ld = Loader(ds, device="cuda", split=split, same_pixels=same_pixels, **kw)
        equal = {}
        for xs, _, ids in ld:
            for i, x in zip(np.asarray(ids).tolist(), cupy.asnumpy(xs)):
                equal[i] = np.array_equal(x, cpu[i])
                if not same[i]:
                    a, b = (x.astype(np.float32) * std + mean) * 255, (cpu[i].astype(np.float32) * std + mean) * 255
                    assert psnr(a, b) >= 40, i
        assert len(equal) == len(ds)
        if same_pixels:
            assert all(equal[i] for i in np.nonzero(same)[0].tolist())
            if split == "gpu":  # nothing else goes to the CPU
                assert ld.decoded["cpu"] == same.sum(), ld.decoded
        elif split == "gpu":  # ("auto", with no training loop waiting, lets the CPU decode everything)
            assert not any(equal[i] for i in np.nonzero(same)[0].tolist())
            assert ld.decoded["cpu"] == 0, ld.decoded
        ld.close()


def test_images_decoded_ahead_are_the_batchs_own(packed_layouts):
    """A producer's look-ahead lane (decode.gpu.ahead): the CPU-routed images of its next batch,
    decoded before the batch is made, are taken by it (BatchReport.ahead counts them) and the
    batch is, bit for bit, the one its decoder makes without them — and the CPU Loader's pixels
    for those images (same_pixels routes 4:4:4 and gray to the CPU)."""
    import recordtool
    from recordtool.decode.gpu.ahead import AheadLane
    from recordtool.loader import Loader

    ds = recordtool.open(packed_layouts)
    kw = dict(batch_size=7, size=64, seed=3, drop_last=False, as_torch=False, dtype="float32", with_ids=True)
    cpu = {i: x for xs, _, ids in Loader(ds, device="cpu", **kw) for i, x in zip(np.asarray(ids).tolist(), xs)}
    ld = Loader(ds, device="cuda", split="gpu", same_pixels=True, **kw)
    b, taken = ld.backend, 0
    for start in range(0, len(ds), 7):
        ids = np.arange(start, min(start + 7, len(ds)))
        drawn = b.recipe.draws(ids, 2)
        b.announce(ids, 2, 0, drawn)  # slot 0's next batch announced
        for _, jobs in b._lanes[0]._pending:  # let its lane finish (a batch cancels what it has not started)
            for f in jobs.values():
                f.exception(timeout=60)
        with_lane = b.make(ids, 2, 0, drawn)
        got = cupy.asnumpy(with_lane.images[: len(ids)])
        assert with_lane.report.ahead == b._cpu_routed[ids].sum() == with_lane.report.cpu, with_lane.report
        taken += with_lane.report.ahead
        alone = b.make(ids, 2, 1, drawn)  # slot 1 has no lane: nothing announced for it
        assert alone.report.ahead == 0 and 1 not in b._lanes
        assert np.array_equal(got, cupy.asnumpy(alone.images[: len(ids)]))
    assert taken == 16 and isinstance(b._lanes[0], AheadLane)
    ld.close()
    # the Loader itself takes its lanes' images in its epochs: the CPU path's pixels
    from recordtool.decode.gpu.plan import SAME_PIXELS_CHROMA

    ld = Loader(ds, device="cuda", split="gpu", same_pixels=True, **kw)
    same = np.isin(ds.index.chroma, SAME_PIXELS_CHROMA)
    for xs, _, ids in ld:
        for i, x in zip(np.asarray(ids).tolist(), cupy.asnumpy(xs)):
            if same[i]:
                assert np.array_equal(x, cpu[i]), i
    assert ld.decoded["cpu"] == same.sum() and 0 <= ld.ahead <= same.sum()
    ld.close()


@pytest.mark.parametrize("train,crop,user_op", [
    (True, dict(size=(48, 80), scale=(0.2, 0.7), ratio=(0.5, 1.5), hflip=0.3), False),
    (False, dict(size=(80, 48), crop_pct=0.95), False),
    (True, dict(size=(40, 72), hflip=1.0), True),  # the uint8 ring and the normalising pass at h × w
    (False, dict(size=64, crop_pct=0.5), True)])
def test_cuda_loader_sizes_and_crops_match_the_cpu_loader(packed_layouts, train, crop, user_op):
    """size=(h, w), scale, ratio, hflip and crop_pct on cuda: the same windows, flips and labels
    as device="cpu"; 4:4:4 and gray images bit for bit (same_pixels), the others within the
    fidelity bound — with and without a user op (its uint8 batch and pass are h × w)."""
    import recordtool
    from recordtool.decode.gpu.plan import SAME_PIXELS_CHROMA
    from recordtool.loader import Loader

    ds = recordtool.open(packed_layouts)
    same = np.isin(ds.index.chroma, SAME_PIXELS_CHROMA)
    kw = dict(batch_size=8, seed=5, train=train, drop_last=False, as_torch=False, layout="NHWC", with_ids=True, **crop)
    cpu = {i: (x, y) for xs, ys, ids in Loader(ds, device="cpu", **kw)
           for i, x, y in zip(np.asarray(ids).tolist(), xs, ys)}
    op = (lambda b: b) if user_op else None
    ld = Loader(ds, device="cuda", split="gpu", user_op=op, same_pixels=True, **kw)
    h, w = ld.output.size
    std = np.array([0.229, 0.224, 0.225], np.float32)
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    seen = 0
    for xs, ys, ids in ld:
        assert xs.shape[1:] == (h, w, 3)
        for i, x, y in zip(np.asarray(ids).tolist(), cupy.asnumpy(xs), cupy.asnumpy(ys)):
            xc, yc = cpu[i]
            assert y == yc
            if same[i]:
                assert np.array_equal(x, xc), i
            else:
                assert psnr((x * std + mean) * 255, (xc * std + mean) * 255) >= 40, i
            seen += 1
    assert seen == len(ds)
    ld.close()


def test_cuda_loader_bounds_how_far_the_training_loop_runs_ahead(packed_mix):
    """run_ahead=1 (the default): when batch k is handed out, the GPU work the loop queued
    before it took batch k - 1 has finished — the Loader slept for it — while the loop still
    had a step queued; the batches are those of an unbounded Loader. CuPy batches (as_torch=False)
    and the loop's work on the default stream, which torch's current stream is: no label copy to
    torch synchronises the hand-out, so the Loader's own wait is what is measured.
    Why one long step after a pause: the producers' nvJPEG calls themselves wait for work queued
    on the default stream, so batches made while a step is queued are ready only after it; the
    pause lets them make the next batches first, and batch 3's wait is then the Loader's alone —
    step 1, about a second — whatever else shares the GPU."""
    torch = pytest.importorskip("torch")
    from recordtool.loader import Loader

    torch.cuda.init()  # the consumer's stream is torch's current one (the default stream here)
    kw = dict(batch_size=8, size=64, device="cuda", dtype="float16", split="gpu", seed=3, as_torch=False)
    assert Loader(packed_mix, **kw).gpu.run_ahead == 1
    sums = {}
    for ahead in (1, None):
        ld = Loader(packed_mix, run_ahead=ahead, **kw)
        assert (ld.backend._pace is None) == (ahead is None)
        done, sums[ahead] = [], []
        for k, (x, _) in enumerate(ld):
            if ahead is not None and k >= 2:
                assert done[k - 2].query(), (k, ld.stage_seconds)  # the step before last is finished
            if k == 3 and ahead is not None:
                assert ld.stage_seconds["run_ahead"] > 0.5, ld.stage_seconds  # it slept on step 1
            sums[ahead].append(x.astype(cupy.float32).sum())
            if k == 1:
                time.sleep(1.0)  # the producers make batches 2 and 3 (and more) meanwhile
            torch.cuda._sleep(3_000_000_000 if k == 1 else 20_000_000)  # step 1: ~1.5 s of GPU time
            ev = torch.cuda.Event()
            ev.record()
            done.append(ev)
        torch.cuda.synchronize()
        ld.close()
    assert [float(v) for v in sums[1]] == [float(v) for v in sums[None]], sums


def test_cuda_loader_leads_with_the_engines_whatever_the_threads(packed_mix):
    """The Loader's split="auto" gives the engines the lead at any number of CPU threads;
    first="cpu" gives it to the CPU. Before the consumer has waited, the lead side decodes every
    image it can take."""
    from recordtool.loader import Loader

    kw = dict(batch_size=8, size=64, device="cuda", as_torch=False, same_pixels=False, with_ids=True)
    few = Loader(packed_mix, threads=4, **kw)
    many = Loader(packed_mix, threads=16, **kw)
    named = Loader(packed_mix, threads=16, first="cpu", **kw)
    assert (few.backend.demand.first, many.backend.demand.first, named.backend.demand.first) == \
        ("engines", "engines", "cpu")
    ix = __import__("recordtool").open(packed_mix).index
    routes = route(ix.chroma, ix.progressive, ix.colorspace)
    for ld, lead in ((few, "gpu"), (many, "gpu"), (named, "cpu")):
        _, _, ids = next(iter(ld))  # nobody has waited yet: the lead side takes what it can
        engines = int((routes[np.asarray(ids)] == ENGINE).sum())
        if ld.backend.decoder(0).hw is not None and engines:
            assert ld.last_split.gpu == (engines if lead == "gpu" else 0), ld.last_split
    for ld in (few, many, named):
        ld.close()


def test_cuda_loader_names_a_damaged_record(packed_mix, tmp_path):
    from test_loader import _damaged_copy

    from recordtool.loader import Loader, RecordError

    ix = __import__("recordtool").open(packed_mix).index
    engine = int(np.nonzero(route(ix.chroma, ix.progressive, ix.colorspace, same_pixels=True) == ENGINE)[0][3])
    path, shard, off = _damaged_copy(packed_mix, tmp_path, engine)
    ld = Loader(path, batch_size=8, size=64, device="cuda", as_torch=False)
    with pytest.raises(RecordError, match=f"record {engine} .*{shard}.*offset {off}"):
        for _ in ld:
            pass


@pytest.mark.parametrize("how", ["abandoned", "break", "collected"])
def test_cuda_script_leaving_a_loader_exits_cleanly(packed_mix, tmp_path, how):
    import subprocess
    import sys

    from test_loader import _EXIT_SCRIPT

    script = tmp_path / "leave.py"
    script.write_text(_EXIT_SCRIPT)
    p = subprocess.run([sys.executable, str(script), how, packed_mix, "cuda"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "end of script" in p.stdout, (p.returncode, p.stderr[-2000:])


def test_cuda_loader_bfloat16_channels_last_and_device_spellings(packed_mix):
    torch = pytest.importorskip("torch")
    from recordtool.errors import DeviceUnavailable
    from recordtool.loader import Loader

    kw = dict(batch_size=8, size=48, seed=1, split="gpu", train=False)
    ref = [x.clone() for x, _ in Loader(packed_mix, device="cuda:0", **kw)]  # float32 NCHW
    ld = Loader(packed_mix, device=torch.device("cuda", 0), dtype="bfloat16", memory_format="channels_last", **kw)
    assert ld.gpu_id == 0
    got = [x for x, _ in ld]
    assert len(got) == len(ref) == 6  # 41 records, eval: nothing dropped
    for x, r in zip(got, ref):
        assert x.is_cuda and x.dtype == torch.bfloat16 and x.shape == r.shape
        assert x.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(x, r.to(torch.bfloat16))
    big = Loader(packed_mix, device=0, batch_size=4000, size=32, train=False, as_torch=False)
    assert big.ring.shape[0] == 41 and len([x for x, _ in big]) == 1  # the ring holds the rank's share
    with pytest.raises(DeviceUnavailable, match="sees"):
        Loader(packed_mix, device=f"cuda:{NGPU}", batch_size=8)


def test_training_bench_at_a_node_share_reports_cores_and_memory(packed_mix):
    """bench --train on the GPU at 2 cores: every run pinned there, cores busy and host RSS
    measured, the device memory the process holds read (nvidia-smi for this pid, else
    memGetInfo), the Loader's share beside the model above the synthetic pipeline's. (DALI is
    left out: this set's CMYK file is not for it; scripts/device_run.sh's trainbench runs it.)"""
    import os

    pytest.importorskip("torch")
    from recordtool.tools import train_bench

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    res = train_bench.run(packed_mix, None, "tiny", 32, 8, 3, 2, 1, ["synthetic", "recordtool"], None, "cuda",
                          log=lambda m: None, cores=2)
    cpus = sorted(os.sched_getaffinity(0))[:2]
    assert res.threads == 2 and res.cpus == cpus
    for r in res.runs:
        assert r.error is None, r
        assert r.affinity == cpus and r.cores_busy > 0 and r.rss_mib > 0 and r.gpu_mib > 0, r
    s = res.summary()
    # the pipeline's memory is its reading less the synthetic one's; with this tiny model and batch
    # the two differ by less than what the caching allocators hold, so only its form is checked here
    # (the training benchmark's rows, ResNet at batch 256/512, are where the difference means something)
    assert s["synthetic"]["gpu_mib"] == 0 and isinstance(s["recordtool"]["gpu_mib"], (int, float)), s

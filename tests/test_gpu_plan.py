"""The GPU path's planning, checked without a GPU: routing from the index columns, the
arena's room, the split planner and its demand, the refusals that keep files from the hybrid
decoder, and options validated before CUDA is touched."""
import numpy as np
import pytest

from gpu_data import mixed_jpegs
from recordtool.decode.gpu import route
from recordtool.decode.gpu.plan import CPU, ENGINE, HYBRID, hardware_decodable
from recordtool.decode.options import GPUOptions
from recordtool.format.jpeg import CHROMA_411, CHROMA_420, CHROMA_422, CHROMA_GRAY, CS_CMYK, CS_GRAY, CS_YCBCR


def test_routing_from_index_columns():
    chroma = np.array([CHROMA_420, CHROMA_422, CHROMA_420, CHROMA_411, CHROMA_GRAY, -1])
    prog = np.array([0, 0, 1, 0, 0, 0])
    cs = np.array([CS_YCBCR, CS_YCBCR, CS_YCBCR, CS_YCBCR, CS_GRAY, CS_CMYK])
    assert hardware_decodable(chroma, prog, cs).tolist() == [True, True, False, False, False, False]
    # progressive and gray to nvJPEG's hybrid decoder; 4:1:1 and CMYK to the CPU
    assert route(chroma, prog, cs).tolist() == [ENGINE, ENGINE, HYBRID, CPU, HYBRID, CPU]


def test_same_pixels_routes_4_4_4_and_gray_to_the_cpu():
    from recordtool.format.jpeg import CHROMA_444

    chroma = np.array([CHROMA_444, CHROMA_444, CHROMA_GRAY, CHROMA_GRAY, CHROMA_420, CHROMA_422, CHROMA_420, -1])
    prog = np.array([0, 1, 0, 1, 0, 0, 1, 0])
    cs = np.array([CS_YCBCR] * 2 + [CS_GRAY] * 2 + [CS_YCBCR] * 3 + [CS_CMYK])
    assert route(chroma, prog, cs).tolist() == [ENGINE, HYBRID, HYBRID, HYBRID, ENGINE, ENGINE, HYBRID, CPU]
    # nothing to upsample in them: the CPU path decodes them itself; the rest routes as before
    assert route(chroma, prog, cs, same_pixels=True).tolist() == [CPU, CPU, CPU, CPU, ENGINE, ENGINE, HYBRID, CPU]


def test_images_past_the_gpu_size_go_to_their_own_engines_decoder_and_the_buffers_take_the_largest_layout():
    """route(pixels=): above GPU_MAX_PIXELS an engines' image is LARGE (the engines, on a decoder
    of their own) and a hybrid one goes to the CPU path (the batch's decoders' buffers are sized
    by the largest image they see; 4:1:1 stays on the CPU, with same_pixels 4:4:4 too); above
    LARGE_MAX_PIXELS every image goes to the CPU path;
    largest_layout: the engines' buffers are pre-allocated for the widest layout they will see."""
    from recordtool.decode.gpu.decoder import largest_layout
    from recordtool.decode.gpu.plan import GPU_MAX_PIXELS, LARGE, LARGE_MAX_PIXELS
    from recordtool.format.jpeg import CHROMA_411, CHROMA_440, CHROMA_444

    chroma = np.array([CHROMA_420, CHROMA_420, CHROMA_422, CHROMA_422, CHROMA_411, CHROMA_444])
    prog, cs = np.array([0, 0, 1, 1, 0, 0]), np.array([CS_YCBCR] * 6)
    big = 4500 * 3000
    pixels = np.array([GPU_MAX_PIXELS, GPU_MAX_PIXELS + 1, GPU_MAX_PIXELS, big, big, big])
    assert route(chroma, prog, cs, pixels=pixels).tolist() == [ENGINE, LARGE, HYBRID, CPU, CPU, LARGE]
    assert route(chroma, prog, cs, pixels=pixels, same_pixels=True).tolist() == [ENGINE, LARGE, HYBRID, CPU, CPU, CPU]
    assert route(chroma, prog, cs).tolist() == [ENGINE, ENGINE, HYBRID, HYBRID, CPU, ENGINE]
    # past LARGE_MAX_PIXELS nothing goes to a GPU decoder (an index row claiming a huge image
    # would size every producer's large-images decoder, arena and staging at warm-up)
    huge = np.array([LARGE_MAX_PIXELS, LARGE_MAX_PIXELS + 1, 65_500 * 65_500, LARGE_MAX_PIXELS + 1, 10**12, 10**12])
    assert route(chroma, prog, cs, pixels=huge).tolist() == [LARGE, CPU, CPU, CPU, CPU, CPU]
    assert largest_layout([CHROMA_420, CHROMA_420]) == CHROMA_420
    assert largest_layout([CHROMA_420, CHROMA_440]) == CHROMA_440
    assert largest_layout([CHROMA_420, CHROMA_422, CHROMA_444]) == CHROMA_444
    assert largest_layout(None) == largest_layout([]) == CHROMA_444


def test_planar_need_is_what_place_planar_gives_a_whole_image():
    """room.planar_need (the warm-up's estimate from index columns) equals the arena bytes
    place_planar's layout gives each whole image at its chroma layout (PlaneLayout.total, with
    nvJPEG's plane sizes equal to libjpeg's), and 4:4:4 where the layout is unknown."""
    from recordtool.decode.gpu.room import PlaneLayout, planar_need
    from recordtool.format.jpeg import CHROMA_440, CHROMA_444

    layouts = {CHROMA_444: (1, 1), CHROMA_422: (2, 1), CHROMA_420: (2, 2), CHROMA_440: (1, 2), CHROMA_GRAY: (0, 0)}
    rng = np.random.default_rng(0)
    for code, (hs, vs) in layouts.items():
        w, h = rng.integers(1, 3000, 50), rng.integers(1, 3000, 50)
        cw = np.where(hs == 0, 0, -(-w // max(hs, 1)))
        ch = np.where(hs == 0, 0, -(-h // max(vs, 1)))
        dims = np.stack([w, h, np.full(50, hs), np.full(50, vs), w, h, cw, ch], 1)
        assert np.array_equal(planar_need(w, h, np.full(50, code)), PlaneLayout(dims).total), code
    w, h = np.array([640, 33]), np.array([480, 17])
    assert np.array_equal(planar_need(w, h, [-1, 99]), planar_need(w, h))  # unknown: as 4:4:4
    assert np.array_equal(planar_need(w, h), planar_need(w, h, [CHROMA_444] * 2))


def test_batch_room_holds_random_batches_of_a_heavy_tailed_set():
    """room.batch_room: all of a set smaller than a batch; between the largest record and the
    batch's largest records at once; and a random batch of an ImageNet-like mix (a 0.3 % tail
    of images 40× the typical one) fits it — checked over many drawn batches."""
    from recordtool.decode.gpu.room import batch_room

    assert batch_room([5, 7, 9], 8) == 21 and batch_room([], 8) == 0
    rng = np.random.default_rng(1)
    need = np.where(rng.random(8192) < 0.003, rng.integers(8_000_000, 18_000_000, 8192),
                    rng.integers(50_000, 400_000, 8192))
    room = batch_room(need, 256)
    top = np.sort(need)[::-1][:256].sum()
    assert need.max() <= room < top / 2  # far less than the 256 largest at once
    sums = np.array([need[rng.choice(len(need), 256, replace=False)].sum() for _ in range(4000)])
    assert (sums > room).mean() < 0.002


def test_planner_routes_eoi_and_fixed_splits():
    from recordtool.decode.gpu.plan import SplitPlanner, ends_with_eoi

    routes = np.array([ENGINE] * 6 + [HYBRID] * 2 + [CPU] * 2, np.int8)
    bufs = [b"\xff\xd8..\xff\xd9"] * 10
    bufs[1] = b"\xff\xd8..truncated"  # no EOI: libjpeg must see it (GPU decoders do not report truncation)
    eoi = ends_with_eoi(bufs)
    assert eoi.tolist() == [True, False] + [True] * 8
    p = SplitPlanner("gpu").plan(routes, eoi)
    assert p.engine.tolist() == [0, 2, 3, 4, 5] and p.hybrid.tolist() == [6, 7]
    assert sorted(p.cpu.tolist()) == [1, 8, 9] and p.forced == 3 and p.n == 10
    p = SplitPlanner("cpu").plan(routes, eoi)
    assert len(p.engine) == len(p.hybrid) == 0 and sorted(p.cpu.tolist()) == list(range(10))
    p = SplitPlanner(0.5).plan(routes, eoi)  # half the batch on the CPU: forced ones + engine images
    assert len(p.cpu) == 5 and p.cpu[:3].tolist() == [1, 8, 9] and len(p.engine) == 3
    p = SplitPlanner("gpu", engines=True, hybrid=False).plan(routes, eoi)
    assert len(p.hybrid) == 0 and {6, 7} <= set(p.cpu.tolist())
    p = SplitPlanner("auto", engines=False).plan(routes, eoi)  # no engines here
    assert len(p.engine) == 0 and {0, 2, 3, 4, 5} <= set(p.cpu.tolist())


def test_demand_engines_first_keeps_the_cpu_share_to_what_the_consumer_waits_for():
    """Engines first: with a consumer that never waits the CPU takes no engine image whatever
    the measured rates say; while it waits, the CPU share grows up to the balanced one."""
    from recordtool.decode.gpu.plan import Demand, SplitPlanner

    routes = np.array([ENGINE] * 90 + [CPU] * 10, np.int8)
    eoi = np.ones(100, bool)
    demand = Demand(first="engines")
    p = SplitPlanner("auto", demand=demand)
    p.observe(100, 50, 0.01, 50, 0.01)  # equal rates: balanced share 0.5
    assert p.cpu_fraction == pytest.approx(0.5)
    for _ in range(20):  # a consumer that finds every batch ready
        demand.observe(wait=0.0, interval=0.05)
    assert demand.allowed == 0.0
    plan = p.plan(routes, eoi)
    assert len(plan.cpu) == plan.forced == 10 and len(plan.engine) == 90  # only what no GPU decoder takes
    for k in range(3):  # a consumer waiting 6 ms of each 50 ms step: 12 %, 10 points past the threshold
        demand.observe(wait=0.006, interval=0.05)
    assert demand.allowed == pytest.approx(0.3)
    assert len(p.plan(routes, eoi).cpu) == 30
    for _ in range(20):
        demand.observe(wait=0.02, interval=0.05)
    assert demand.allowed == demand.ceiling and len(p.plan(routes, eoi).cpu) == 50  # the balanced share caps it
    demand.observe(wait=0.0005, interval=0.05)  # 1 %, under the threshold: the share shrinks by the difference
    assert demand.allowed == pytest.approx(demand.ceiling - demand.gain * (demand.threshold - 0.01))
    fixed = SplitPlanner(0.25, demand=Demand(first="engines"))  # a fixed split is what the user asked for
    assert len(fixed.plan(routes, eoi).cpu) == 25


def test_engines_first_moves_engine_images_to_the_cpu_only_where_it_pays():
    """Engines first, a consumer that always waits: the balanced share goes to the CPU only
    where it shortens the predicted batch by MIN_GAIN — not a CPU at ~2 % of the engines' rate
    (a node's share of cores), but one at ~15 %; the CPU first is not filtered; unmeasured
    rates keep the share (paying_share is its own reference: the predicted times by hand)."""
    from recordtool.decode.gpu.plan import Demand, SplitPlanner
    from recordtool.decode.gpu.plan import MIN_GAIN, Rates, paying_share

    routes = np.array([ENGINE] * 500 + [CPU] * 2, np.int8)
    eoi = np.ones(502, bool)

    def planner(first, rg, rc):
        demand = Demand(first=first)
        for _ in range(20):
            demand.observe(wait=0.02, interval=0.05)
        p = SplitPlanner("auto", demand=demand)
        p.observe(502, 500, 500 / rg, 10, 10 / rc)
        assert p.rates.gpu == pytest.approx(rg) and p.cpu_fraction == pytest.approx(rc / (rc + rg))
        return p

    slow = planner("engines", 7000, 150)  # balanced: 11 images, 73 ms on the CPU against 71 ms
    plan = slow.plan(routes, eoi)
    assert len(plan.cpu) == plan.forced == 2 and len(plan.engine) == 500
    fast = planner("engines", 6500, 1000)  # balanced: 67 images, 77 → 67 ms
    plan = fast.plan(routes, eoi)
    assert len(plan.cpu) == 67 and plan.forced == 2 and len(plan.engine) == 435
    cpu_first = planner("cpu", 7000, 150)  # the CPU first: its share is the balanced one at least
    assert len(cpu_first.plan(routes, eoi).cpu) >= 11
    r = Rates(gpu=6500.0, cpu=1000.0)
    before, after = 500 / 6500, max(435 / 6500, 67 / 1000)
    assert (before - after >= MIN_GAIN * before) and paying_share(500, 2, 65, r) == 65
    before, after = 500 / 7000, max(491 / 7000, 11 / 150)
    assert after > before and paying_share(500, 2, 9, Rates(gpu=7000.0, cpu=150.0)) == 0
    assert paying_share(500, 2, 9, Rates(gpu=7000.0)) == 9  # the CPU not measured yet
    assert paying_share(500, 2, 0, Rates(gpu=7000.0, cpu=150.0)) == 0


def test_demand_cpu_first_gives_the_engines_only_what_the_consumer_waits_for():
    """The CPU first (GPUOptions(first="cpu")): with a consumer that never waits the engines take
    nothing whatever the rates say (hybrid images but the two that keep its rate measured go to
    the CPU too); while it waits, the engines' share grows up to the balanced split; when the
    waiting stops it shrinks back."""
    from recordtool.decode.gpu.plan import Demand, SplitPlanner
    from recordtool.loader.config import GPUOptions

    assert Demand().first == GPUOptions().first == "engines"  # a Demand made outside a Loader: the same order
    routes = np.array([ENGINE] * 80 + [HYBRID] * 10 + [CPU] * 10, np.int8)
    eoi = np.ones(100, bool)
    demand = Demand(first="cpu")
    p = SplitPlanner("auto", demand=demand)
    plan = p.plan(routes, eoi)  # nothing measured, nobody waited: the CPU takes the engines' images
    assert len(plan.engine) == 0 and len(plan.cpu) == 90 and len(plan.hybrid) == 10
    p.observe(100, 40, 0.01, 40, 0.01, 10, 0.01)  # equal rates: balanced share 0.5
    assert p.cpu_fraction == pytest.approx(0.5)
    for _ in range(20):
        demand.observe(wait=0.0, interval=0.05)
    plan = p.plan(routes, eoi)
    assert len(plan.engine) == 0 and len(plan.hybrid) == 2 and len(plan.cpu) == 98
    for _ in range(2):  # a consumer waiting 6 ms of each 50 ms step
        demand.observe(wait=0.006, interval=0.05)
    assert demand.allowed == pytest.approx(0.2)
    plan = p.plan(routes, eoi)
    assert len(plan.cpu) == 80 and len(plan.engine) == 20 - len(plan.hybrid)
    for _ in range(20):
        demand.observe(wait=0.02, interval=0.05)
    assert demand.allowed == demand.ceiling
    plan = p.plan(routes, eoi)  # the balanced share caps the engines' share
    assert len(plan.cpu) == 50 and len(plan.engine) == 40
    for _ in range(60):
        demand.observe(wait=0.0005, interval=0.05)  # 1 % of the time, under the threshold
    assert demand.allowed == pytest.approx(demand.ceiling - 60 * demand.gain * (demand.threshold - 0.01))
    assert len(p.plan(routes, eoi).cpu) == 60  # the engines' share shrinks below the balanced one


def test_demand_follows_the_time_the_consumer_waits_not_the_batches_it_waited_for():
    """Demand settles where the consumer waits `threshold` of its time: bursty waits (30 ms once
    in six 58 ms steps, ~9 % of the time) grow the other side's share though five batches in
    six are ready — a count of batches waited for would give none —, steady short waits under
    the threshold give it back, and a wait past the interval counts as the whole interval.
    A consumer whose waits shrink as the share grows (a model of the loop) ends near the
    threshold, neither at 0 nor at the ceiling."""
    from recordtool.decode.gpu.plan import Demand

    demand = Demand(first="engines")
    for _ in range(10):  # ten bursts of six steps
        demand.observe(wait=0.030, interval=0.058)
        for _ in range(5):
            demand.observe(wait=0.0, interval=0.058)
    # per burst +(30/58 - 0.02), then 5 × -0.02: up to the ceiling, less the last five ready batches
    assert demand.allowed == pytest.approx(demand.ceiling - 5 * demand.threshold)
    first = Demand(first="engines")
    first.observe(wait=0.030, interval=0.058)
    assert first.allowed == pytest.approx(0.030 / 0.058 - first.threshold)
    for _ in range(400):  # 1 ms of 58 (1.7 %): ready enough, the share shrinks by 0.3 points a batch
        demand.observe(wait=0.001, interval=0.058)
    assert demand.allowed == 0.0
    demand.observe(wait=5.0, interval=0.058)  # the first batch after a pause: at most the interval
    assert demand.allowed == pytest.approx(1.0 - demand.threshold)
    demand.observe(wait=0.01, interval=0.0)  # no interval measured yet: not a wait
    assert demand.allowed == pytest.approx(1.0 - 2 * demand.threshold)
    loop = Demand(first="engines")
    waits = []
    for _ in range(400):  # the loop waits 10 % of 50 ms with no share, nothing with half of the batch
        w = max(0.0, 0.005 * (1 - 2 * loop.allowed))
        waits.append(w / 0.05)
        loop.observe(wait=w, interval=0.05)
    assert 0.3 < loop.allowed < 0.5 and np.mean(waits[-100:]) == pytest.approx(loop.threshold, abs=0.005)


def test_demand_cpu_first_measures_the_engines_on_small_batches():
    """The CPU first with the CPU's rate known and the engines' not: the engines' share follows
    the demand alone (not the half-and-half placeholder balance), so a consumer that waits gets
    them on batches too small for half of one to measure a rate; then the balance takes over.
    Bad Demand values are ConfigErrors (ValueErrors too); its `first` is GPUOptions', checked there."""
    from recordtool.decode.gpu.plan import Demand, SplitPlanner
    from recordtool.errors import ConfigError

    routes = np.array([ENGINE] * 12, np.int8)
    eoi = np.ones(12, bool)
    demand = Demand(first="cpu")
    p = SplitPlanner("auto", demand=demand)
    for _ in range(12):  # a consumer that always waits; the engines 3× the CPU's rate
        plan = p.plan(routes, eoi)
        ne, nc = len(plan.engine), len(plan.cpu)
        p.observe(12, ne, ne / 3000 if ne else None, nc, nc / 1000 if nc else None)
        demand.observe(wait=0.02, interval=0.05)
    assert p.rates.gpu == pytest.approx(3000) and p.cpu_fraction == pytest.approx(0.25)
    assert len(p.plan(routes, eoi).cpu) == 3  # the balanced share, now that both rates are known
    for bad in (dict(gain=1.5), dict(ceiling=-0.1), dict(threshold="x"), dict(gain=True)):
        with pytest.raises(ConfigError):
            Demand(**bad)


def test_planner_gives_large_images_to_the_engines_first_and_never_to_the_cpu_share():
    """Route.LARGE images go to the engines whatever the split asks of the engines' images
    (on the CPU one costs 20-40 ms of a core), first in the engines' list (the batch's room is
    given in order); to the CPU only where the engines are not used (split="cpu", no engines,
    paused) or the file has no EOI."""
    from recordtool.decode.gpu.plan import SplitPlanner, ends_with_eoi
    from recordtool.decode.gpu.plan import LARGE

    routes = np.array([ENGINE] * 6 + [LARGE, HYBRID, CPU, LARGE], np.int8)
    eoi = np.ones(10, bool)
    for split in ("gpu", "auto", 0.5, 1.0):
        p = SplitPlanner(split).plan(routes, eoi)
        assert p.engine[:2].tolist() == [6, 9] and not {6, 9} & set(p.cpu.tolist()), split
        assert p.n == 10 and p.forced == 1
    assert len(SplitPlanner(1.0).plan(routes, eoi).engine) == 2  # a CPU share of everything it may take
    for p in (SplitPlanner("cpu"), SplitPlanner("auto", engines=False)):
        assert {6, 9} <= set(p.plan(routes, eoi).cpu.tolist())
    paused = SplitPlanner("auto")
    paused.paused = 3
    assert {6, 9} <= set(paused.plan(routes, eoi).cpu.tolist())
    bufs = [b"\xff\xd8..\xff\xd9"] * 10
    bufs[9] = b"\xff\xd8..truncated"
    p = SplitPlanner("gpu").plan(routes, ends_with_eoi(bufs))
    assert p.engine[:1].tolist() == [6] and 9 in p.cpu.tolist()


@pytest.mark.parametrize("split", ["auto", "gpu"])
def test_planner_pauses_engines_that_refuse_every_batch_and_retries_them(split):
    """Engines that refuse every batch (the CPU redoes each one) and so never get a rate: after
    ENGINES_OFF_AFTER refusals in a row they get no images for ENGINES_RETRY_AFTER batches
    (observe says so once, for the decoder's warning), then one batch again; a refused retry
    doubles the pause, a decoded one ends the pauses; refusals with a success between them do
    not add up."""
    from recordtool.decode.gpu.plan import Demand, SplitPlanner

    routes = np.array([ENGINE] * 16, np.int8)
    eoi = np.ones(16, bool)
    demand = Demand(first="cpu")
    p = SplitPlanner(split, demand=demand)
    p.ENGINES_RETRY_AFTER = 5

    def run(batches, works=False):
        sent, stops = [], []
        for _ in range(batches):  # a consumer that always waits: the CPU-first share keeps moving to the engines
            plan = p.plan(routes, eoi)
            ne = len(plan.engine)
            sent.append(ne > 0)
            ok = works and ne > 0
            stops.append(p.observe(16, ne if ok else 0, ne / 4000 if ok else None, 16 - ne if ok else 16, 0.016,
                                   engines_failed=ne > 0 and not works))
            demand.observe(wait=0.02, interval=0.05)
        return sent, stops

    sent, stops = run(12)
    first = sent.index(True)
    off = first + SplitPlanner.ENGINES_OFF_AFTER - 1  # the batch of the third refusal
    # paused for 5 batches, one retry (refused: paused for 10), the batches after it paused
    assert sent[first:] == [True] * SplitPlanner.ENGINES_OFF_AFTER + [False] * 5 + [True] + [False] * (3 - first)
    assert stops == [k == off for k in range(12)] and p.paused == 10 - (3 - first) and p.pause == 10
    sent, stops = run(p.paused + 1, works=True)  # the pause ends; the engines decode again
    assert sent == [False] * (len(sent) - 1) + [True] and not any(stops) and p.pause == p.refused == 0
    q = SplitPlanner(split)
    for failed in (True, True, False, True, True, False, True):
        q.observe(16, 0 if failed else 12, None if failed else 0.01, 16, 0.016, engines_failed=failed)
    assert q.paused == 0 and q.refused == 1 and len(q.plan(routes, eoi).engine) > 0


def test_planner_auto_split_follows_measured_rates():
    from recordtool.decode.gpu.plan import SplitPlanner

    pl = SplitPlanner("auto")
    routes = np.full(100, ENGINE, np.int8)
    eoi = np.ones(100, bool)
    assert len(pl.plan(routes, eoi).cpu) == 0
    pl.observe(100, 100, 0.01, 0, None)  # engines measured, CPU not yet: send it a few to measure
    assert 0 < len(pl.plan(routes, eoi).cpu) <= 10
    for _ in range(30):  # engines 4× as fast as the CPU: the CPU should get ~1/5
        p = pl.plan(routes, eoi)
        pl.observe(100, len(p.engine), len(p.engine) / 8000, len(p.cpu), len(p.cpu) / 2000)
    assert abs(pl.cpu_fraction - 0.2) < 0.02 and abs(len(pl.plan(routes, eoi).cpu) - 20) <= 2
    # the hybrid decoder gets what it finishes while the engines do their part, the rest the CPU
    routes[:50] = HYBRID
    pl.rates.hybrid = 500.0
    p = pl.plan(routes, eoi)
    t_engines = 50 * (1 - pl.cpu_fraction) / pl.rates.gpu
    assert len(p.hybrid) == max(2, int(500.0 * t_engines)) and p.n == 100
    pl.hybrid_lanes = 3  # three hybrid decoders finish three times as many
    p = pl.plan(routes, eoi)
    assert len(p.hybrid) == max(2, int(500.0 * 3 * t_engines)) and p.n == 100


def test_lane_parts_balance_bytes_and_keep_every_position_once():
    """A batch's hybrid images over the lanes: every position once, each part ascending, the
    largest file in the first part (lane 0's decoder is sized for it), no part empty, and the
    parts' bytes as even as largest-first placement makes them."""
    from recordtool.decode.gpu.plan import lane_parts

    rng = np.random.default_rng(0)
    for n, k in [(1, 3), (2, 3), (7, 1), (13, 2), (13, 3), (40, 4), (5, 8)]:
        sizes = rng.integers(1_000, 300_000, n)
        sizes[rng.integers(n)] = 5_000_000  # one large file
        parts = lane_parts(sizes, k)
        assert len(parts) == min(k, n) and all(len(p) for p in parts)
        assert sorted(np.concatenate(parts).tolist()) == list(range(n))
        assert all((np.diff(p) > 0).all() for p in parts)
        assert int(np.argmax(sizes)) in parts[0].tolist()
    assert lane_parts([], 3) == []
    # the large file alone in a lane, the small ones beside each other: 90 bytes each
    assert [p.tolist() for p in lane_parts([10, 10, 90, 10, 10, 10, 10, 10, 10, 10], 2)] == [[2], [0, 1, 3, 4, 5, 6, 7, 8, 9]]
    assert [p.tolist() for p in lane_parts([10, 10, 10, 10], 2)] == [[0, 2], [1, 3]]


def test_hybrid_lanes_are_the_fewest_that_finish_within_the_engines():
    """All lanes while a rate is unmeasured; then the fewest whose images at one lane's measured
    rate fit HYBRID_SLACK of the engines' predicted time; never more than the images or the
    lanes made."""
    from recordtool.decode.gpu.plan import hybrid_lanes

    assert hybrid_lanes(0, None, None, 3) == 0
    assert hybrid_lanes(10, None, 0.05, 3) == 3 and hybrid_lanes(10, 400.0, None, 3) == 3
    assert hybrid_lanes(2, None, None, 3) == 2
    assert hybrid_lanes(10, 400.0, 0.05, 3) == 1  # a lane does 15 in 0.75 of the engines' 50 ms
    assert hybrid_lanes(15, 400.0, 0.05, 3) == 1 and hybrid_lanes(16, 400.0, 0.05, 3) == 2
    assert hybrid_lanes(30, 400.0, 0.05, 3) == 2 and hybrid_lanes(31, 400.0, 0.05, 3) == 3
    assert hybrid_lanes(200, 400.0, 0.05, 3) == 3  # more than three lanes finish: all there are
    assert hybrid_lanes(10, 400.0, 0.001, 3) == 3  # engines' time below one image a lane
    assert hybrid_lanes(5, 400.0, 0.05, 1) == 1


def test_hostile_multiscan_files_never_reach_the_hybrid_decoder():
    """A progressive file with thousands of scans, or one declaring 8192² in 156 bytes, is
    refused by the decoders' rule before nvJPEG's hybrid decoder sees it (no GPU needed to check
    the routing; on a GPU the CPU path then names it)."""
    from hostile_data import bomb_progressive, many_scans

    from recordtool.decode.gpu.decoder import _refused

    assert _refused(many_scans()) and _refused(bomb_progressive())
    assert not _refused(mixed_jpegs(5)[0][4])  # an ordinary progressive file goes to the hybrid decoder


def test_refusal_routing_remembers_the_records_that_passed(monkeypatch):
    """refuse_hybrid routes a refused HYBRID image to the CPU; with ids and a decoder's set, a
    record that passed is not parsed again (the batch's planning holds the GIL), while a record
    whose bytes now have another length is parsed again — and its reference, the loop without
    the set, routes every batch the same way."""
    from hostile_data import many_scans

    from recordtool.decode.gpu import decoder as D
    from recordtool.decode.gpu.plan import CPU, ENGINE, HYBRID

    good, bad = mixed_jpegs(5)[0][4], many_scans()
    parsed = []
    real = D._refused
    monkeypatch.setattr(D, "_refused", lambda data: parsed.append(len(data)) or real(data))
    routes0 = np.array([HYBRID, ENGINE, HYBRID, HYBRID])
    cleared: set = set()
    for batch in range(3):
        bufs, ids = [good, good, bad, good], np.array([7, 8, 9, 10])
        routes = routes0.copy()
        D.refuse_hybrid(routes, bufs, ids, cleared)
        ref = routes0.copy()
        D.refuse_hybrid(ref, bufs)  # the reference: every hybrid image parsed
        assert routes.tolist() == ref.tolist() == [HYBRID, ENGINE, CPU, HYBRID]
    assert cleared == {(7, len(good)), (10, len(good))}  # the refused record is parsed every time
    # ours: both good records in the first batch only, the refused one each time; + the reference's 3 a batch
    assert parsed.count(len(bad)) == 3 + 3 and parsed.count(len(good)) == 2 + 3 * 2
    parsed.clear()
    routes = routes0.copy()
    D.refuse_hybrid(routes, [good, good, bad, bad], np.array([7, 8, 9, 10]), cleared)  # record 10 changed length
    assert routes.tolist() == [HYBRID, ENGINE, CPU, CPU] and parsed == [len(bad), len(bad)]


def test_chroma_mode_is_validated():
    from recordtool.decode.options import CHROMA_MODES, DEFAULT_CHROMA

    assert DEFAULT_CHROMA in CHROMA_MODES and all(GPUOptions(chroma=c).chroma == c for c in CHROMA_MODES)
    with pytest.raises(ValueError, match="chroma"):
        GPUOptions(chroma="bilinear")
    from recordtool.loader import Loader

    with pytest.raises(ValueError, match="chroma"):  # at the edge, before the dataset is opened
        Loader("/nonexistent", batch_size=8, chroma="bilinear")


def test_an_unknown_host_wait_policy_is_refused_before_cuda():
    """A mode that is not auto / spin / yield / block is a ConfigError, before CuPy or the driver
    is touched (no GPU needed)."""
    from recordtool.decode.gpu import set_host_wait_policy
    from recordtool.errors import ConfigError

    for bad in ("fast", "", None, 4):
        with pytest.raises(ConfigError, match="host wait policy"):
            set_host_wait_policy(0, bad)

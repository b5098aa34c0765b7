"""nvJPEG's decoders on a GPU: the engines' batched calls (native submission, pipelining,
lanes, chunks, the large images' decoder, warm-up sizing) and their planar output against
libjpeg's planes, whole images and regions."""
import io

import numpy as np
import pytest

from conftest import photo_like
from gpu_data import edge_windows, index_routes, layout_jpeg, libjpeg_planes, mixed_jpegs, psnr
from recordtool.decode import decode_crop_resize, random_flips, random_windows
from recordtool.decode.gpu import route
from recordtool.decode.gpu.plan import CPU, ENGINE, HYBRID
from recordtool.decode.options import GPUOptions
from recordtool.decode.spec import Output
from recordtool.format.jpeg import CHROMA_420

from .device import cupy, needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]


def test_native_submit_matches_the_ctypes_loop():
    """The engines' GIL-free batch submission and the hybrid decoder's batch in one call
    (recordtool._nvsubmit) decode exactly what the ctypes loops they replace decode (their
    reference), and are the default."""
    import inspect

    from recordtool.decode.gpu import nvjpeg
    from recordtool.decode.gpu import GPUDecoder

    assert inspect.signature(GPUDecoder).parameters["native_submit"].default is True
    bufs, sizes = mixed_jpegs()
    ids = np.arange(len(bufs))
    win = random_windows(sizes[:, 0], sizes[:, 1], ids, 5, 0)
    flips = random_flips(ids, 5, 0)
    outs = []
    for native in (False, True):
        dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu"),
                         max_batch=32, native_submit=native)
        if dec.hw is None:
            pytest.skip(f"no NVJPG engines: {dec.hw_error}")
        assert dec.native_submit == native
        outs.append(cupy.asnumpy(dec(bufs, win, flips, index_routes(bufs))))
        assert dec.last.gpu == int((index_routes(bufs) == ENGINE).sum())
        if dec.hybrid is not None:  # the progressive and gray images, by the hybrid decoder either way
            assert dec.last.hybrid == int((index_routes(bufs) == HYBRID).sum()) > 0, dec.last
        dec.close()
    assert nvjpeg._nvsubmit is not None  # built on the GPU machine (setup.py)
    assert np.array_equal(outs[0], outs[1])


def test_unpipelined_engines_decode_what_pipelined_ones_decode():
    """The engines' batched calls run without nvJPEG's pipelining by default
    (NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE: a pipelined call waits behind other streams' queued
    work); batches of changing sizes, each read back once its stream is done, give the pixels
    of the pipelined decoder bit for bit."""
    import inspect

    from recordtool.decode.gpu.nvjpeg import FLAGS_HW_DECODE_NO_PIPELINE, HardwareDecoder

    assert inspect.signature(HardwareDecoder).parameters["pipeline"].default is False
    bufs, sizes = mixed_jpegs(40)
    eng = [i for i, r in enumerate(index_routes(bufs)) if r == ENGINE]
    pins = [cupy.cuda.alloc_pinned_memory(len(bufs[i])) for i in eng]
    for p, i in zip(pins, eng):
        np.frombuffer(p, np.uint8, len(bufs[i]))[:] = np.frombuffer(bufs[i], np.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    got = {}
    for pipeline in (False, True):
        try:
            d = HardwareDecoder(len(eng), pipeline=pipeline)
        except Exception as e:
            pytest.skip(f"no NVJPG engines: {e}")
        assert d.pipeline == pipeline
        outs = []
        for lo, hi in ((0, len(eng)), (3, 9), (0, len(eng) - 2), (5, 6)):  # sizes change: re-initialised
            w, h = sizes[eng[lo:hi]].T
            dst = [cupy.full((int(hh), int(ww) * 3), 7, np.uint8) for ww, hh in zip(w, h)]
            d.decode([p.ptr for p in pins[lo:hi]], [len(bufs[i]) for i in eng[lo:hi]],
                     [(0, 0, int(ww), int(hh)) for ww, hh in zip(w, h)], [x.data.ptr for x in dst],
                     [x.shape[1] for x in dst], stream.ptr)
            stream.synchronize()
            outs += [cupy.asnumpy(x) for x in dst]
        got[pipeline] = outs
        d.close()
    assert all(np.array_equal(a, b) for a, b in zip(got[False], got[True]))
    assert any((x != 7).any() for x in got[False])  # decoded, not the fill
    assert FLAGS_HW_DECODE_NO_PIPELINE == 1  # nvjpeg.h


@pytest.mark.parametrize("chroma", ["replicate", "interpolate"])
def test_engine_lanes_decode_what_one_call_decodes(monkeypatch, chroma):
    """engine_lanes=N: a batch's engine images in N calls at once (parts of about equal bytes, each
    on its own state, stream and thread) give the pixels of one call, bit for bit, batch after
    batch; a lane whose call fails sends the whole engine share to the CPU path (no lane left
    writing into the arena), and a bad value is refused."""
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.errors import ConfigError

    monkeypatch.setattr(GPUDecoder, "LANE_MIN", 4)
    bufs, sizes = mixed_jpegs(29)
    ids = np.arange(len(bufs))
    flips = random_flips(ids, 2, 0)
    outs = {}
    for lanes in (1, 3):
        dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"),
                         GPUOptions(split="gpu", chroma=chroma, engine_lanes=lanes), max_batch=32)
        if dec.hw is None:
            pytest.skip(f"no NVJPG engines: {dec.hw_error}")
        assert dec.engine_lanes == lanes and len(dec._lanes) == lanes - 1
        calls = []  # images per nvJPEG call, over the lanes
        name = "decode_planes" if dec.planar else "decode"
        for d in [dec.hw] + [lane[0] for lane in dec._lanes]:
            real = getattr(d, name)
            monkeypatch.setattr(d, name, lambda ptrs, *a, _real=real, **k: (calls.append(len(ptrs)), _real(ptrs, *a, **k))[1])
        got = []
        for epoch in range(3):
            n = [29, 17, 22][epoch]
            win = random_windows(sizes[:n, 0], sizes[:n, 1], ids[:n], 2, epoch)
            calls.clear()
            got.append(cupy.asnumpy(dec(bufs[:n], win, flips[:n], index_routes(bufs[:n]))).copy())
            m = int((index_routes(bufs[:n]) == ENGINE).sum())
            assert dec.last.gpu == m > 8, dec.last
            assert sum(calls) == m and len(calls) == min(lanes, m // 4), calls
        outs[lanes] = got
        if lanes > 1:  # a lane refuses: the batch's engine images go to the CPU path, all of them
            def refuse(*a, **k):
                raise RuntimeError("refused")

            monkeypatch.setattr(dec._lanes[-1][0], name, refuse)
            n = 29
            win = random_windows(sizes[:n, 0], sizes[:n, 1], ids[:n], 2, 0)
            out = cupy.asnumpy(dec(bufs[:n], win, flips[:n], index_routes(bufs[:n])))
            assert dec.last.gpu == 0 and dec.last.cpu + dec.last.hybrid == n and not dec.last.errors, dec.last
            assert np.abs(out.astype(int) - outs[lanes][0].astype(int)).mean() < 3  # the CPU path's pixels of the same crops
        dec.close()
    for a, b in zip(outs[1], outs[3]):
        assert np.array_equal(a, b)
    for bad in (0, 9, 2.5, True, "2"):
        with pytest.raises(ConfigError, match="engine_lanes"):
            GPUOptions(split="gpu", engine_lanes=bad)


@pytest.mark.parametrize("chroma", ["replicate", "interpolate"])
def test_engines_ahead_decode_what_one_phase_decodes(monkeypatch, chroma):
    """engines_ahead: a call given its next batch (`ahead`) submits that batch's engines' call on
    the second phase before finishing its own; the next call, under that key, finishes it. The
    batches are those of one phase, bit for bit, the phases alternate, and: a batch begun under
    another key is drained and made again; inputs that fail leave the batch to its own call; a
    refused ahead call sends that batch's engine images to the CPU path."""
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = mixed_jpegs(29)
    ids = np.arange(len(bufs))
    routes = index_routes(bufs)
    counts = [29, 17, 22, 29]

    def batch(k):
        n = counts[k]
        return bufs[:n], random_windows(sizes[:n, 0], sizes[:n, 1], ids[:n], 2, k), random_flips(ids[:n], 2, k)

    outs = {}
    for ahead in (False, True):
        dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu", chroma=chroma),
                         max_batch=32, engines_ahead=ahead)
        if dec.hw is None:
            pytest.skip(f"no NVJPG engines: {dec.hw_error}")
        dec.warmup([len(b) for b in bufs], sizes[:, 0], sizes[:, 1], routes=routes)
        assert dec.engines_ahead == ahead and len(dec.phases) == 1 + ahead and dec.allocations == 0
        got, streams = [], []
        for k in range(len(counts)):
            b, win, flips = batch(k)
            nxt = None
            if ahead and k + 1 < len(counts):
                nxt = (k + 1, lambda k=k: (*batch(k + 1)[:2], routes[:counts[k + 1]], ids[:counts[k + 1]]))
            got.append(cupy.asnumpy(dec(b, win, flips, routes[:len(b)], ids=ids[:len(b)], key=k, ahead=nxt)).copy())
            assert dec.last.begun_ahead == (ahead and k > 0), (k, dec.last)
            assert dec.last.gpu == int((routes[:len(b)] == ENGINE).sum()) and not dec.last.errors, dec.last
            streams.append(dec.stream.ptr)
        if ahead:  # the phases alternate: batch k on phase k % 2
            assert streams[0::2] == [dec.phases[0].stream.ptr] * 2 and streams[1::2] == [dec.phases[1].stream.ptr] * 2
        assert dec.allocations == 0  # both phases sized at warm-up
        outs[ahead] = got
        if ahead:
            b, win, flips = batch(1)
            # begun under key 1, asked under key "other": drained, made again (the same pixels)
            dec(*batch(0), routes[:29], key=0, ahead=(1, lambda: (b, win, routes[:17], ids[:17])))
            out = cupy.asnumpy(dec(b, win, flips, routes[:17], key="other"))
            assert not dec.last.begun_ahead and np.array_equal(out, outs[True][1])
            # inputs that fail: the batch is made by its own call
            def broken():
                raise OSError("gone")
            dec(*batch(0), routes[:29], key=0, ahead=(1, broken))
            out = cupy.asnumpy(dec(b, win, flips, routes[:17], key=1))
            assert not dec.last.begun_ahead and np.array_equal(out, outs[True][1])
            # the ahead call refused: that batch's engine images go to the CPU path
            other = dec.phases[1].hw
            name = "decode_planes" if dec.planar else "decode"

            def refuse(*a, **k):
                raise RuntimeError("refused")

            monkeypatch.setattr(other, name, refuse)
            dec(*batch(0), routes[:29], key=0, ahead=(1, lambda: (b, win, routes[:17], ids[:17])))
            out = cupy.asnumpy(dec(b, win, flips, routes[:17], key=1))
            assert dec.last.begun_ahead and dec.last.gpu == 0 and not dec.last.errors, dec.last
            assert np.abs(out.astype(int) - outs[True][1].astype(int)).mean() < 3
            # a batch begun for a call that never comes is waited for at close
            dec(*batch(0), routes[:29], key=0, ahead=(1, lambda: (b, win, routes[:17], ids[:17])))
            assert dec._pending is not None
        dec.close()
        assert dec._pending is None and dec._submitter is None
    for a, b in zip(outs[False], outs[True]):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("chroma", ["replicate", "interpolate"])
def test_hybrid_lanes_decode_what_one_lane_decodes(monkeypatch, chroma):
    """hybrid_lanes=N: a batch's progressive and gray images spread over N hybrid decoders (each
    its own state, stream and thread) give the pixels of one decoder, bit for bit, batch after
    batch; every lane is used while the rates are unmeasured and one where a lane's measured rate
    finishes them within the engines' time; an image a lane refuses goes to the CPU path (its
    batch position, not its place in the lane); a bad value is refused."""
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.decode.options import MAX_HYBRID_LANES
    from recordtool.errors import ConfigError

    assert GPUOptions().hybrid_lanes == 1
    bufs, sizes = mixed_jpegs(40)
    routes = index_routes(bufs)
    ids = np.arange(len(bufs))
    flips = random_flips(ids, 3, 0)
    outs = {}
    for lanes in (1, 3):
        dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"),
                         GPUOptions(split="gpu", chroma=chroma, hybrid_lanes=lanes), max_batch=48)
        if dec.hybrid is None:
            pytest.skip(f"no hybrid decoder: {dec.hybrid_error}")
        assert len(dec._hybrids) == lanes == dec.planner.hybrid_lanes and dec.hybrid is dec._hybrids[0][0]
        calls = []  # (lane, images) per hybrid call
        for k, lane in enumerate(dec._hybrids):
            real = lane[0].decode_batch
            monkeypatch.setattr(lane[0], "decode_batch",
                                lambda ptrs, *a, _k=k, _real=real, **kw: (calls.append((_k, len(ptrs))), _real(ptrs, *a, **kw))[1])
        got = []
        for epoch, n in enumerate((40, 31, 36)):
            win = random_windows(sizes[:n, 0], sizes[:n, 1], ids[:n], 3, epoch)
            dec.planner.rates.hybrid = None  # unmeasured: every lane
            calls.clear()
            got.append(cupy.asnumpy(dec(bufs[:n], win, flips[:n], routes[:n])).copy())
            m = int((routes[:n] == HYBRID).sum())
            assert dec.last.hybrid == m > 6 and dec.last.hybrid_lanes == lanes and not dec.last.errors, dec.last
            assert sorted(k for k, _ in calls) == list(range(lanes)) and sum(c for _, c in calls) == m, calls
        outs[lanes] = got
        if lanes > 1:
            win = random_windows(sizes[:, 0], sizes[:, 1], ids, 3, 0)
            dec.planner.rates.hybrid = 1e6  # one lane finishes them within the engines' time
            calls.clear()
            out = cupy.asnumpy(dec(bufs, win, flips, routes))
            assert dec.last.hybrid_lanes == 1 and [k for k, _ in calls] == [0] and np.array_equal(out, got[0])
            last = dec._hybrids[-1][0]  # the last lane refuses its images: the CPU path decodes them
            refused = []
            monkeypatch.setattr(last, "decode_batch", lambda ptrs, *a, **kw: (refused.append(len(ptrs)),
                                                                             [(j, "refused") for j in range(len(ptrs))])[1])
            dec.planner.rates.hybrid = None
            out = cupy.asnumpy(dec(bufs, win, flips, routes))
            m = int((routes == HYBRID).sum())
            assert refused[0] > 0 and dec.last.hybrid == m - refused[0] and not dec.last.errors, dec.last
            assert dec.last.cpu == int((routes == CPU).sum()) + refused[0], dec.last
            hyb, eng = np.nonzero(routes == HYBRID)[0], np.nonzero(routes != HYBRID)[0]
            assert np.array_equal(out[eng], got[0][eng])
            close = [np.abs(out[i].astype(int) - got[0][i].astype(int)).mean() for i in hyb]
            assert max(close) < 3, close  # the CPU path's pixels of the same crops where refused
        dec.close()
    for a, b in zip(outs[1], outs[3]):
        assert np.array_equal(a, b)
    for bad in (0, MAX_HYBRID_LANES + 1, 2.5, True, "2"):
        with pytest.raises(ConfigError, match="hybrid_lanes"):
            GPUOptions(split="gpu", hybrid_lanes=bad)


@pytest.mark.parametrize("chroma", ["replicate", "interpolate"])
def test_chunked_engine_calls_decode_what_one_call_decodes(monkeypatch, chroma):
    """chunk=N: the engines' images in nvJPEG calls of at most N (sizes that differ, so the state
    is re-initialised between calls, each after the last call's work is done) give the pixels of
    one call, bit for bit, batch after batch (a hang here is the re-initialisation racing the
    previous call); a bad value is refused."""
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.errors import ConfigError

    bufs, sizes = mixed_jpegs(29)
    ids = np.arange(len(bufs))
    flips = random_flips(ids, 2, 0)
    outs = {}
    for chunk in (0, 4):
        dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu", chroma=chroma),
                         max_batch=32, chunk=chunk)
        if dec.hw is None:
            pytest.skip(f"no NVJPG engines: {dec.hw_error}")
        assert dec.chunk == chunk
        calls = []  # images per nvJPEG call
        name = "decode_planes" if dec.planar else "decode"
        real = getattr(dec.hw, name)
        monkeypatch.setattr(dec.hw, name, lambda ptrs, *a, **k: (calls.append(len(ptrs)), real(ptrs, *a, **k))[1])
        got = []
        for epoch in range(3):  # engine counts of 21, 12 and 15: calls of 3 and 4 images with chunks of 4
            n = [29, 17, 22][epoch]
            win = random_windows(sizes[:n, 0], sizes[:n, 1], ids[:n], 2, epoch)
            calls.clear()
            got.append(cupy.asnumpy(dec(bufs[:n], win, flips[:n], index_routes(bufs[:n]))).copy())
            m = int((index_routes(bufs[:n]) == ENGINE).sum())
            assert dec.last.gpu == m > 8, dec.last
            if chunk == 0:
                assert calls == [m]
            else:  # as equal as they can be, none over 4
                assert sum(calls) == m and len(calls) == -(-m // 4) and max(calls) - min(calls) <= 1
                assert max(calls) <= 4
        outs[chunk] = got
        dec.close()
    for a, b in zip(outs[0], outs[4]):
        assert np.array_equal(a, b)
    assert GPUDecoder(Output(224), GPUOptions(split="gpu"), max_batch=8).chunk == 0  # the default: one call
    for bad in (-1, 2.5, True, "4"):
        with pytest.raises(ConfigError, match="chunk"):
            GPUDecoder(Output(224), GPUOptions(split="gpu"), max_batch=8, chunk=bad)


@pytest.mark.parametrize("chroma", ["replicate", "interpolate"])
def test_large_images_go_to_the_engines_on_a_decoder_of_their_own(monkeypatch, chroma):
    """Route.LARGE images (baseline, above GPU_MAX_PIXELS) are decoded by the engines on a
    decoder of their own (made and sized at warm-up for them alone), in calls of at most
    LARGE_BATCH after the batch's engines call: none reaches the CPU share, and they are the
    pixels the batch's engines give the same images routed to them, bit for bit, within 40 dB
    of the CPU path."""
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.decode.gpu.plan import GPU_MAX_PIXELS, LARGE
    from recordtool.format.jpeg import probe

    small, small_sizes = mixed_jpegs(12)
    big = []
    for k, (w, h, sub) in enumerate([(2400, 1800, 2), (1800, 2400, 1), (2560, 1600, 0)]):
        b = io.BytesIO()
        photo_like(w, h, seed=50 + k).save(b, "JPEG", quality=90, subsampling=sub)
        big.append(b.getvalue())
    bufs = big[:2] + small + big[2:]
    sizes = np.concatenate([[[2400, 1800], [1800, 2400]], small_sizes, [[2560, 1600]]])
    infos = [probe(b) for b in bufs]
    cols = ([i.chroma for i in infos], [i.progressive for i in infos], [i.colorspace for i in infos])
    pixels = sizes[:, 0] * sizes[:, 1]
    routes = route(*cols, pixels=pixels)
    large = [0, 1, len(bufs) - 1]
    assert pixels[large].min() > GPU_MAX_PIXELS and np.nonzero(routes == LARGE)[0].tolist() == large
    n_engine = int((routes == ENGINE).sum())
    ids = np.arange(len(bufs))
    lengths = np.array([len(b) for b in bufs])
    outs = []
    for rts in (routes, route(*cols)):  # LARGE, then the same images as the batch's engines' own
        dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu", chroma=chroma),
                         max_batch=32)
        if dec.hw is None:
            pytest.skip(f"no NVJPG engines: {dec.hw_error}")
        dec.LARGE_ROOM = 3  # room for this batch's three whole (a batch of 15 has no margin for them)
        dec.warmup(lengths, sizes[:, 0], sizes[:, 1], routes=rts, chroma=cols[0])
        assert dec.prealloc_error is None
        calls = []
        if (rts == LARGE).any():
            assert dec.hw_large is not None and dec.hw_large.max_batch == dec.LARGE_BATCH == 2
            if dec.planar:  # primed at warm-up by a call of that many, not pre-allocated
                assert dec.hw_large._batch == 2
            name = "decode_planes" if dec.planar else "decode"
            real = getattr(dec.hw_large, name)
            monkeypatch.setattr(dec.hw_large, name, lambda ptrs, *a, **k: (calls.append(len(ptrs)), real(ptrs, *a, **k))[1])
        else:
            assert dec.hw_large is None  # made only for a dataset that has such images
        got = []
        for epoch in range(2):
            win = random_windows(sizes[:, 0], sizes[:, 1], ids, 7, epoch)
            flips = random_flips(ids, 7, epoch)
            got.append(cupy.asnumpy(dec(bufs, win, flips, rts)).copy())
            assert dec.last.gpu == n_engine + 3 and dec.last.cpu == 0 and dec.last.overflow == 0, dec.last
            ref = decode_crop_resize(bufs, win)
            ref[flips] = ref[flips, :, ::-1]
            for k in large:
                assert psnr(got[-1][k], ref[k]) >= 40, (k, epoch, chroma)
        assert calls == ([2, 1] * 2 if (rts == LARGE).any() else [])
        outs.append(got)
        dec.close()
    for a, b in zip(*outs):
        assert np.array_equal(a, b)


def test_warmup_keeps_every_failed_sizing_step(monkeypatch):
    """A warm-up whose sizing steps fail one after another (the hybrid decoder's priming, the
    engines' pre-allocation, the large images' priming) reports them all in prealloc_error, in
    that order: a later failure does not hide an earlier one. The next warm-up starts afresh:
    one that succeeds leaves prealloc_error None."""
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.decode.gpu.plan import LARGE

    dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu"), max_batch=8)
    if dec.hw is None or dec.hybrid is None:
        pytest.skip(f"no NVJPG engines or hybrid decoder: {dec.hw_error or dec.hybrid_error}")
    routes = np.array([ENGINE] * 4 + [HYBRID, LARGE], np.int8)
    widths, heights = np.array([640] * 5 + [2400]), np.array([480] * 5 + [1800])
    lengths, chroma = np.array([60_000] * 5 + [900_000]), np.full(6, CHROMA_420)

    def fails(what):
        def raise_(*a, **k):
            raise RuntimeError(what)
        return raise_

    monkeypatch.setattr(dec, "_prime_hybrid", fails("hybrid primed"))
    monkeypatch.setattr(dec.hw, "preallocate", fails("engines sized"))
    monkeypatch.setattr(dec, "_prime_large", fails("large primed"))
    dec.warmup(lengths, widths, heights, routes=routes, chroma=chroma)
    assert dec.prealloc_error == "hybrid: hybrid primed; engines: engines sized; large: large primed"
    monkeypatch.undo()
    dec.warmup(lengths, widths, heights, routes=routes, chroma=chroma)
    assert dec.prealloc_error is None
    dec.close()


@pytest.mark.parametrize("layout", ["420", "422", "444", "440", "gray", "prog420"])
def test_nvjpeg_planes_are_libjpeg_planes(layout):
    """What the kernel's exactness rests on: nvJPEG's planar output (engines for baseline,
    hybrid decoder for progressive / gray) equals libjpeg-turbo's planes (its IDCT)."""
    from recordtool.decode.gpu.nvjpeg import HardwareDecoder, HybridDecoder

    prog = layout.startswith("prog")
    lay = layout[4:] if prog else layout
    w, h = (320, 240) if lay == "440" else (333, 251)
    data = layout_jpeg(w, h, lay, seed=3, progressive=prog)
    want = libjpeg_planes(data)
    view = np.frombuffer(data, np.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    gray = lay == "gray"
    planes = [cupy.zeros((p.shape[0] + 2, p.shape[1] + 16), np.uint8) for p in want]
    ptrs = [p.data.ptr for p in planes] + [planes[0].data.ptr] * (3 - len(planes))
    pitches = [p.shape[1] for p in planes] + [planes[0].shape[1]] * (3 - len(planes))
    if prog or gray:
        d = HybridDecoder(stream.ptr)
        d.decode_planes(view.ctypes.data, len(view), ptrs, pitches, gray)
    else:
        try:
            d = HardwareDecoder(1, planar=True)
        except Exception as e:
            pytest.skip(f"no NVJPG engines: {e}")
        pin = cupy.cuda.alloc_pinned_memory(len(view))
        np.frombuffer(pin, np.uint8, len(view))[:] = view
        d.decode_planes([pin.ptr], [len(view)], [ptrs], [pitches], stream.ptr)
    stream.synchronize()
    nc, css, ws, hs = d.image_info(view.ctypes.data, len(view))
    assert (ws[0], hs[0]) == (want[0].shape[1], want[0].shape[0])
    for c, p in enumerate(want):
        got = cupy.asnumpy(planes[c])[: p.shape[0], : p.shape[1]]
        assert psnr(got, p) >= 50, (layout, c, psnr(got, p), np.abs(got.astype(int) - p).max())
    d.close()


@pytest.mark.parametrize("layout", ["420", "422", "440", "444", "gray", "prog420", "prog422", "prog444"])
def test_nvjpeg_region_planes_are_the_whole_images_planes(layout):
    """What windowed interpolate rests on: nvJPEG's planar output of a region (plan_rois: MCU-
    aligned, engines for baseline, hybrid decoder for progressive / gray) equals the whole
    image's planes there, bit for bit — odd sizes, regions on every edge."""
    from recordtool.decode.gpu.roi import chroma_dims, plan_rois
    from recordtool.decode.gpu.nvjpeg import HardwareDecoder, HybridDecoder

    prog = layout.startswith("prog")
    lay = layout[4:] if prog else layout
    hs, vs = {"444": (1, 1), "422": (2, 1), "420": (2, 2), "440": (1, 2), "gray": (1, 1)}[lay]
    stream = cupy.cuda.Stream(non_blocking=True)
    hybrid = prog or lay == "gray"
    try:
        d = HybridDecoder(stream.ptr) if hybrid else HardwareDecoder(1, planar=True)
    except Exception as e:
        pytest.skip(f"no NVJPG engines: {e}")
    for w, h in ([(320, 240), (48, 24)] if lay == "440" else [(333, 251), (61, 33), (1001, 777)]):
        data = layout_jpeg(w, h, lay, seed=w, progressive=prog)
        view = np.frombuffer(data, np.uint8)
        pin = cupy.cuda.alloc_pinned_memory(len(view))
        np.frombuffer(pin, np.uint8, len(view))[:] = view
        nc, css, ws, hsz = d.image_info(view.ctypes.data, len(view))
        w, h = ws[0], hsz[0]  # (4:4:0 files are 4:2:2 ones relabelled: half the width, twice the height)
        gray = lay == "gray"

        def decode(roi, pw, ph, native=True):
            cc, cr = (chroma_dims([roi], hs, vs) if roi is not None else ((ws[1],), (hsz[1],)))
            shapes = [(ph, pw)] + ([] if gray else [(cr[0], cc[0])] * 2)
            # region pitches, in buffers big enough for the whole planes (a decoder ignoring the
            # region writes inside them)
            room = (hsz[0] + 2) * (ws[0] + 16)
            planes = [cupy.full(room, 7, np.uint8)[: (r + 2) * (c + 16)].reshape(r + 2, c + 16) for r, c in shapes]
            ptrs = [p.data.ptr for p in planes] + [planes[0].data.ptr] * (3 - len(planes))
            pitches = [p.shape[1] for p in planes] + [planes[0].shape[1]] * (3 - len(planes))
            if hybrid:
                d.decode_planes(pin.ptr, len(view), ptrs, pitches, gray, roi)
            else:
                d.decode_planes([pin.ptr], [len(view)], [ptrs], [pitches], stream.ptr,
                                None if roi is None else [roi], native=native)
            stream.synchronize()
            return [cupy.asnumpy(p)[:r, :c] for p, (r, c) in zip(planes, shapes)]

        whole = decode(None, ws[0], hsz[0])
        win = edge_windows(w, h, 6, w)
        rois = plan_rois(win, np.full(len(win), w), np.full(len(win), h), np.full(len(win), css), (224, 224))
        for roi in rois:
            rx, ry, rw, rh = (int(v) for v in roi)
            got = decode((rx, ry, rw, rh), rw, rh)
            if not hybrid and rx == 0:  # the ctypes loop, the native submission's reference
                assert all(np.array_equal(a, b) for a, b in zip(got, decode((rx, ry, rw, rh), rw, rh, False)))
            assert np.array_equal(got[0], whole[0][ry:ry + rh, rx:rx + rw]), (layout, w, h, roi, "Y")
            for c in (1, 2)[: 0 if gray else 2]:
                want = whole[c][ry // vs:ry // vs + got[c].shape[0], rx // hs:rx // hs + got[c].shape[1]]
                assert np.array_equal(got[c], want), (layout, w, h, roi, c)
    d.close()

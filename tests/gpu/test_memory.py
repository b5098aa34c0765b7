"""GPU memory: the output ring, the CPU share in pinned memory, the arena's room and what
overflows it, and no allocation after warm-up (decoder and Loader)."""
import numpy as np
import pytest

from gpu_data import SCALED_DB, index_routes, mixed_jpegs, psnr
from recordtool.decode import decode_crop_resize, random_flips, random_windows
from recordtool.decode.options import GPUOptions
from recordtool.decode.spec import Output

from .device import cupy, needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]


def test_producer_owned_ring_gives_slots_back_without_an_event():
    """A user op's uint8 ring is given back by the producer once its pass is done: no event on
    the releasing thread's default stream (which the next decode would wait for)."""
    from recordtool.decode.gpu.buffers import OutputRing

    ring = OutputRing((4, 8, 8, 3), "uint8", 2, producer_owned=True)
    stream = cupy.cuda.Stream(non_blocking=True)
    a = ring.acquire(3, stream)
    assert ring.free == 1 and a.shape == (3, 8, 8, 3)
    del a
    assert ring.free == 2 and ring._ready == [None, None]
    plain = OutputRing((4, 8, 8, 3), "uint8", 1)
    b = plain.acquire(2, stream)
    del b
    assert plain._ready[0] is not None  # a consumer's ring: the next producer waits for the event


def test_output_ring_recycles_after_release_and_spills_when_held():
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.decode.gpu.buffers import OutputRing

    bufs, sizes = mixed_jpegs(8)
    win = random_windows(sizes[:, 0], sizes[:, 1], np.arange(8), 2, 0)
    dec = GPUDecoder(Output(224, dtype="float32", layout="NCHW"), GPUOptions(split="gpu"), max_batch=8)
    ring = dec.ring = OutputRing(dec.output_shape(), "float32", 2)
    first = dec(bufs, win, np.zeros(8, bool), index_routes(bufs))
    keep = cupy.asnumpy(first)
    ptr = first.data.ptr
    assert ring.free == 1
    second = dec(bufs, win, np.ones(8, bool), index_routes(bufs))  # the other slot: `first` is still held
    assert second.data.ptr != ptr and ring.free == 0
    third = dec(bufs, win, np.zeros(8, bool), index_routes(bufs))  # both held: from CuPy's pool, counted
    assert ring.spills == 1
    assert np.array_equal(cupy.asnumpy(first), keep)  # a held batch is never overwritten
    view = first[2:5]  # a view keeps the slot too
    del first, third
    assert ring.free == 0
    del view
    assert ring.free == 1
    again = dec(bufs, win, np.zeros(8, bool), index_routes(bufs))
    assert again.data.ptr == ptr and np.array_equal(cupy.asnumpy(again), keep)
    del second, again
    assert ring.free == 2
    dec.close()


def test_auto_split_adapts_and_memory_is_steady():
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = mixed_jpegs(64)
    ids = np.arange(len(bufs))
    dec = GPUDecoder(Output(224, dtype="float16"), GPUOptions(split="auto"), max_batch=64)
    dec.warmup([len(b) for b in bufs], sizes[:, 0], sizes[:, 1])
    pool = cupy.get_default_memory_pool()
    fractions = []
    for epoch in range(6):
        win = random_windows(sizes[:, 0], sizes[:, 1], ids, 0, epoch)
        out = dec(bufs, win, random_flips(ids, 0, epoch), index_routes(bufs))
        del out
        fractions.append(dec.cpu_fraction)
        if epoch == 1:
            before, allocs = pool.total_bytes(), dec.allocations
    assert pool.total_bytes() == before and dec.allocations == allocs  # nothing new after warm-up
    assert dec.ring.spills == 0 and dec.prealloc_error is None
    if dec.hw is not None:
        assert len(set(fractions)) > 1 and 0 < fractions[-1] < 0.9  # the share moved with measured rates


def test_the_kernel_reads_the_cpu_share_in_pinned_memory():
    """The CPU share's pixels reach the kernel where the CPU wrote them (pinned memory mapped
    into the device's address space): no device buffer of a batch's pixels, and the output is
    the CPU path's, bit for bit, batch after batch in the same buffer."""
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.decode.gpu.buffers import DecodeBuffers

    pool = cupy.get_default_memory_pool()
    before = pool.total_bytes()
    buf = DecodeBuffers(cupy, 64, (224, 224))
    assert pool.total_bytes() - before < 64 * 224 * 224 * 3 // 8  # the sample table's bytes only
    buf.cpu_out[...] = np.random.default_rng(0).integers(0, 256, buf.cpu_out.shape, np.uint8)
    mapped = cupy.ndarray(buf.cpu_out.shape, np.uint8, cupy.cuda.MemoryPointer(
        cupy.cuda.UnownedMemory(buf.cpu_src, buf.cpu_out.nbytes, buf), 0))
    assert int(mapped.astype(cupy.int64).sum()) == int(buf.cpu_out.astype(np.int64).sum())  # a kernel's reads

    bufs, sizes = mixed_jpegs(8)
    dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="cpu"), max_batch=8)
    for seed in range(3):
        ids = np.arange(8)
        win, flips = random_windows(sizes[:, 0], sizes[:, 1], ids, seed, 0), random_flips(ids, seed, 0)
        got = cupy.asnumpy(dec(bufs, win, flips, index_routes(bufs)))
        assert dec.last.cpu == 8
        want = decode_crop_resize(bufs, win)
        want[flips] = want[flips][:, :, ::-1]
        np.testing.assert_array_equal(got, want)


def test_a_batch_past_the_room_sends_its_last_images_to_the_cpu_share():
    """A batch heavier than the room planned at warm-up (room.batch_room) keeps the buffers
    as they are: the images past the room are decoded by the CPU share, counted in
    BatchReport.overflow, with the CPU path's pixels bit for bit; nothing is allocated."""
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = mixed_jpegs(16)
    routes, ids = index_routes(bufs), np.arange(16)
    spec = Output(64, dtype="float32")
    win, flips = random_windows(sizes[:, 0], sizes[:, 1], ids, 0, 0), random_flips(ids, 0, 0)
    lengths = [len(b) for b in bufs]
    ref = GPUDecoder(spec, GPUOptions(split="cpu"), max_batch=16)
    ref.warmup(lengths, sizes[:, 0], sizes[:, 1], routes=routes)
    want = cupy.asnumpy(ref(bufs, win, flips, routes))
    ref.close()
    dec = GPUDecoder(spec, GPUOptions(split="gpu"), max_batch=16)
    dec.warmup(lengths, sizes[:, 0], sizes[:, 1], routes=routes)
    if dec.hw is None:
        pytest.skip("no NVJPG engines here")
    layouts, place = [], dec.buf.place_planar

    def spy(*args, layout=None, **kw):  # the arena each placed image takes, in the batch's order
        layouts.append(layout.total.copy())
        return place(*args, layout=layout, **kw)

    dec.buf.place_planar = spy
    full = cupy.asnumpy(dec(bufs, win, flips, routes))
    dec.buf.place_planar = place
    assert dec.last.overflow == 0  # a set smaller than a batch: room for all of it
    # the regions decoded (crop windows) take far less than the whole images warm-up sized the
    # room for: an arena that holds the batch's first half of them, and no more
    taken = np.cumsum(layouts[-1])
    half = len(taken) // 2
    dec.buf.arena = cupy.empty(int(taken[half - 1]), np.uint8)
    pool = cupy.get_default_memory_pool()
    before, allocs = pool.total_bytes(), dec.allocations
    got = cupy.asnumpy(dec(bufs, win, flips, routes))
    r = dec.last
    assert r.overflow == len(taken) - half and r.gpu + r.hybrid == half, (r, taken)
    assert r.cpu >= r.cpu_forced + r.overflow, r
    assert pool.total_bytes() == before and dec.allocations == allocs, (pool.total_bytes() - before, dec.allocations)
    exact = [i for i in range(16) if np.array_equal(got[i], want[i])]
    assert len(exact) >= r.cpu, (exact, r)  # what the CPU share decoded is the CPU path's image
    for i in range(16):
        assert np.array_equal(got[i], want[i]) or np.array_equal(got[i], full[i]), i
    dec.close()


def test_the_arena_holds_a_batch_of_crops_regions(packed_mix):
    """With REGION_ROOM_MIN batches of GPU-bound records or more, the arena is sized by the
    regions random crops decode (two epochs' windows), not by whole images: smaller where the
    engines decode regions, and later epochs' batches fit it (the rare one past it sends its
    last images to the CPU share, counted in Loader.overflow)."""
    from recordtool.decode.gpu.plan import CPU
    from recordtool.decode.gpu.room import batch_room, planar_need
    from recordtool.loader import Loader

    ld = Loader(packed_mix, batch_size=4, size=64, device="cuda", dtype="float16", as_torch=False)
    n = 0
    for epoch in range(4):
        ld.set_epoch(epoch)
        for x, y in ld:
            n += len(y)
    dec = next(iter(ld.backend._decoders.values()))
    ix, gpu = ld.ds.index, ld.backend.routes != CPU
    assert gpu.sum() >= dec.REGION_ROOM_MIN * 4
    whole = batch_room(planar_need(ix.width[gpu], ix.height[gpu], ix.chroma[gpu]), 4)
    if dec.planar and dec.planar_regions["engines"] and dec.planar_regions["hybrid"]:
        assert dec.buf.arena.size < whole, (dec.buf.arena.size, whole)  # (engines alone: about the same here)
    assert ld.overflow <= 0.05 * n, (ld.overflow, n)
    ld.close()


def test_cuda_loader_memory_fixed_after_warmup(packed_mix):
    torch = pytest.importorskip("torch")
    from recordtool.loader import Loader

    ld = Loader(packed_mix, batch_size=8, size=64, device="cuda", dtype="float16")
    pool = cupy.get_default_memory_pool()
    for epoch in range(4):
        ld.set_epoch(epoch)
        for x, y in ld:
            assert x.is_cuda and x.dtype == torch.float16
            x = x.float().sum()  # the consumer works on the batch on torch's stream
        torch.cuda.synchronize()
        if epoch == 0:
            before = pool.total_bytes()
    assert pool.total_bytes() == before and ld.ring.spills == 0 and ld.overflow == 0
    ld.close()  # the producers had gone on into epoch 4 (continuous): what they made is dropped
    assert ld.ring.free == ld.ring.slots  # every batch given back


def test_interpolate_memory_is_steady_and_loader_matches_cpu(packed_mix):
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.loader import Loader

    bufs, sizes = mixed_jpegs(48)
    ids = np.arange(len(bufs))
    dec = GPUDecoder(Output(224), GPUOptions(split="auto", chroma="interpolate"), max_batch=48)
    dec.warmup([len(b) for b in bufs], sizes[:, 0], sizes[:, 1], routes=index_routes(bufs))
    pool = cupy.get_default_memory_pool()
    for epoch in range(4):
        win = random_windows(sizes[:, 0], sizes[:, 1], ids, 0, epoch)
        out = dec(bufs, win, random_flips(ids, 0, epoch), index_routes(bufs))
        del out
        if epoch == 1:
            before, allocs = pool.total_bytes(), dec.allocations
    assert pool.total_bytes() == before and dec.allocations == allocs == 0 and dec.prealloc_error is None
    dec.close()
    kw = dict(batch_size=8, size=64, seed=4, drop_last=False, as_torch=False, dtype="float32", layout="NHWC")
    cpu_b = [np.asarray(x) for x, _ in Loader(packed_mix, device="cpu", **kw)]
    gpu_b = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", split="gpu", chroma="interpolate", **kw)]
    std, mean = np.array([0.229, 0.224, 0.225], np.float32), np.array([0.485, 0.456, 0.406], np.float32)
    for xg, xc in zip(gpu_b, cpu_b):
        for a, b in zip(xg, xc):
            assert psnr((a * std + mean) * 255, (b * std + mean) * 255) >= SCALED_DB  # 64 px: mostly scaled

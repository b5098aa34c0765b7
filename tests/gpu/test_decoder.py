"""GPUDecoder on a GPU: its pixels against the CPU path for every split, damaged and hostile
files named, the hand-out (DLPack, channels_last) and the context's host wait policy."""
import numpy as np
import pytest

from gpu_data import index_routes, mixed_jpegs, psnr
from recordtool.decode import decode_crop_resize, random_flips, random_windows
from recordtool.decode.gpu.plan import CPU, ENGINE, HYBRID
from recordtool.decode.options import GPUOptions
from recordtool.decode.spec import Output

from .device import cupy, needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]


@pytest.mark.parametrize("split", ["gpu", "cpu", "auto", 0.5])
def test_gpu_matches_cpu_40db(split):
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = mixed_jpegs()
    ids = np.arange(len(bufs))
    win = random_windows(sizes[:, 0], sizes[:, 1], ids, 3, 0)
    flips = random_flips(ids, 3, 0)
    dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split=split), max_batch=32)
    out = cupy.asnumpy(dec(bufs, win, flips, index_routes(bufs)))
    ref = decode_crop_resize(bufs, win)
    ref[flips] = ref[flips, :, ::-1]
    for k in range(len(bufs)):
        assert psnr(out[k], ref[k]) >= 40, (k, split, dec.last)
    routes = index_routes(bufs)
    assert (routes == HYBRID).sum() >= 6  # progressive and gray files are in the batch
    if split == "cpu":
        assert dec.last.gpu == 0 and dec.last.hybrid == 0
    else:
        if dec.hw is not None and split == "gpu":
            assert dec.last.gpu == int((routes == ENGINE).sum())
        if dec.hybrid is not None:  # every progressive / gray window went through the hybrid decoder
            assert dec.last.hybrid == int((routes == HYBRID).sum()), dec.last
    dec.close()


def test_hybrid_off_sends_progressive_and_gray_to_cpu():
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = mixed_jpegs(12)
    win = random_windows(sizes[:, 0], sizes[:, 1], np.arange(12), 1, 0)
    dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu", hybrid=False), max_batch=16)
    out = cupy.asnumpy(dec(bufs, win, np.zeros(12, bool), index_routes(bufs)))
    assert dec.last.hybrid == 0 and dec.last.cpu_forced == int((index_routes(bufs) != ENGINE).sum())
    ref = decode_crop_resize(bufs, win)
    assert min(psnr(out[k], ref[k]) for k in range(12)) >= 40
    dec.close()


def test_bad_jpeg_in_batch_is_reported():
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = mixed_jpegs(8)
    hw = index_routes(bufs)  # as the index says: the damage happened after packing
    bufs[2] = bufs[2][: len(bufs[2]) // 3]
    ids = np.arange(8)
    win = random_windows(sizes[:, 0], sizes[:, 1], ids, 0, 0)
    on_cpu = GPUDecoder(Output(224, dtype="uint8"), GPUOptions(split="cpu"), max_batch=8)
    on_cpu(bufs, win, np.zeros(8, bool), hw)
    assert [i for i, _ in on_cpu.last.errors] == [2]  # the CPU path names it
    # Neither the engines nor the hybrid decoder report a truncated stream (seen on the H200):
    # a file not ending in EOI is sent to libjpeg, which names it
    bufs[4] = bufs[4][: len(bufs[4]) // 3]
    assert hw[4] == HYBRID
    on_gpu = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu"), max_batch=8)
    out = cupy.asnumpy(on_gpu(bufs, win, np.zeros(8, bool), hw))
    assert sorted(i for i, _ in on_gpu.last.errors) == [2, 4], on_gpu.last
    assert on_gpu.last.cpu == 2 + int((hw == CPU).sum())
    ref = decode_crop_resize(bufs, win, on_error="skip")
    for k in set(range(8)) - {2, 4}:  # the rest of the batch is intact
        assert psnr(out[k], ref[k]) >= 40


def test_hostile_multiscan_files_in_a_gpu_batch_are_named():
    from hostile_data import bomb_progressive, many_scans

    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = mixed_jpegs(6)
    bufs[1], bufs[3] = many_scans(), bomb_progressive()
    sizes[1], sizes[3] = (512, 512), (8192, 8192)
    win = random_windows(sizes[:, 0], sizes[:, 1], np.arange(6), 0, 0)
    routes = index_routes(bufs)
    dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu"), max_batch=8)
    dec(bufs, win, np.zeros(6, bool), routes)
    assert sorted(i for i, _ in dec.last.errors) == [1, 3], dec.last.errors
    dec.close()


def test_dlpack_to_torch():
    torch = pytest.importorskip("torch")
    from recordtool.decode.gpu import GPUDecoder, to_torch

    bufs, sizes = mixed_jpegs(8)
    win = random_windows(sizes[:, 0], sizes[:, 1], np.arange(8), 0, 0)
    dec = GPUDecoder(Output(224, dtype="float16"), max_batch=8)
    t = to_torch(dec(bufs, win, np.zeros(8, bool), index_routes(bufs)), dec.stream)
    assert t.is_cuda and t.dtype == torch.float16 and tuple(t.shape) == (8, 3, 224, 224)
    assert torch.isfinite(t).all()


def test_gpu_decoder_channels_last_writes_nhwc_and_hands_out_nchw():
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = mixed_jpegs(6)
    win = random_windows(sizes[:, 0], sizes[:, 1], np.arange(6), 0, 0)
    nchw = GPUDecoder(Output(64, dtype="float32"), GPUOptions(split="gpu"), max_batch=8)
    cl_spec = Output(64, dtype="float32", memory_format="channels_last")
    cl = GPUDecoder(cl_spec, GPUOptions(split="gpu"), max_batch=8)
    a = cupy.asnumpy(nchw(bufs, win, np.zeros(6, bool), index_routes(bufs)))
    b = cl(bufs, win, np.zeros(6, bool), index_routes(bufs))
    assert b.shape == (6, 64, 64, 3) and cl_spec.arrange(b).shape == (6, 3, 64, 64)
    assert np.array_equal(cupy.asnumpy(cl_spec.arrange(b)), a)
    nchw.close()
    cl.close()


def test_set_host_wait_policy_sets_the_context_flags():
    """set_host_wait_policy (process-wide: only a measurement calls it): the context's
    scheduling flags follow it."""
    from recordtool.decode.gpu import set_host_wait_policy

    try:
        assert set_host_wait_policy(0, "block") & 0x7 == 4
        assert set_host_wait_policy(0, "spin") & 0x7 == 1
    finally:
        assert set_host_wait_policy(0, "auto") & 0x7 == 0

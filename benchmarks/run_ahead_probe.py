"""Where a training loop waits beside the Loader's run-ahead bound, with engines_ahead on and off.

The loop of tests/gpu/test_loader_cuda.py's run-ahead test (batch 8, split="gpu", a 1 s pause
after batch 1, then a 1.5 s step queued on the default stream) over the GPU tests' mixed set
(tests/gpu_data.py, packed into --root), once with `engines_ahead=True` and once without. It
stamps each producer's `make` and each engines' submission (the backend's and decoder's methods
wrapped: a probe, not a mode of the library), each hand-out with the run-ahead and decode
seconds so far, and samples the main thread's stack every 0.1 s: a change of place is logged,
and a sampler gap over 0.25 s shows a thread holding the GIL.
"""
import argparse
import io
import os
import shutil
import sys
import threading
import time
import traceback

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")


def mixed_set(root: str) -> str:
    """The GPU tests' mixed set (engine, hybrid and CMYK files), packed into root/out."""
    sys.path[:0] = [TESTS]
    from conftest import photo_like, write
    from gpu_data import mixed_jpegs

    from recordtool.pack import pack

    shutil.rmtree(root, ignore_errors=True)
    bufs, _ = mixed_jpegs(40)
    for i, b in enumerate(bufs):
        write(f"{root}/src/c{i % 4}/{i}.jpg", b)
    cmyk = io.BytesIO()
    photo_like(200, 150, seed=99).convert("CMYK").save(cmyk, "JPEG", quality=90)
    write(f"{root}/src/c0/cmyk.jpg", cmyk.getvalue())
    pack(f"{root}/src", f"{root}/out", shards=2, progress=False)
    return f"{root}/out"


class Log:
    def __init__(self):
        self.t0, self.lines = time.perf_counter(), []

    def __call__(self, *a):
        self.lines.append((round(time.perf_counter() - self.t0, 3), threading.current_thread().name[-12:], *a))


def wrap(log: Log) -> None:
    """Stamp the backend's make and the decoder's engines' submission (a probe's wrappers)."""
    import recordtool.decode.gpu.backend as backend
    import recordtool.decode.gpu.decoder as decoder

    make, submit = backend.GPUBackend.make, decoder.GPUDecoder._submit

    def stamped_make(self, ids, epoch, slot, drawn=None):
        log("make>", slot, int(ids[0]))
        r = make(self, ids, epoch, slot, drawn)
        log("make<", slot, int(ids[0]), {k: round(v, 3) for k, v in r.stages.items() if v > 0.05})
        return r

    def stamped_submit(self, b):
        log("submit>", len(b.plan.engine))
        submit(self, b)
        log("submit<", round(b.t_submit, 3))

    backend.GPUBackend.make, decoder.GPUDecoder._submit = stamped_make, stamped_submit


def sampler(log: Log, main_id: int, stop: threading.Event) -> None:
    last, prev = time.perf_counter(), None
    while not stop.is_set():
        time.sleep(0.1)
        now = time.perf_counter()
        frame = sys._current_frames().get(main_id)
        where = " < ".join(f"{f.name}:{f.lineno}" for f in reversed(traceback.extract_stack(frame)[-3:])) \
            if frame is not None else "-"
        if now - last > 0.25:
            log("GAP", round(now - last, 3))
        if where != prev:
            log("main@", where)
            prev = where
        last = now


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/tmp/run-ahead-probe", help="where the mixed set is written (replaced)")
    args = ap.parse_args(argv)
    import cupy
    import torch

    from recordtool.loader import Loader

    packed = mixed_set(args.root)
    log = Log()
    wrap(log)
    torch.cuda.init()
    for ahead in (True, False):
        ld = Loader(packed, batch_size=8, size=64, device="cuda", dtype="float16", split="gpu", seed=3,
                    as_torch=False, run_ahead=1, engines_ahead=ahead)
        print("engines_ahead", ahead, "producers", ld.producers, "ring slots", ld.backend.ring.slots, flush=True)
        log.lines.clear()
        log.t0 = time.perf_counter()
        stop = threading.Event()
        th = threading.Thread(target=sampler, args=(log, threading.main_thread().ident, stop), daemon=True)
        th.start()
        done = []
        for k, (x, _) in enumerate(ld):
            log("TAKEN", k, round(ld.stage_seconds.get("run_ahead", 0), 3), round(ld.stage_seconds.get("decode", 0), 3),
                [e.query() for e in done])
            x.astype(cupy.float32).sum()
            if k == 1:
                time.sleep(1.0)
                log("pause end")
            torch.cuda._sleep(3_000_000_000 if k == 1 else 20_000_000)
            ev = torch.cuda.Event()
            ev.record()
            done.append(ev)
        torch.cuda.synchronize()
        ld.close()
        stop.set()
        th.join()
        for line in log.lines:
            print(*line)


if __name__ == "__main__":
    main()

"""`recordtool tune SRC`: what shrinking and re-encoding at pack time gains in loader speed and
costs in fidelity, measured on a sample of the user's own images.

For each candidate — the images as they are, and every `--max-side` × `--quality` pair — the
sample is packed by the real `pack` into a temporary folder, read back by the real `Loader`
(CPU; and GPU when CuPy finds a device), best epoch after a warm-up one, and its 224²
RandomResizedCrop outputs are compared with what Pillow makes from the ORIGINAL files with the
same windows: windows are drawn in the original image's pixels (`random_windows`, keyed by the
sample position) and scaled with the image for a shrunk record; the candidate's crops come from
the CPU decoder the Loader runs (`decode_crop_resize`), the references from
`decode.reference.truth` (Pillow decode → crop → resize) on the original bytes. PSNR and SSIM
(`recordtool.tools.fidelity`), median and 5th percentile over the sample. Speed is the median over
the timed epochs, with their spread: images per CPU-second for the CPU Loader (stable when
other work shares the cores), images per second for the GPU Loader. The recommendation: among
candidates with median PSNR ≥ `min_psnr`, those within the fastest one's spread (their fastest
epoch at least its slowest), then the most faithful of them — so runs that measure the same
costs recommend the same candidate (tune_report.py: the ranking and the table).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..decode import cpu, random_windows, reference
from ..checks import MAX_BATCH, MAX_EPOCHS, MAX_SEED, MAX_SIDE, MAX_THREADS, bounded_float, bounded_int
from ..errors import RecordtoolError
from ..util import cores
from .fidelity import IMPLEMENTATION, psnr, ssim
from ..pack.transcode import CONVERT_QUALITY, SPEED_PRESETS, Transcode
from .tune_report import recommend

DEFAULT_SIDES = (256, 320, 384, 448, 512)
DEFAULT_QUALITIES = (75, 85, 90, 95)
DEFAULT_MIN_PSNR = 35.0


@dataclass(frozen=True)
class Candidate:
    """One way to pack: `max_side` None is the images as they are (`pack` without options)."""

    max_side: int | None = None
    quality: int = CONVERT_QUALITY

    def __post_init__(self):  # ConfigError for `--sides 0`, `--qualities 101`, ...
        if self.max_side is not None:
            object.__setattr__(self, "max_side", bounded_int("max_side", self.max_side, 1, MAX_SIDE))
        object.__setattr__(self, "quality", bounded_int("quality", self.quality, 1, 100))

    @property
    def name(self) -> str:
        return "as-is" if self.max_side is None else f"{self.max_side}px q{self.quality}"

    @property
    def transcode(self) -> Transcode:
        if self.max_side is None:
            return Transcode()
        # shrunk images are re-encoded baseline 4:2:0 anyway; hw_friendly does the same for the
        # smaller progressive / odd-layout ones, so every record takes the fast decode paths
        return Transcode(max_side=self.max_side, quality=self.quality, hw_friendly=True)


def candidates(sides=DEFAULT_SIDES, qualities=DEFAULT_QUALITIES) -> list:
    """As-is first, then every side × quality pair."""
    return [Candidate()] + [Candidate(int(s), int(q)) for s in sides for q in qualities]


def preset_of(c: Candidate) -> str | None:
    """The `pack --preset` name this candidate packs exactly like, if any."""
    for name, t in SPEED_PRESETS.items():
        if t == c.transcode:
            return name
    return None


class SampleSource:
    """`n` items of a source drawn with `seed`, as a `Source` for `pack`. Each record's label is
    its position in the sample, so a packed record leads back to its original file whatever
    pack's shuffle and skips do.

    Args:
        source: any `Source` (an ImageFolderSource for a folder).
        n: sample size (all items when the source has fewer).
        seed: seed of the draw.
    """

    def __init__(self, source, n: int, seed: int = 0):
        self.source = source
        k = min(int(n), len(source.items))
        pick = np.sort(np.random.default_rng(seed).choice(len(source.items), k, replace=False))
        self.originals = [source.items[i] for i in pick]
        self.items = list(range(k))
        self.kind = source.kind
        self.skipped, self.warnings = [], []
        self.seed = seed

    def where(self, p: int) -> str:
        return self.source.where(self.originals[p])

    def load(self, p: int):
        data, _, filename = self.source.load(self.originals[p])
        return data, p, filename

    def original(self, p: int) -> bytes:
        return self.source.load(self.originals[p])[0]

    def classes(self, max_label: int):
        return [str(i) for i in range(max_label + 1)], None

    def describe(self) -> dict:
        return {"kind": self.kind, "sample_of": self.source.describe(), "images": len(self.items), "seed": self.seed}

    def close(self):
        pass


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device
        return False


def _references(sample: SampleSource, size: int, seed: int, threads: int):
    """Original sizes, windows in original pixels, and Pillow's crops of the original files;
    positions whose original Pillow cannot open are left out (None)."""
    import io

    from PIL import Image

    n = len(sample.items)
    dims = np.zeros((n, 2), np.int64)  # (width, height)
    win = np.zeros((n, 4), np.int64)
    refs = np.zeros((n, size, size, 3), np.uint8)

    def one(p):  # each original read and decoded once, its bytes dropped afterwards
        try:
            with Image.open(io.BytesIO(sample.original(p))) as im:
                dims[p] = im.size
                # windows are keyed by (seed, epoch, id): one image's is the batch's row
                win[p] = random_windows(dims[p:p + 1, 0], dims[p:p + 1, 1], [p], seed, 0)[0]
                refs[p] = reference.truth_of(im.convert("RGB"), win[p], size, size)
            return True
        except Exception:
            return False

    with ThreadPoolExecutor(threads) as ex:
        ok = np.array(list(ex.map(one, range(n))), bool)
    return dims, win, refs, ok


def _fidelity(ds, dims, win, refs, ok, size: int, threads: int, chunk: int = 64) -> dict:
    """PSNR/SSIM of the pack's crops (CPU decoder, windows scaled to each record's size) against
    the references, per sample position."""
    ix = ds.index
    pos = ix.label.astype(np.int64)
    keep = np.nonzero(ok[pos])[0]  # records whose original has a reference
    d = np.maximum(dims[pos], 1)  # 0 where Pillow could not open the original (not in keep)
    scale = np.stack([ix.height / d[:, 1], ix.width / d[:, 0]], axis=1).astype(np.float64)
    mapped = win[pos].astype(np.float64) * np.concatenate([scale, scale], axis=1)  # windows scale with the image

    def one(lo):
        rec = keep[lo:lo + chunk]
        errors = []
        out = cpu.decode_crop_resize([ds[int(r)][0] for r in rec], mapped[rec], size=(size, size), threads=1,
                                     pool=-1, on_error="skip", fallback=True, errors=errors)
        good = np.ones(len(rec), bool)
        good[[i for i, _ in errors]] = False
        ref = refs[pos[rec]]
        return psnr(out[good], ref[good]), ssim(out[good], ref[good]), int((~good).sum())

    with ThreadPoolExecutor(threads) as ex:
        parts = list(ex.map(one, range(0, len(keep), chunk)))
    p = np.concatenate([a for a, _, _ in parts]) if parts else np.zeros(0)
    s = np.concatenate([b for _, b, _ in parts]) if parts else np.zeros(0)
    stat = (lambda v, q: float(np.percentile(v, q)) if len(v) else float("nan"))  # noqa: E731
    return {"images": int(len(p)), "undecodable": sum(f for _, _, f in parts),
            "psnr_median": stat(p, 50), "psnr_p5": stat(p, 5), "ssim_median": stat(s, 50), "ssim_p5": stat(s, 5)}


def _loader_rate(path, device: str, batch_size: int, threads: int, epochs: int, seed: int) -> dict:
    """The real Loader through `bench.loader_epochs`: per timed epoch (the first warms up) images
    per wall second and per second of this process's CPU time; their medians and spreads."""
    from .bench import loader_epochs
    from ..loader import Loader

    ld = Loader(path, batch_size=batch_size, device=device, train=True, seed=seed, threads=threads,
                as_torch=False, dtype="float16" if device == "cuda" else "float32")
    try:
        r = loader_epochs(ld, max(2, epochs))
    finally:
        ld.close()
    wall, cpu_rate = r["epochs_img_s"], r["epochs_img_per_cpu_s"]
    return {"img_s": float(np.median(wall)), "img_s_spread": _spread(wall), "epochs_img_s": wall,
            "img_per_cpu_s": float(np.median(cpu_rate)), "img_per_cpu_s_spread": _spread(cpu_rate),
            "epochs_img_per_cpu_s": cpu_rate, "cores_busy": r["cores_busy"]}


def _spread(v) -> float:
    """(max − min) / median of repeated measurements: how far apart the epochs were."""
    v = np.asarray(v, np.float64)
    med = float(np.median(v)) if len(v) else float("nan")
    return float((v.max() - v.min()) / med) if len(v) and med > 0 else float("nan")


def run(src, images: int = 1000, seed: int = 0, cands: list | None = None, min_psnr: float = DEFAULT_MIN_PSNR,
        devices: tuple = ("cpu",), batch_size: int = 128, epochs: int = 3, threads: int | None = None,
        workers: int | None = None, size: int = 224, work_dir: str | None = None, keep: bool = False,
        progress: bool = True) -> dict:
    """Pack a sample of SRC every candidate way, measure Loader speed and crop fidelity.

    Args:
        src: an ImageNet-style folder, or any `Source`.
        images: sample size (drawn with `seed`).
        seed: seed of the sample draw, the windows and the loaders.
        cands: `Candidate`s (default: `candidates()`: as-is + 5 sides × 4 qualities).
        min_psnr: the recommendation is the fastest candidate with median PSNR ≥ this (dB).
        devices: loaders to time: "cpu" and/or "cuda".
        batch_size: Loader batch size (drop_last: keep it well under `images`).
        epochs: Loader epochs per candidate, the first a warm-up; the median of the others counts.
        threads: decode threads (default: cores).
        workers: pack workers (default: pack's).
        size: output side of the RandomResizedCrop (224).
        work_dir: where the temporary folder for the packs is made (default: the system's).
        keep: keep the packs (their folder is in the result's "work_dir").
        progress: print a line per candidate.
    """
    from ..pack import pack
    from ..reader import Dataset

    images = bounded_int("images", images, 1)
    seed = bounded_int("seed", seed, 0, MAX_SEED)
    min_psnr = bounded_float("min_psnr", min_psnr, 0, 200)
    batch_size = bounded_int("batch_size", batch_size, 1, MAX_BATCH)
    epochs = bounded_int("epochs", epochs, 1, MAX_EPOCHS)
    threads = bounded_int("threads", threads, 1, MAX_THREADS) if threads is not None else cores()
    workers = bounded_int("workers", workers, 1, MAX_THREADS) if workers is not None else None
    size = bounded_int("size", size, 1, cpu.MAX_OUTPUT_SIDE)
    cands = list(cands) if cands else candidates()
    if isinstance(src, (str, os.PathLike)):
        from ..sources.imagefolder import ImageFolderSource

        source = ImageFolderSource(os.fspath(src))
    else:
        source = src
    sample = SampleSource(source, images, seed)
    if len(sample.items) < batch_size:
        raise ValueError(f"sample of {len(sample.items)} images is smaller than one batch ({batch_size}): "
                         "lower --batch-size or raise --images")
    say = (lambda *a: print(*a, flush=True)) if progress else (lambda *a: None)
    t0 = time.perf_counter()
    dims, win, refs, ok = _references(sample, size, seed, threads)
    say(f"tune: {len(sample.items)} images sampled from {source.describe().get('path', source.kind)}; "
        f"references (Pillow on the originals) in {time.perf_counter() - t0:.1f} s")
    made_work_dir = bool(work_dir) and not os.path.isdir(work_dir)
    if made_work_dir:
        os.makedirs(work_dir)
    tmp = tempfile.mkdtemp(prefix="recordtool-tune-", dir=work_dir)  # ours alone: removed at the end
    rows = []
    try:
        for k, c in enumerate(cands):
            out = os.path.join(tmp, f"c{k:02d}")
            s = pack(sample, out, workers=workers, seed=seed, transcode=c.transcode, progress=False)
            row = {"name": c.name, "max_side": c.max_side, "quality": c.quality, "preset": preset_of(c),
                   "records": s.records, "converted": len(s.converted), "skipped": len(s.skipped),
                   "bytes": s.bytes, "pack_rec_s": s.records / s.seconds if s.seconds else float("nan")}
            ds = Dataset(out)
            row["mean_pixels"] = float(np.mean(ds.index.width.astype(np.float64) * ds.index.height))
            row.update(_fidelity(ds, dims, win, refs, ok, size, threads))
            for dev in devices:
                try:
                    row[dev] = _loader_rate(out, dev, batch_size, threads, epochs, seed)
                except Exception as e:  # e.g. the GPU decoder fails: reported, the others still run
                    row[dev] = {"error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            rates = "  ".join(f"{d} {row[d]['img_s']:,.0f} img/s" if "img_s" in row[d] else f"{d} failed"
                              for d in devices)
            say(f"  {c.name:<12} {s.bytes / 1e6:7.1f} MB  PSNR {row['psnr_median']:5.1f} dB (p5 "
                f"{row['psnr_p5']:5.1f})  SSIM {row['ssim_median']:.4f}  {rates}")
            del ds
            if not keep:
                shutil.rmtree(out)
    finally:
        if source is not src:  # made here from a path
            source.close()
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
            if made_work_dir:
                try:
                    os.rmdir(work_dir)  # made by us above, and empty now
                except OSError:
                    pass
    r = {"source": source.describe(), "images": len(sample.items), "seed": seed, "size": size,
         "fidelity": IMPLEMENTATION,
         "batch_size": batch_size, "epochs": epochs, "threads": threads, "cores": cores(),
         "devices": list(devices), "min_psnr": min_psnr, "candidates": rows, "peers": {}}
    if "cuda" in devices:
        r["peers"]["dali_files"] = _dali_peer(sample, batch_size, threads, epochs)
    r["seconds"] = time.perf_counter() - t0
    if keep:
        r["work_dir"] = tmp
    r["recommended"] = recommend(r)
    return r


def _dali_peer(sample: SampleSource, batch_size, threads, epochs):
    """DALI on the sample's original JPEG files (what GPU users compare with; `peers.dali_best`:
    the best of its hardware-decoder loads): img/s, or why it did not run."""
    from . import peers

    paths = [getattr(item, "path", None) for item in sample.originals]
    if None in paths:
        return "not run: the source has no plain files (DALI reads files)"
    if not peers.dali_available():
        return "not run: nvidia.dali does not import"
    files = []
    for p, path in enumerate(paths):
        with open(path, "rb") as f:
            if peers.is_jpeg(f.read(4)):  # DALI's decoder stops on a PNG named .JPEG
                files.append((path, p))
    try:
        import cupy

        return peers.dali_best(files, "cuda", batch_size, threads, epochs,
                               device_id=cupy.cuda.runtime.getDevice())["img_s"]
    except Exception as e:  # failing peer: reported, not fatal
        return f"not run: {type(e).__name__}: {e}"

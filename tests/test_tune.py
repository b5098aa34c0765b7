"""recordtool tune: fidelity measures, the sample, window mapping, cleanup, CLI; pack --preset."""
import json
import math
import os

import numpy as np
import pytest
from click.testing import CliRunner

import recordtool
from conftest import jpeg_bytes, photo_like, write
from recordtool.cli import main
from recordtool.tools.fidelity import PSNR_CAP, gaussian_window, psnr, ssim, ssim_numpy
from recordtool.pack.transcode import SPEED_PRESETS, Transcode
from recordtool.sources.imagefolder import ImageFolderSource
from recordtool.tools.tune import Candidate, SampleSource, candidates, preset_of, run
from recordtool.tools.tune_report import recommend


# ---------------------------------------------------------------- fidelity

def _ssim_loops(a, b, size=11, sigma=1.5):
    """Wang et al. written out on BT.601 luma: every window position, plain Python floats."""
    g = [math.exp(-((i - (size - 1) / 2) ** 2) / (2 * sigma * sigma)) for i in range(size)]
    total = sum(g)
    w = [[g[i] * g[j] / total / total for j in range(size)] for i in range(size)]
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    H, W, _ = a.shape

    def y_of(im, r, c):
        red, green, blue = (float(v) for v in im[r, c])
        return 0.299 * red + 0.587 * green + 0.114 * blue

    vals = []
    for y in range(H - size + 1):
        for x in range(W - size + 1):
            mx = my = sxx = syy = sxy = 0.0
            for i in range(size):
                for j in range(size):
                    p, q, k = y_of(a, y + i, x + j), y_of(b, y + i, x + j), w[i][j]
                    mx += k * p
                    my += k * q
                    sxx += k * p * p
                    syy += k * q * q
                    sxy += k * p * q
            sxx, syy, sxy = sxx - mx * mx, syy - my * my, sxy - mx * my
            vals.append((2 * mx * my + c1) * (2 * sxy + c2) / ((mx * mx + my * my + c1) * (sxx + syy + c2)))
    return sum(vals) / len(vals)


def test_ssim_matches_the_formula_written_out():
    rng = np.random.default_rng(0)
    a = np.asarray(photo_like(15, 13, seed=1))
    b = np.clip(a.astype(int) + rng.integers(-20, 21, a.shape), 0, 255).astype(np.uint8)
    c = np.full_like(a, 200)
    for x, y in ((a, b), (a, c), (b, a)):
        assert ssim(x, y) == pytest.approx(_ssim_loops(x, y), abs=2e-6)
        assert ssim_numpy(x, y) == pytest.approx(_ssim_loops(x, y), abs=2e-6)
    assert ssim(a, a) == pytest.approx(1.0, abs=1e-6)
    batch = ssim_numpy(np.stack([a, a, b]), np.stack([b, c, a]), chunk=2)
    assert batch.shape == (3,) and batch[0] == pytest.approx(ssim_numpy(a, b), abs=1e-9)
    assert batch[2] == pytest.approx(ssim_numpy(b, a), abs=1e-9)
    assert np.isclose(gaussian_window().sum(), 1) and len(gaussian_window()) == 11
    with pytest.raises(ValueError):
        ssim(a[:10], b[:10])


def test_psnr():
    a = np.asarray(photo_like(20, 10, seed=2))
    b = a.copy()
    assert psnr(a, b) == PSNR_CAP
    b[a < 255] += 1
    b[a == 255] -= 1  # every value off by exactly 1: MSE 1
    assert psnr(a, b) == pytest.approx(10 * math.log10(255 ** 2))
    assert list(psnr(np.stack([a, a]), np.stack([a, b]))) == pytest.approx([PSNR_CAP, 48.1308], abs=1e-4)


# ---------------------------------------------------------------- tune

@pytest.fixture
def photos(tmp_path):
    """24 small photo-like JPEGs (2 classes), larger than the 96 px candidate below."""
    root = tmp_path / "photos"
    for k in range(24):
        write(str(root / f"c{k % 2}" / f"{k}.jpg"),
              jpeg_bytes(150 + 10 * (k % 5), 120 + 6 * (k % 3), seed=k, quality=92, subsampling=k % 3))
    return root


def test_sample_labels_lead_back_to_the_originals(photos):
    src = ImageFolderSource(str(photos))
    s = SampleSource(src, 10, seed=3)
    assert s.items == list(range(10))
    assert [s.load(p)[1] for p in s.items] == s.items
    assert all(s.original(p) == open(s.originals[p].path, "rb").read() for p in s.items)
    assert SampleSource(src, 10, seed=3).originals == s.originals != SampleSource(src, 10, seed=4).originals
    assert len(SampleSource(src, 100).items) == 24


def test_tune_measures_and_cleans_up(photos, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "mine.txt").write_text("not tune's")
    cands = [Candidate(), Candidate(96, 85)]
    r = run(str(photos), images=20, seed=1, cands=cands, min_psnr=0, batch_size=8, epochs=2, size=64,
            work_dir=str(work), progress=False)
    assert os.listdir(work) == ["mine.txt"]  # its temporary packs removed, nothing else
    asis, small = r["candidates"]
    assert asis["records"] == small["records"] == 20 and asis["converted"] == 0 and small["converted"] == 20
    assert asis["preset"] == "lossless" and small["bytes"] < asis["bytes"]
    for c in (asis, small):
        assert c["images"] == 20 and c["undecodable"] == 0 and c["cpu"]["img_s"] > 0
        assert c["psnr_p5"] <= c["psnr_median"] and 0 < c["ssim_p5"] <= c["ssim_median"] <= 1
    # as-is: only the fused decoder's own error against Pillow
    assert asis["psnr_median"] > 45 and asis["ssim_median"] > 0.99
    # shrunk to 96 px: a loss, but windows scaled with the image still frame the same content
    # (unscaled windows on the shrunk image would compare unrelated pixels: < 20 dB)
    assert 24 < small["psnr_median"] < asis["psnr_median"]
    fastest = max(r["candidates"], key=lambda c: c["cpu"]["img_per_cpu_s"])
    within = min(fastest["cpu"]["epochs_img_per_cpu_s"])  # the fastest's slowest epoch
    assert r["recommended"] == max((c for c in r["candidates"] if max(c["cpu"]["epochs_img_per_cpu_s"]) >= within),
                                   key=lambda c: c["psnr_median"])["name"]
    assert all(len(c["cpu"]["epochs_img_per_cpu_s"]) == 1 for c in r["candidates"])  # epochs=2: 1 timed
    json.dumps(r)
    r["min_psnr"] = 200
    assert recommend(r) is None


def test_tune_cli(photos, tmp_path):
    res = CliRunner().invoke(main, ["tune", str(photos), "--images", "16", "--sides", "96", "--qualities", "80",
                                    "--batch-size", "8", "--epochs", "2", "--device", "cpu", "--min-psnr", "20",
                                    "--keep", "--work-dir", str(tmp_path / "w"), "--json", str(tmp_path / "t.json"),
                                    "--plot", str(tmp_path / "t.png"), "-q"])
    assert res.exit_code == 0, res.output
    assert "recommended:" in res.output and "96px q80" in res.output and "as-is" in res.output
    r = json.loads((tmp_path / "t.json").read_text())
    assert [c["name"] for c in r["candidates"]] == ["as-is", "96px q80"]
    assert len(recordtool.open(os.path.join(r["work_dir"], "c01"))) == 16  # --keep: packs left for a look
    from PIL import Image

    assert Image.open(tmp_path / "t.png").size == (935, 572)  # matplotlib's 8.5 × 5.2 in at 110 dpi
    bad = CliRunner().invoke(main, ["tune", str(photos), "--sides", "a,b"])
    assert bad.exit_code != 0 and "--sides" in bad.output


def test_candidates_and_presets():
    c = candidates((256, 384), (85, 95))
    assert [x.name for x in c] == ["as-is", "256px q85", "256px q95", "384px q85", "384px q95"]
    for name, t in SPEED_PRESETS.items():
        assert preset_of(Candidate(t.max_side, t.quality) if t.max_side else Candidate()) == name


# ---------------------------------------------------------------- pack --preset / --keys

def test_pack_speed_presets(tmp_path):
    src = tmp_path / "src"
    write(str(src / "a" / "big.jpg"), jpeg_bytes(900, 600, seed=1))
    write(str(src / "a" / "prog.jpg"), jpeg_bytes(90, 30, seed=2, progressive=True))
    runner = CliRunner()
    for preset in ("fast", "balanced", "lossless"):
        res = runner.invoke(main, ["pack", str(src), str(tmp_path / preset), "--preset", preset, "-q"])
        assert res.exit_code == 0, res.output
        ds, t = recordtool.open(tmp_path / preset), SPEED_PRESETS[preset]
        m = ds.manifest["pack"]
        assert (m["max_side"], m["quality"], m["hw_friendly"]) == (t.max_side, t.quality, t.hw_friendly)
        assert max(ds.index.width) == (t.max_side or 900)
        assert ds.index.progressive.any() == (preset == "lossless")
    res = runner.invoke(main, ["pack", str(src), str(tmp_path / "o"), "--preset", "fast", "--quality", "70",
                               "--max-side", "200", "-q"])
    assert res.exit_code == 0, res.output
    m = recordtool.open(tmp_path / "o").manifest["pack"]
    assert (m["max_side"], m["quality"], m["hw_friendly"]) == (200, 70, True)  # explicit options win
    res = runner.invoke(main, ["pack", str(src), str(tmp_path / "o2"), "--max-side", "200", "-q"])
    m = recordtool.open(tmp_path / "o2").manifest["pack"]
    assert (m["max_side"], m["quality"], m["hw_friendly"]) == (200, Transcode().quality, False)  # no preset


def test_preset_is_a_speed_preset_only(tmp_path):
    """Feature keys are --keys: --preset names a speed preset, and a TFRecord key set given to it
    is a usage error naming the choices, not a pack."""
    fx = os.path.join(os.path.dirname(__file__), "fixtures", "tfrecord", "slim-00000-of-00002")
    runner = CliRunner()
    res = runner.invoke(main, ["pack", "--from", "tfrecord", "--keys", "tf-slim", fx, str(tmp_path / "k"), "-q"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["pack", "--from", "tfrecord", "--preset", "tf-slim", fx, str(tmp_path / "p"), "-q"])
    assert res.exit_code == 2 and "'fast', 'balanced', 'lossless'" in res.output and not (tmp_path / "p").exists()

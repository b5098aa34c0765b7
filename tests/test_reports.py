"""What the tools report: tune's recommendation from a measure with its spread, the PNGs of
`bench --plot` / `tune --plot` drawn by matplotlib, and fidelity.py against scikit-image."""
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import photo_like
from recordtool.tools import fidelity, plots
from recordtool.tools.tune_report import recommend, table


def _row(name, side, q, psnr, per_cpu, wall=None):
    per_cpu = list(per_cpu)
    wall = list(wall or [v / 3 for v in per_cpu])
    m = {"img_s": float(np.median(wall)), "img_s_spread": (max(wall) - min(wall)) / float(np.median(wall)),
         "epochs_img_s": wall, "img_per_cpu_s": float(np.median(per_cpu)),
         "img_per_cpu_s_spread": (max(per_cpu) - min(per_cpu)) / float(np.median(per_cpu)),
         "epochs_img_per_cpu_s": per_cpu, "cores_busy": 1.5}
    return {"name": name, "max_side": side, "quality": q, "preset": None, "records": 100, "converted": 0 if side is None
            else 100, "skipped": 0, "bytes": 10**6, "pack_rec_s": 500.0, "psnr_median": psnr, "psnr_p5": psnr - 2,
            "ssim_median": 0.95, "ssim_p5": 0.9, "cpu": m}


def _result(rows, min_psnr=35.0):
    r = {"images": 100, "size": 224, "batch_size": 16, "epochs": 4, "threads": 2, "devices": ["cpu"],
         "min_psnr": min_psnr, "candidates": rows, "peers": {}}
    r["recommended"] = recommend(r)
    return r


def test_recommendation_takes_the_spread_into_account():
    rows = [_row("as-is", None, 95, 100.0, [400, 410, 405]),
            _row("256px q85", 256, 85, 36.0, [1000, 1040, 1020]),  # the fastest, ±2 %
            _row("256px q95", 256, 95, 38.0, [1010, 980, 1005]),  # within its spread, more faithful
            _row("320px q95", 320, 95, 41.0, [800, 810, 790]),  # clearly slower
            _row("192px q75", 192, 75, 31.0, [1500, 1510, 1490])]  # fastest of all but under min_psnr
    assert _result(rows)["recommended"] == "256px q95"
    # measurements that hold still: the fastest alone is within its own spread
    still = [dict(c, cpu=dict(c["cpu"], img_per_cpu_s_spread=0.0, epochs_img_per_cpu_s=[c["cpu"]["img_per_cpu_s"]] * 3))
             for c in rows]
    assert _result(still)["recommended"] == "256px q85"
    assert _result(rows, min_psnr=50)["recommended"] == "as-is" and _result(rows, min_psnr=101)["recommended"] is None
    text = table(_result(rows))
    assert "1,020 ±  2%" in text and "256px q95" in text and "<- recommended" in text
    assert "median of 3 epochs" in text


def test_a_candidate_slower_than_every_epoch_of_the_fastest_is_not_within_its_spread():
    """Within the fastest's spread means the epochs overlap: a candidate's fastest epoch at
    least the fastest's slowest. The fastest's median less its whole range lies below all its
    epochs, and a more faithful candidate slower than each of them is slower, not "as fast"."""
    fastest = _row("256px q85", 256, 85, 36.0, [900, 1000, 1100])  # median 1000 ± 10 %
    slower = _row("320px q95", 320, 95, 41.0, [850, 860, 870])  # above 1000 - 200, below 900
    assert _result([fastest, slower])["recommended"] == "256px q85"
    touching = _row("288px q90", 288, 90, 39.0, [880, 900, 890])  # its best epoch = the fastest's slowest
    assert _result([fastest, slower, touching])["recommended"] == "288px q90"
    # the ranges overlap, though the candidate's median is below the fastest's slowest epoch
    overlapping = _row("320px q90", 320, 90, 40.0, [860, 870, 950])
    assert _result([fastest, slower, overlapping])["recommended"] == "320px q90"
    # on the GPU the measure is the GPU Loader's wall-clock rate, its epochs alike (here the CPU's
    # epochs of the touching candidate are far below: ranked by them it would not be within)
    gpu = [dict(c, cuda=dict(img_s=c["cpu"]["img_per_cpu_s"], epochs_img_s=c["cpu"]["epochs_img_per_cpu_s"]))
           for c in (fastest, slower, touching)]
    gpu[2]["cpu"] = dict(gpu[2]["cpu"], epochs_img_per_cpu_s=[100.0] * 3, img_per_cpu_s=100.0)
    assert recommend(dict(_result(gpu), devices=["cpu", "cuda"])) == "288px q90"
    assert recommend(dict(_result(gpu), devices=["cpu"])) == "256px q85"
    # a row without its epochs (its median alone) is within only where it reaches the slowest epoch
    bare = [dict(c, cpu={k: v for k, v in c["cpu"].items() if not k.startswith("epochs_")}) for c in (fastest, slower)]
    assert _result(bare)["recommended"] == "256px q85"


def test_tune_plot_renders(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    rows = [_row("as-is", None, 95, 100.0, [400, 410])] + [
        _row(f"{s}px q{q}", s, q, 25 + s / 40 + q / 20, [3e5 / s + q, 3e5 / s + q * 1.02])
        for s in (256, 320, 384, 448, 512) for q in (75, 85, 90, 95)]
    plots.tune(_result(rows, min_psnr=33), str(tmp_path / "t.png"))
    im = np.asarray(Image.open(tmp_path / "t.png").convert("RGB"))
    assert im.shape[:2] == (572, 935) and (im < 100).any() and (im > 250).mean() > 0.5  # drawn, mostly white
    empty = _result([_row("as-is", None, 95, float("nan"), [1.0])])
    plots.tune(empty, str(tmp_path / "e.png"))  # nothing measured: still a figure, saying so


def test_bench_plot_renders(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    r = {"records": 120, "mean_jpeg_kb": 68.0, "device": "cuda", "threads": 16, "batch_size": 256,
         "read": {"records_s": 5e4, "mb_s": 3e3}, "decode": {"img_s": 9000.0}, "loader": {"img_s": 8000.0},
         "dali": {"img_s": 8300.0}, "dali_files": {"error": "not run"}, "baseline_pil": {"img_s": 900.0},
         "peers": {"torchvision.io.decode_jpeg": (5000.0, "x"), "missing": "not installed"}}
    plots.bench(r, str(tmp_path / "b.png"))
    assert Image.open(tmp_path / "b.png").size[0] == 880


def test_plot_without_matplotlib_is_refused_before_measuring(tmp_path, monkeypatch):
    from recordtool.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    res = CliRunner().invoke(main, ["tune", str(tmp_path), "--plot", str(tmp_path / "t.png"), "-q"])
    assert res.exit_code == 1 and "pip install 'recordtool[plot]'" in res.output
    res = CliRunner().invoke(main, ["bench", str(tmp_path), "--plot", str(tmp_path / "b.png"), "-q"])
    assert res.exit_code == 1 and "pip install 'recordtool[plot]'" in res.output


def _pairs():
    rng = np.random.default_rng(0)
    for k, (w, h) in enumerate([(40, 30), (64, 64), (23, 17)]):
        a = np.asarray(photo_like(w, h, seed=k))
        b = np.clip(a.astype(int) + rng.integers(-25, 26, a.shape), 0, 255).astype(np.uint8)
        yield a, b
    yield a, np.full_like(a, 17)


def test_our_psnr_and_ssim_equal_scikit_image():
    metrics = pytest.importorskip("skimage.metrics")
    for a, b in _pairs():
        ref_p = metrics.peak_signal_noise_ratio(a, b, data_range=255)
        ref_s = metrics.structural_similarity(fidelity.luma(a).astype(np.float64), fidelity.luma(b).astype(np.float64),
                                              gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
                                              data_range=255)
        assert fidelity.psnr_numpy(a, b) == pytest.approx(ref_p, abs=1e-9)
        assert fidelity.ssim_numpy(a, b) == pytest.approx(ref_s, abs=1e-5)
        assert fidelity.psnr(a, b) == pytest.approx(ref_p, abs=1e-9)  # what tune uses: scikit-image's
        assert fidelity.ssim(a, b) == pytest.approx(ref_s, abs=1e-12)
    a, _ = next(_pairs())
    assert fidelity.psnr(a, a) == fidelity.PSNR_CAP and fidelity.IMPLEMENTATION.startswith("scikit-image")
    batch = np.stack([a, a]), np.stack([a, np.full_like(a, 3)])
    assert np.allclose(fidelity.ssim(*batch), fidelity.ssim_numpy(*batch), atol=1e-5)

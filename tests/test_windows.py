"""Crop windows: torchvision's rule, reproducible per sample whatever the batch or order."""
import math
import random

import numpy as np
import pytest
from scipy import stats

from recordtool.decode import center_windows, random_flips, random_windows


def torchvision_get_params(rng: random.Random, width, height, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """RandomResizedCrop.get_params, transcribed with Python's RNG in place of torch's."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = rng.randint(0, height - h)
            j = rng.randint(0, width - w)
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


@pytest.mark.parametrize("size", [(500, 375), (120, 900)])
def test_distribution_matches_torchvision(size):
    n = 100_000
    W, H = size
    ours = random_windows(np.full(n, W), np.full(n, H), np.arange(n), seed=11, epoch=3)
    rng = random.Random(5)
    ref = np.array([torchvision_get_params(rng, W, H) for _ in range(n)])
    for name, f in [("area", lambda a: a[:, 2] * a[:, 3] / (W * H)),
                    ("log aspect", lambda a: np.log(a[:, 3] / a[:, 2])),
                    ("centre x", lambda a: (a[:, 1] + a[:, 3] / 2) / W),
                    ("centre y", lambda a: (a[:, 0] + a[:, 2] / 2) / H)]:
        p = stats.ks_2samp(f(ours), f(ref)).pvalue
        assert p > 0.01, (name, p)


def test_windows_inside_image_and_positive():
    rng = np.random.default_rng(0)
    W = rng.integers(1, 3000, 20000)
    H = rng.integers(1, 3000, 20000)
    win = random_windows(W, H, np.arange(20000), seed=1, epoch=0)
    y, x, h, w = win.T
    assert (h > 0).all() and (w > 0).all() and (y >= 0).all() and (x >= 0).all()
    assert (y + h <= H).all() and (x + w <= W).all()


def test_fallback_is_torchvision_centre_crop():
    # a 1000×10 strip never fits the ratio range: every sample takes the fallback
    win = random_windows([1000, 10, 7], [10, 1000, 7], [0, 1, 2], seed=0, epoch=0, scale=(0.99, 1.0))
    rng = random.Random(0)
    for k, (W, H) in enumerate([(1000, 10), (10, 1000)]):
        assert tuple(win[k]) == torchvision_get_params(rng, W, H, scale=(0.99, 1.0))


def test_keyed_by_seed_epoch_id_only():
    W = np.array([500, 640, 333, 1024])
    H = np.array([375, 480, 500, 768])
    ids = np.array([7, 123456789, 3, 42])
    full = random_windows(W, H, ids, seed=9, epoch=4)
    perm = [2, 0, 3, 1]
    assert np.array_equal(random_windows(W[perm], H[perm], ids[perm], 9, 4), full[perm])
    assert np.array_equal(random_windows(W[1:2], H[1:2], ids[1:2], 9, 4), full[1:2])
    assert not np.array_equal(random_windows(W, H, ids, 9, 5), full)
    assert not np.array_equal(random_windows(W, H, ids, 10, 4), full)


def test_flips_fair_and_keyed():
    f = random_flips(np.arange(100_000), seed=3, epoch=1)
    assert abs(f.mean() - 0.5) < 0.01
    assert np.array_equal(random_flips([5, 9], 3, 1), f[[5, 9]])


def test_center_windows_match_resize_then_centre_crop():
    for W, H in [(500, 375), (375, 500), (256, 256), (1000, 300), (257, 999)]:
        (y, x, h, w), = center_windows([W], [H])
        rw, rh = (256, int(256 * H / W)) if W <= H else (int(256 * W / H), 256)
        top, left = int(round((rh - 224) / 2.0)), int(round((rw - 224) / 2.0))
        assert math.isclose(x, left * W / rw) and math.isclose(y, top * H / rh)
        assert math.isclose(w, 224 * W / rw) and math.isclose(h, 224 * H / rh)

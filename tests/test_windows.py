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


# ---------------------------------------------------------------- the Loader's crop options (Recipe + TrainCrop / EvalCrop)

def old_center_windows(widths, heights, resize=256, crop=224):
    """center_windows as it was before sizes and crop_pct were options (square only)."""
    W = np.asarray(widths, dtype=np.float64)
    H = np.asarray(heights, dtype=np.float64)
    short, long_ = np.minimum(W, H), np.maximum(W, H)
    new_long = np.floor(resize * long_ / short)
    rw = np.where(W <= H, resize, new_long)
    rh = np.where(W <= H, new_long, resize)
    sx, sy = W / rw, H / rh
    top, left = np.round((rh - crop) / 2.0), np.round((rw - crop) / 2.0)
    out = np.empty((len(W), 4), np.float64)
    out[:, 0] = np.clip(top * sy, 0, None)
    out[:, 1] = np.clip(left * sx, 0, None)
    out[:, 2] = np.minimum(crop * sy, H - out[:, 0])
    out[:, 3] = np.minimum(crop * sx, W - out[:, 1])
    return out


def recipe(widths, heights, train=True, size=224, seed=0, **crop):
    """A Recipe over an index of these image sizes (sample id k: widths[k] × heights[k])."""
    from types import SimpleNamespace

    from recordtool.decode.spec import EvalCrop, Output, TrainCrop
    from recordtool.decode.recipe import Recipe

    ix = SimpleNamespace(width=np.asarray(widths, np.int64), height=np.asarray(heights, np.int64))
    return Recipe(SimpleNamespace(index=ix), Output(size), seed, TrainCrop(**crop) if train else EvalCrop(**crop))


PIN_IDS = np.array([0, 1, 2, 7, 33, 49])
PIN_W = np.zeros(50, np.int64)
PIN_H = np.zeros(50, np.int64)
PIN_W[PIN_IDS], PIN_H[PIN_IDS] = [472, 233, 521, 495, 254, 681], [725, 343, 493, 215, 210, 399]
# (seed, epoch) → the windows and flips the Loader drew for PIN_IDS before its crop options existed
PINNED = {(0, 0): ([[332, 21, 329, 376], [29, 19, 213, 190], [44, 163, 295, 344], [16, 65, 177, 178],
                    [57, 10, 135, 180], [9, 103, 376, 465]], [0, 0, 1, 1, 1, 0]),
          (7, 3): ([[375, 1, 247, 186], [110, 50, 189, 182], [11, 87, 419, 422], [62, 345, 122, 111],
                    [11, 11, 195, 239], [139, 48, 255, 326]], [0, 0, 1, 0, 1, 1])}


@pytest.mark.parametrize("explicit", [False, True])
def test_default_crop_options_draw_the_batches_of_before(explicit):
    """The defaults (and the same values given explicitly) draw exactly the windows and flips
    the Loader drew before scale / ratio / hflip / crop_pct were options, and the evaluation
    window of 256 → 224."""
    kw = dict(scale=(0.08, 1.0), ratio=(0.75, 4 / 3), hflip=0.5) if explicit else {}
    for (seed, epoch), (win, flips) in PINNED.items():
        got_win, got_flips = recipe(PIN_W, PIN_H, seed=seed, **kw).draws(PIN_IDS, epoch)
        assert got_win.tolist() == win and got_flips.astype(int).tolist() == flips
    ev_kw = dict(crop_pct=0.875) if explicit else {}
    got, flips = recipe(PIN_W, PIN_H, train=False, **ev_kw).draws(PIN_IDS, 5)
    assert np.array_equal(got, old_center_windows(PIN_W[PIN_IDS], PIN_H[PIN_IDS], 256, 224)) and not flips.any()


def test_a_square_cover_box_is_torchvisions_resize_of_the_shorter_side():
    rng = np.random.default_rng(4)
    W, H = rng.integers(1, 3000, 5000), rng.integers(1, 3000, 5000)
    W[:3], H[:3] = [256, 300, 999], [256, 999, 300]
    for r, c in [(256, 224), (183, 160), (7, 5), (320, 320)]:
        ref = old_center_windows(W, H, r, c)
        assert np.array_equal(center_windows(W, H, (r, r), (c, c)), ref)
        assert np.array_equal(center_windows(W, H, r, c), ref)


def timm_eval_window(W, H, size, crop_pct):
    """timm's evaluation transform (crop_mode "center") transcribed — Resize(floor(side /
    crop_pct)) of the shorter side for a square size, ResizeKeepRatio to cover the box for
    (h, w), torchvision's int() for the other side — then CenterCrop(size), as a window in the
    source's pixels (y, x, h, w)."""
    h, w = size
    bh, bw = math.floor(h / crop_pct), math.floor(w / crop_pct)
    if bw * H >= bh * W:  # the width binds
        rw, rh = bw, int(bw * H / W)
    else:
        rw, rh = int(bh * W / H), bh
    top, left = int(round((rh - h) / 2.0)), int(round((rw - w) / 2.0))
    return top * H / rh, left * W / rw, h * H / rh, w * W / rw


@pytest.mark.parametrize("size", [(224, 224), (160, 256), (256, 160), (33, 300), (97, 97)])
@pytest.mark.parametrize("crop_pct", [0.875, 0.9, 0.95, 1.0, 0.5])
def test_eval_windows_follow_crop_pct_and_non_square_sizes(size, crop_pct):
    sizes = [(500, 375), (375, 500), (256, 256), (1000, 300), (257, 999), (4000, 31), (31, 4000), (160, 256)]
    W, H = np.array([s[0] for s in sizes]), np.array([s[1] for s in sizes])
    got, _ = recipe(W, H, train=False, size=size, crop_pct=crop_pct).draws(np.arange(len(W)), 0)
    for k, (w0, h0) in enumerate(sizes):
        y, x, h, w = timm_eval_window(w0, h0, size, crop_pct)
        assert np.allclose(got[k], [y, x, h, w], rtol=1e-12, atol=1e-9), (w0, h0, got[k], (y, x, h, w))
        # the crop's aspect is the output's (but for the truncated side's pixel): evaluation stretches nothing
        box = min(math.floor(size[0] / crop_pct), math.floor(size[1] / crop_pct))
        assert math.isclose(got[k][3] / got[k][2], size[1] / size[0], rel_tol=2 / box)


@pytest.mark.parametrize("scale,ratio", [((0.25, 0.5), (0.5, 2.0)), ((0.5, 0.5), (1.0, 1.0)),
                                         ((0.02, 0.3), (0.2, 0.4))])
def test_scale_and_ratio_follow_torchvision(scale, ratio):
    n = 20_000
    W, H = 500, 375
    ours, _ = recipe(np.full(n, W), np.full(n, H), seed=2, scale=scale, ratio=ratio).draws(np.arange(n), 1)
    rng = random.Random(8)
    ref = np.array([torchvision_get_params(rng, W, H, scale, ratio) for _ in range(n)])
    for name, f in [("area", lambda a: a[:, 2] * a[:, 3] / (W * H)),
                    ("log aspect", lambda a: np.log(a[:, 3] / a[:, 2])),
                    ("centre x", lambda a: (a[:, 1] + a[:, 3] / 2) / W),
                    ("centre y", lambda a: (a[:, 0] + a[:, 2] / 2) / H)]:
        p = stats.ks_2samp(f(ours), f(ref)).pvalue
        assert p > 0.001, (name, p)
    area = ours[:, 2] * ours[:, 3] / (W * H)
    fitted = (ours[:, 2] < H) | (ours[:, 3] < W)  # not torchvision's whole-image fallback
    assert area[fitted].min() >= scale[0] * 0.97 and area.max() <= max(scale[1] * 1.03, 1.0)
    aspect = ours[fitted, 3] / ours[fitted, 2]
    assert aspect.min() >= ratio[0] * 0.95 and aspect.max() <= ratio[1] * 1.05


def test_flip_probability_is_keyed_and_independent_of_the_windows():
    n = 100_000
    W, H = np.full(n, 640), np.full(n, 480)
    ids = np.arange(n)
    draws = {p: recipe(W, H, seed=3, hflip=p).draws(ids, 2) for p in (0.0, 0.2, 0.5, 1.0)}
    assert not draws[0.0][1].any() and draws[1.0][1].all()
    assert abs(draws[0.2][1].mean() - 0.2) < 0.01
    assert not (draws[0.2][1] & ~draws[0.5][1]).any()  # one draw per sample, compared with p
    for p in (0.0, 0.2, 1.0):
        assert np.array_equal(draws[p][0], draws[0.5][0])  # the windows do not depend on hflip
    assert np.array_equal(recipe(W[:9], H[:9], seed=3, hflip=0.2).draws(ids[[5, 2, 8]], 2)[1],
                          draws[0.2][1][[5, 2, 8]])

"""Does this nvJPEG decode a region's planes where asked? Checked once per decoder before
chroma="interpolate" trusts it with regions (gpu.roi): nvJPEG documents ROI decoding through
the decode parameters for every output format, but a library that wrote a region's planes
elsewhere, or the whole image's planes into a region's buffers, would give wrong pixels or
write past the region's planes in the arena. So: small JPEGs of each layout the decoder takes
are decoded whole and as an MCU-aligned region into planes the size of the whole image, filled
with a canary; the region is trusted only if its planes equal the whole image's there and
nothing outside them was written. Otherwise that decoder decodes whole images (`GPUDecoder.
planar_regions` says which)."""
from __future__ import annotations

import io

import numpy as np

from .roi import SUBSAMPLING, chroma_dims

CANARY = 0xA5
W, H = 81, 57  # odd, not MCU multiples: the second region ends at the right / bottom edge
REGIONS = ((16, 16, 48, 32), (32, 32, W - 32, H - 32))  # MCU-aligned for every layout; interior, corner


def sample_jpegs(layouts) -> list:
    """(nvJPEG chroma code, JPEG bytes) per layout: "420", "422", "444", "gray", "prog420"."""
    from PIL import Image

    rng = np.random.default_rng(23)
    ys, xs = np.mgrid[0:H, 0:W]
    rgb = np.stack([(xs * 3 + ys * 5) % 256, (xs * 7) % 256, (ys * 11) % 256], -1).astype(np.int64)
    rgb = np.clip(rgb + rng.integers(-20, 21, rgb.shape), 0, 255).astype(np.uint8)
    out = []
    for lay in layouts:
        buf = io.BytesIO()
        base = lay[4:] if lay.startswith("prog") else lay
        im = Image.fromarray(rgb)
        if base == "gray":
            im.convert("L").save(buf, "JPEG", quality=90, progressive=lay.startswith("prog"))
            out.append((6, buf.getvalue()))
        else:
            sub = {"444": 0, "422": 1, "420": 2}[base]
            im.save(buf, "JPEG", quality=90, subsampling=sub, progressive=lay.startswith("prog"))
            out.append((sub, buf.getvalue()))  # PIL's subsampling numbers are nvJPEG's codes here
    return out


def plane_shapes(code: int, roi=None) -> list:
    """(rows, columns) of each plane of the W × H sample (or of a region of it)."""
    hs, vs = SUBSAMPLING[code]
    rw, rh = (W, H) if roi is None else roi[2:]
    if code == 6:
        return [(rh, rw)]
    (cc,), (cr,) = chroma_dims([(0, 0, rw, rh)], hs, vs)
    return [(rh, rw), (cr, cc), (cr, cc)]


def region_written_right(whole, region, roi, code) -> bool:
    """Host planes (whole-image sized, canary-filled) of a region decode against a whole decode:
    the region's planes hold the whole image's samples there, everything else is untouched."""
    hs, vs = SUBSAMPLING[code]
    rx, ry = roi[:2]
    for c, ((r, k), got, full) in enumerate(zip(plane_shapes(code, roi), region, whole)):
        oy, ox = (ry, rx) if c == 0 else (ry // vs, rx // hs)
        if not np.array_equal(got[:r, :k], full[oy:oy + r, ox:ox + k]):
            return False
        rest = got.copy()
        rest[:r, :k] = CANARY
        if not (rest == CANARY).all():
            return False
    return True


def regions_decode_right(decode, layouts, cupy) -> bool:
    """decode(jpeg bytes, device plane pointers (3), pitches (3), gray, roi or None) decodes on
    the device and waits. True when every layout's regions come out right (region_written_right)."""
    for code, data in sample_jpegs(layouts):
        shapes = plane_shapes(code)
        results = []
        for roi in (None, *REGIONS):
            planes = [cupy.full(s, CANARY, np.uint8) for s in shapes]
            ptrs = [p.data.ptr for p in planes] + [planes[0].data.ptr] * (3 - len(planes))
            pitches = [p.shape[1] for p in planes] + [planes[0].shape[1]] * (3 - len(planes))
            try:
                decode(data, ptrs, pitches, code == 6, roi)
            except Exception:
                return False
            results.append([cupy.asnumpy(p) for p in planes])
        whole = results[0]
        if any(not region_written_right(whole, got, roi, code) for roi, got in zip(REGIONS, results[1:])):
            return False
    return True


def check_region_decode(dec, cupy) -> dict:
    """{"engines": bool, "hybrid": bool}: `regions_decode_right` for a GPUDecoder's engines (baseline 4:2:0 /
    4:2:2 / 4:4:4) and hybrid decoder (gray, progressive 4:2:0 / 4:2:2), each on its own stream."""
    out = {"engines": False, "hybrid": False}
    if dec.hw is not None:
        def engines(data, ptrs, pitches, gray, roi):
            pin = cupy.cuda.alloc_pinned_memory(len(data))
            np.frombuffer(pin, np.uint8, len(data))[:] = np.frombuffer(data, np.uint8)
            dec.hw.decode_planes([pin.ptr], [len(data)], [ptrs], [pitches], dec.stream.ptr,
                                 None if roi is None else [roi], native=dec.native_submit)
            dec.stream.synchronize()

        out["engines"] = regions_decode_right(engines, ("420", "422", "444"), cupy)
    if dec.hybrid is not None:
        def hybrid(data, ptrs, pitches, gray, roi):
            view = np.frombuffer(data, np.uint8)
            dec.hybrid.decode_planes(view.ctypes.data, len(view), ptrs, pitches, gray, roi)
            dec.hybrid_stream.synchronize()

        out["hybrid"] = regions_decode_right(hybrid, ("gray", "prog420", "prog422"), cupy)
    return out

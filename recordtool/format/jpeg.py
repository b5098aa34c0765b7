"""JPEG header probe: size, chroma subsampling, progressive, colour, completeness — no decode.

Pack reads only markers up to the first scan (and looks for EOI after it), so it can copy
bytes at disk speed. The chroma codes are nvJPEG's, so the GPU path routes straight off
the index.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_PIXELS = 64 * 1024 * 1024  # images declaring more are refused (decompression bombs)

# nvjpegChromaSubsampling_t
CHROMA_444, CHROMA_422, CHROMA_420, CHROMA_440, CHROMA_411, CHROMA_410, CHROMA_GRAY, CHROMA_410V = range(8)
CHROMA_UNKNOWN = -1
CHROMA_NAMES = {
    CHROMA_444: "4:4:4", CHROMA_422: "4:2:2", CHROMA_420: "4:2:0", CHROMA_440: "4:4:0",
    CHROMA_411: "4:1:1", CHROMA_410: "4:1:0", CHROMA_GRAY: "gray", CHROMA_410V: "4:1:0v",
    CHROMA_UNKNOWN: "unknown",
}

# colour spaces stored in the index (`colorspace` column)
CS_GRAY, CS_YCBCR, CS_RGB, CS_CMYK, CS_YCCK = 1, 3, 2, 4, 5
CS_NAMES = {CS_GRAY: "gray", CS_YCBCR: "ycbcr", CS_RGB: "rgb", CS_CMYK: "cmyk", CS_YCCK: "ycck"}

_SOF_PROGRESSIVE = {0xC2}
_SOF_ARITH = {0xC9, 0xCA}
_SOF_UNSUPPORTED = {0xC3: "lossless", 0xC5: "hierarchical", 0xC6: "hierarchical progressive",
                    0xC7: "hierarchical lossless", 0xCB: "lossless (arithmetic)",
                    0xCD: "hierarchical (arithmetic)", 0xCE: "hierarchical progressive (arithmetic)",
                    0xCF: "hierarchical lossless (arithmetic)"}


# Decode-cost limits, shared with native/fused.cpp (kMaxScans, kCoefRatio, kCoefFloor): a small
# file must not make a decoder spend unbounded time (thousands of empty progressive scans) or
# memory (a multi-scan file buffers every coefficient of the declared image: 128 bytes per
# 8x8 block). A Huffman-coded file spends at least one bit per block in its DC scan, so a
# complete one never needs more than 1024x its size in coefficients.
MAX_SCANS = 100
COEF_RATIO = 1024
COEF_FLOOR = 4 << 20


class NotJPEG(ValueError):
    """Bytes that are not a JPEG at all (wrong magic)."""


class BadJPEG(ValueError):
    """A JPEG that no decoder of ours can take: truncated, malformed or unsupported."""


@dataclass(frozen=True)
class JpegInfo:
    width: int
    height: int
    channels: int  # components in the file: 1, 3 or 4
    chroma: int  # CHROMA_* (nvJPEG's enum)
    colorspace: int  # CS_*
    progressive: bool
    arithmetic: bool
    precision: int
    scans: int = 1  # SOS markers (progressive / multi-scan files have several)
    coef_bytes: int = 0  # whole-image coefficient buffer a multi-scan decode allocates (0: single scan)

    @property
    def decodable_as_is(self) -> bool:
        """True when libjpeg-turbo and nvJPEG's fallback decode it to RGB directly (no CMYK)."""
        return self.colorspace not in (CS_CMYK, CS_YCCK)


def _chroma(factors: list[tuple[int, int]]) -> int:
    if len(factors) == 1:
        return CHROMA_GRAY
    if len(factors) < 3:
        return CHROMA_UNKNOWN
    (yh, yv), (cbh, cbv), (crh, crv) = factors[:3]
    if (cbh, cbv) != (crh, crv) or yh % cbh or yv % cbv:
        return CHROMA_UNKNOWN
    ratio = (yh // cbh, yv // cbv)
    return {(1, 1): CHROMA_444, (2, 1): CHROMA_422, (2, 2): CHROMA_420, (1, 2): CHROMA_440,
            (4, 1): CHROMA_411, (4, 2): CHROMA_410, (2, 4): CHROMA_410V}.get(ratio, CHROMA_UNKNOWN)


def probe(data) -> JpegInfo:
    """Parse a JPEG's markers up to its first scan and check an EOI follows the scan data.

    Raises NotJPEG when data is not a JPEG, BadJPEG (with the byte offset) when it is a
    broken or unsupported one.
    """
    if not hasattr(data, "find"):  # memoryview
        data = bytes(data)
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        raise NotJPEG("no JPEG SOI marker")
    pos = 2
    sof = None
    adobe_transform = None
    jfif = False
    while True:
        # markers may be preceded by any number of 0xFF fill bytes
        if pos >= n:
            raise BadJPEG(f"truncated in the header at offset {pos}")
        if data[pos] != 0xFF:
            raise BadJPEG(f"expected a marker at offset {pos}, found 0x{data[pos]:02X}")
        while pos < n and data[pos] == 0xFF:
            pos += 1
        if pos >= n:
            raise BadJPEG(f"truncated in the header at offset {pos}")
        marker = data[pos]
        pos += 1
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            continue  # parameterless
        if marker == 0xD9:
            raise BadJPEG(f"EOI at offset {pos - 2} before any scan")
        if pos + 2 > n:
            raise BadJPEG(f"truncated in marker 0x{marker:02X} at offset {pos}")
        seg_len = (data[pos] << 8) | data[pos + 1]
        if seg_len < 2 or pos + seg_len > n:
            raise BadJPEG(f"truncated or corrupt: marker 0x{marker:02X} at offset {pos - 2} has length {seg_len} "
                          f"running past the end of the file ({n} bytes)")
        seg = pos + 2
        if marker == 0xE0 and bytes(data[seg:seg + 5]) == b"JFIF\0":
            jfif = True
        elif marker == 0xEE and seg_len >= 14 and bytes(data[seg:seg + 5]) == b"Adobe":
            adobe_transform = data[seg + 11]
        elif 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if marker in _SOF_UNSUPPORTED:
                raise BadJPEG(f"{_SOF_UNSUPPORTED[marker]} JPEG (SOF 0x{marker:02X} at offset "
                              f"{pos - 2}) is not supported by libjpeg-turbo")
            if seg_len < 8:
                raise BadJPEG(f"SOF at offset {pos - 2} too short")
            precision = data[seg]
            height = (data[seg + 1] << 8) | data[seg + 2]
            width = (data[seg + 3] << 8) | data[seg + 4]
            ncomp = data[seg + 5]
            if seg_len < 8 + 3 * ncomp or ncomp not in (1, 3, 4):
                raise BadJPEG(f"SOF at offset {pos - 2}: {ncomp} components not supported")
            factors = []
            for c in range(ncomp):
                hv = data[seg + 6 + 3 * c + 1]
                factors.append((hv >> 4, hv & 0x0F))
            if any(h == 0 or v == 0 for h, v in factors):
                raise BadJPEG(f"SOF at offset {pos - 2}: zero sampling factor")
            if precision != 8:
                raise BadJPEG(f"{precision}-bit JPEG (SOF at offset {pos - 2}) is not supported")
            if width == 0 or height == 0:
                raise BadJPEG(f"SOF at offset {pos - 2} declares {width}x{height} "
                              "(DNL-sized images are not supported)")
            sof = (marker, width, height, ncomp, factors, precision)
        elif marker == 0xDA:
            if sof is None:
                raise BadJPEG(f"scan (SOS) at offset {pos - 2} before any frame header (SOF)")
            scan_start = pos + seg_len
            # An EOI marker cannot occur inside entropy-coded data (0xFF is stuffed), so an
            # FFD9 anywhere after the first scan is the real end; none means truncated.
            # rfind: the EOI is almost always the last two bytes, so this costs nothing.
            if data.rfind(b"\xff\xd9", scan_start) < 0:
                raise BadJPEG(f"truncated: no EOI marker after the scan data starting at offset "
                              f"{scan_start} (file is {n} bytes)")
            comps_in_scan = data[seg] if seg < n else 0
            # FFDA cannot occur in entropy-coded data (0xFF is stuffed): this counts the scans
            # (a table segment between scans could hold the pair: an over-count, never an under-count)
            scans = 1 + data.count(b"\xff\xda", scan_start)
            break
        pos += seg_len
    marker, width, height, ncomp, factors, precision = sof
    if ncomp == 1:
        cs = CS_GRAY
    elif ncomp == 3:
        # libjpeg's rule: Adobe transform 0 means RGB; JFIF or anything else means YCbCr
        cs = CS_RGB if (adobe_transform == 0 and not jfif) else CS_YCBCR
    else:
        cs = CS_YCCK if adobe_transform == 2 else CS_CMYK
    chroma = _chroma(factors) if ncomp != 4 else CHROMA_UNKNOWN
    progressive = marker in _SOF_PROGRESSIVE or marker == 0xCA
    coef = coefficient_bytes(width, height, factors) if (progressive or comps_in_scan < ncomp) else 0
    return JpegInfo(width=width, height=height, channels=ncomp, chroma=chroma, colorspace=cs,
                    progressive=progressive, arithmetic=marker in _SOF_ARITH, precision=precision,
                    scans=scans, coef_bytes=coef)


def coefficient_bytes(width: int, height: int, factors: list) -> int:
    """Bytes of libjpeg's whole-image coefficient buffer: 64 int16 per block, each component's
    blocks padded to whole MCUs (reference of native/fused.cpp coef_bytes)."""
    mh, mv = max(h for h, _ in factors), max(v for _, v in factors)
    mcux, mcuy = -(-width // (8 * mh)), -(-height // (8 * mv))
    return sum(mcux * h * mcuy * v for h, v in factors) * 128


def decode_refusal(info: JpegInfo, size: int) -> str | None:
    """Why the decoders refuse this JPEG before decoding it (too many scans, a coefficient
    buffer out of proportion to the file's `size` bytes), or None. Same rule as the native
    decoder's (native/fused.cpp run_one); pack and verify apply it too."""
    if info.scans > MAX_SCANS:
        return f"{info.scans} scans, more than the {MAX_SCANS} a decoder will read (hostile progressive file?)"
    if info.coef_bytes > max(COEF_FLOOR, COEF_RATIO * size):
        return (f"multi-scan JPEG declares {info.width}x{info.height}: its {info.coef_bytes}-byte coefficient "
                f"buffer is more than {COEF_RATIO}x its {size} bytes (truncated or hostile file)")
    return None

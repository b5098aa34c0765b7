"""JPEG header probe: size, chroma subsampling, progressive, colour, completeness — no decode.

Pack reads only markers up to the first scan (and looks for EOI after it), so it can copy
bytes at disk speed. The chroma codes are nvJPEG's, so the GPU path routes straight off
the index.
"""
from __future__ import annotations

import re
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
                    0xC7: "hierarchical lossless", 0xC8: "JPEG-extension (JPG)", 0xCB: "lossless (arithmetic)",
                    0xCD: "hierarchical (arithmetic)", 0xCE: "hierarchical progressive (arithmetic)",
                    0xCF: "hierarchical lossless (arithmetic)"}
# markers with a length-prefixed segment that libjpeg-turbo reads or skips (jdmarker.c
# read_markers): DHT, DAC, DQT, DNL, DRI, APPn, COM. Any other (DHP, EXP, JPGn, RESn) is an
# error there ("Unsupported marker type"), so it is one here.
_SEGMENTS = {0xC4, 0xCC, 0xDB, 0xDC, 0xDD, 0xFE, *range(0xE0, 0xF0)}
_PARAMETERLESS = {0x01, *range(0xD0, 0xD8)}  # TEM, RSTn
# libjpeg-turbo's structural limits (jpeglib.h, jmorecfg.h): a file past them is refused at
# jpeg_read_header / jpeg_start_decompress, so pack must not take it either
MAX_DIMENSION = 65500  # JPEG_MAX_DIMENSION
MAX_SAMP_FACTOR = 4
MAX_BLOCKS_IN_MCU = 10  # D_MAX_BLOCKS_IN_MCU: blocks of one MCU of an interleaved scan
MAX_COMPS_IN_SCAN = 4
# the next marker after entropy-coded data: 0xFF (any fill) then a byte that is not a stuffed
# zero or a restart marker (those belong to the scan). Spelled with a literal first byte, which
# sre searches for with memchr (`\xff+` has no literal prefix: matched byte by byte)
_NEXT_MARKER = re.compile(rb"\xff\xff*[^\x00\xd0-\xd7\xff]")


# Decode-cost limits, shared with native/fused.cpp (kMaxScans, kCoefRatio, kCoefFloor): a small
# file must not make a decoder spend unbounded time (thousands of empty progressive scans) or
# memory (a multi-scan file buffers every coefficient of the declared image: 128 bytes per
# 8x8 block; a full decode of any file, its declared pixels). A Huffman-coded file spends at
# least one bit per block in its DC scan, so a complete one never has more than 1024x its
# size in coefficients (decode_refusal).
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
    blocks: int = 0  # 8x8 blocks of the image, every component, padded to whole MCUs

    @property
    def convert_reason(self) -> str | None:
        """Why a dataset must not hold these bytes as they are — every decoder of ours must take
        them, and the index cannot route a file away from the GPU decoders for its coding — or
        None. CMYK/YCCK: the decoders give RGB (libjpeg-turbo does not convert CMYK). Arithmetic
        coding (SOF9, SOF10): nvJPEG decodes Huffman-coded files only, and the index's
        chroma/progressive columns would send a sequential one to the hardware engines. Pack
        converts such a file to a baseline Huffman-coded RGB JPEG; `recordtool index` leaves it out."""
        if self.colorspace in (CS_CMYK, CS_YCCK):
            return f"{CS_NAMES[self.colorspace].upper()} JPEG"
        if self.arithmetic:
            return "arithmetic-coded JPEG (nvJPEG decodes Huffman-coded files only)"
        return None

    @property
    def decodable_as_is(self) -> bool:
        """True when every decoder of ours takes the bytes as they are (`convert_reason`)."""
        return self.convert_reason is None


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


@dataclass(frozen=True)
class _Frame:
    """The frame header (SOF) as libjpeg-turbo reads it."""

    marker: int
    at: int  # offset of its marker
    width: int
    height: int
    ids: tuple  # component ids (repeats allowed: libjpeg refuses only a scan it cannot resolve)
    factors: tuple  # (h, v) sampling factors per component, each 1..4
    tables: tuple  # quantization table number per component


def _frame(data, marker: int, seg: int, seg_len: int, at: int) -> _Frame:
    """Check a SOF segment with jdmarker.c get_sof's and jdinput.c initial_setup's rules."""
    where = f"frame header (SOF 0x{marker:02X}) at offset {at}"
    if marker in _SOF_UNSUPPORTED:
        raise BadJPEG(f"{_SOF_UNSUPPORTED[marker]} JPEG ({where}) is not supported by libjpeg-turbo")
    if seg_len < 8:
        raise BadJPEG(f"{where} too short")
    precision = data[seg]
    height = (data[seg + 1] << 8) | data[seg + 2]
    width = (data[seg + 3] << 8) | data[seg + 4]
    ncomp = data[seg + 5]
    if ncomp not in (1, 3, 4):
        raise BadJPEG(f"{where}: {ncomp} components not supported")
    if seg_len != 8 + 3 * ncomp:
        raise BadJPEG(f"{where}: length {seg_len} does not match its {ncomp} components (libjpeg: bogus marker length)")
    comps = [tuple(data[seg + 6 + 3 * c:seg + 9 + 3 * c]) for c in range(ncomp)]
    ids = tuple(c[0] for c in comps)
    factors = tuple((c[1] >> 4, c[1] & 0x0F) for c in comps)
    if not all(1 <= h <= MAX_SAMP_FACTOR and 1 <= v <= MAX_SAMP_FACTOR for h, v in factors):
        raise BadJPEG(f"{where}: sampling factors {' '.join(f'{h}x{v}' for h, v in factors)}: each must be "
                      f"1..{MAX_SAMP_FACTOR}")
    if precision != 8:
        raise BadJPEG(f"{precision}-bit JPEG ({where}) is not supported")
    if width == 0 or height == 0:
        raise BadJPEG(f"{where} declares {width}x{height} (DNL-sized images are not supported)")
    if width > MAX_DIMENSION or height > MAX_DIMENSION:
        raise BadJPEG(f"{where} declares {width}x{height}: libjpeg-turbo decodes at most {MAX_DIMENSION} a side")
    return _Frame(marker, at, width, height, ids, factors, tuple(c[2] for c in comps))


def _quant_tables(data, seg: int, seg_len: int, at: int, defined: set) -> None:
    """The table numbers a DQT segment defines (jdmarker.c get_dqt's rules) → `defined`."""
    pos, end = seg, seg + seg_len - 2
    while pos < end:
        prec, num = data[pos] >> 4, data[pos] & 0x0F
        if num > 3:
            raise BadJPEG(f"quantization table segment (DQT) at offset {at}: table number {num} (0..3)")
        defined.add(num)
        pos += 1 + 64 * (2 if prec else 1)
    if pos != end:
        raise BadJPEG(f"quantization table segment (DQT) at offset {at}: length {seg_len} does not match its tables")


def _huffman_tables(data, seg: int, seg_len: int, at: int, defined: dict) -> None:
    """The tables a DHT segment defines (jdmarker.c get_dht's rules) → defined[(class, number)]
    = (counts per code length, symbols); class 0 DC, 1 AC."""
    where = f"Huffman table segment (DHT) at offset {at}"
    pos, end = seg, seg + seg_len - 2
    while end - pos > 16:
        index, counts = data[pos], tuple(data[pos + 1:pos + 17])
        pos += 17
        count = sum(counts)
        if count > 256 or count > end - pos:
            raise BadJPEG(f"{where}: {count} symbols (libjpeg: bogus Huffman table definition)")
        if index & ~0x13:
            raise BadJPEG(f"{where}: table index 0x{index:02X} (libjpeg: bogus DHT index)")
        defined[(index >> 4, index & 0x0F)] = (counts, bytes(data[pos:pos + count]))
        pos += count
    if pos != end:
        raise BadJPEG(f"{where}: length {seg_len} does not match its tables")


def _check_huffman(defined: dict, cls: int, num: int, where: str, sequential: bool) -> None:
    """jdhuff.c jpeg_make_d_derived_tbl's checks of a table a scan uses: defined, codes that fit
    their lengths (none all ones), DC symbols 0..15. The sequential decoder has libjpeg-turbo's
    standard tables 0 and 1 for those a file leaves out (jinit_huff_decoder); the progressive
    one has none."""
    kind = "AC" if cls else "DC"
    if (cls, num) not in defined:
        if sequential and num < 2:
            return
        raise BadJPEG(f"{where}: {kind} Huffman table {num} is not defined")
    counts, symbols = defined[(cls, num)]
    code = 0
    for length, c in enumerate(counts, 1):
        code += c
        if c and code >= 1 << length:
            raise BadJPEG(f"{where}: {kind} Huffman table {num} has more codes than fit their lengths "
                          "(libjpeg: bogus Huffman table definition)")
        code <<= 1
    if not cls and any(v > 15 for v in symbols):
        raise BadJPEG(f"{where}: DC Huffman table {num} has a symbol over 15 (libjpeg: bogus Huffman table definition)")


def _arith_conditioning(data, seg: int, seg_len: int, at: int) -> None:
    """Check a DAC segment with jdmarker.c get_dac's rules. libjpeg-turbo reads one whatever the
    frame's coding (a bad one stops a Huffman-coded file too): (index, value) byte pairs, index
    = class << 4 | table with class 0 (DC) or 1 (AC) and table 0..15 (NUM_ARITH_TBLS); a DC
    value holds the bounds L (low nibble) ≤ U (high nibble); an AC value (K) is taken as it is.
    T.81 B.2.4.3's narrower ranges (tables 0..3, 1 ≤ K ≤ 63) are not enforced: libjpeg-turbo
    decodes such files, and pack re-encodes arithmetic-coded ones (`JpegInfo.convert_reason`)."""
    where = f"arithmetic conditioning segment (DAC) at offset {at}"
    if seg_len % 2:
        raise BadJPEG(f"{where}: length {seg_len} is not 2 + whole (table, value) pairs (libjpeg: bogus marker length)")
    for pos in range(seg, seg + seg_len - 2, 2):
        index, value = data[pos], data[pos + 1]
        if index >= 32:
            raise BadJPEG(f"{where}: table index 0x{index:02X} at offset {pos}: class {index >> 4}, not 0 (DC) or "
                          "1 (AC) (libjpeg: bogus DAC index)")
        if index < 16 and (value & 0x0F) > (value >> 4):
            raise BadJPEG(f"{where}: DC table {index} conditioning 0x{value:02X} at offset {pos + 1}: lower bound "
                          f"L={value & 0x0F} above upper bound U={value >> 4} (libjpeg: bogus DAC value)")


def _scan(data, seg: int, seg_len: int, at: int, frame: _Frame, tables: set, huffman: dict) -> int:
    """Check a scan header (SOS) against the frame with jdmarker.c get_sos's, jdinput.c
    per_scan_setup's / latch_quant_tables' and (progressive) jdphuff.c's rules; returns its
    component count."""
    where = f"scan header (SOS) at offset {at}"
    ns = data[seg] if seg_len > 2 else 0
    if not 1 <= ns <= MAX_COMPS_IN_SCAN or seg_len != 6 + 2 * ns:
        raise BadJPEG(f"{where}: {ns} components in {seg_len} bytes")
    # get_sos's lookup, quirks included: scan entry i takes the first frame component ci with
    # its id whose *scan slot* ci is still empty; a component met twice is an error
    comps: list = []
    for i in range(ns):
        cid = data[seg + 1 + 2 * i]
        ci = next((c for c in range(min(len(frame.ids), MAX_COMPS_IN_SCAN))
                   if frame.ids[c] == cid and c >= len(comps)), None)
        if ci is None or ci in comps:
            raise BadJPEG(f"{where} names component id {cid}, which the frame header at offset {frame.at} "
                          f"{'lists only once' if ci is not None or cid in frame.ids else 'does not have'} "
                          "(libjpeg: invalid component ID in SOS)")
        comps.append(ci)
    if ns > 1:
        blocks = sum(frame.factors[c][0] * frame.factors[c][1] for c in comps)
        if blocks > MAX_BLOCKS_IN_MCU:
            raise BadJPEG(f"{where}: an MCU of {blocks} blocks (sampling factors "
                          f"{' '.join('%dx%d' % frame.factors[c] for c in comps)}), more than the "
                          f"{MAX_BLOCKS_IN_MCU} libjpeg-turbo decodes")
    missing = [frame.tables[c] for c in comps if frame.tables[c] not in tables]
    if missing:
        raise BadJPEG(f"{where}: quantization table {missing[0]} is not defined")
    ss, se, ah, al = data[seg + 1 + 2 * ns], data[seg + 2 + 2 * ns], data[seg + 3 + 2 * ns] >> 4, \
        data[seg + 3 + 2 * ns] & 0x0F
    progressive = frame.marker in (0xC2, 0xCA)
    if progressive and ((se != 0 if ss == 0 else (ss > se or se > 63 or ns != 1)) or (ah and al != ah - 1)
                        or al > 13):
        raise BadJPEG(f"{where}: invalid progressive scan Ss={ss} Se={se} Ah={ah} Al={al}")
    if frame.marker not in _SOF_ARITH:  # the Huffman tables this scan decodes with
        for i in range(ns):
            dc, ac = data[seg + 2 + 2 * i] >> 4, data[seg + 2 + 2 * i] & 0x0F
            if not progressive or (ss == 0 and ah == 0):
                _check_huffman(huffman, 0, dc, where, not progressive)
            if not progressive or ss > 0:
                _check_huffman(huffman, 1, ac, where, not progressive)
    return ns


def probe(data) -> JpegInfo:
    """Parse a JPEG's markers to its EOI — the header, then each scan header, skipping the
    entropy-coded data between them — with libjpeg-turbo's rules (jdmarker.c, jdinput.c,
    jdphuff.c): a second SOI or frame header, a marker it does not know, a scan naming a
    component id the frame does not resolve, sampling factors over 4, an MCU of more than 10
    blocks, a missing quantization table, a malformed arithmetic conditioning (DAC) segment,
    ... are errors there, so they are here: pack never
    takes a file the decoders refuse, and the index describes the frame they decode.

    Raises NotJPEG when data is not a JPEG, BadJPEG (with the byte offset) when it is a
    broken or unsupported one.
    """
    if not hasattr(data, "find"):  # memoryview
        data = bytes(data)
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        raise NotJPEG("no JPEG SOI marker")
    pos = 2
    frame = None
    tables: set = set()  # quantization tables defined so far
    huffman: dict = {}  # Huffman tables defined so far
    adobe_transform = None
    jfif = False
    scans = comps_in_scan = 0
    while True:
        # markers may be preceded by any number of 0xFF fill bytes
        if pos >= n:
            raise BadJPEG(f"truncated in the header at offset {pos}")
        if data[pos] != 0xFF:
            raise BadJPEG(f"expected a marker at offset {pos}, found 0x{data[pos]:02X}")
        at = pos
        while pos < n and data[pos] == 0xFF:
            pos += 1
        if pos >= n:
            raise BadJPEG(f"truncated in the header at offset {pos}")
        marker = data[pos]
        pos += 1
        if marker == 0xD8:
            raise BadJPEG(f"second SOI marker at offset {at}")
        if marker in _PARAMETERLESS:
            continue
        if marker == 0xD9:
            if not scans:
                raise BadJPEG(f"EOI at offset {at} before any scan")
            break
        if pos + 2 > n:
            raise BadJPEG(f"truncated in marker 0x{marker:02X} at offset {pos}")
        seg_len = (data[pos] << 8) | data[pos + 1]
        if seg_len < 2 or pos + seg_len > n:
            raise BadJPEG(f"truncated or corrupt: marker 0x{marker:02X} at offset {at} has length {seg_len} "
                          f"running past the end of the file ({n} bytes)")
        seg = pos + 2
        if marker == 0xDA:
            if frame is None:
                raise BadJPEG(f"scan (SOS) at offset {at} before any frame header (SOF)")
            ns = _scan(data, seg, seg_len, at, frame, tables, huffman)
            scans += 1
            comps_in_scan = comps_in_scan or ns
            if scans > MAX_SCANS:
                break  # refused for its scan count (decode_refusal): no need to read on
            # the entropy-coded data runs to the next marker (0xFF is stuffed inside it); no
            # marker at all means truncated
            m = _NEXT_MARKER.search(data, pos + seg_len)
            if m is None:
                raise BadJPEG(f"truncated: no EOI marker after the scan data starting at offset "
                              f"{pos + seg_len} (file is {n} bytes)")
            pos = m.start()
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xCC):
            if frame is not None:
                raise BadJPEG(f"second frame header (SOF 0x{marker:02X}) at offset {at}, after the one at offset "
                              f"{frame.at}: the decoders refuse a file with two")
            frame = _frame(data, marker, seg, seg_len, at)
        elif marker not in _SEGMENTS:
            raise BadJPEG(f"marker 0x{marker:02X} at offset {at} is not one libjpeg-turbo accepts")
        elif marker == 0xDB:
            _quant_tables(data, seg, seg_len, at, tables)
        elif marker == 0xC4:
            _huffman_tables(data, seg, seg_len, at, huffman)
        elif marker == 0xCC:
            _arith_conditioning(data, seg, seg_len, at)
        elif marker == 0xDD and seg_len != 4:
            raise BadJPEG(f"restart interval segment (DRI) at offset {at} has length {seg_len}, not 4")
        elif scans:
            pass  # APPn between scans: the colour space was settled by the header's
        elif marker == 0xE0 and bytes(data[seg:seg + 5]) == b"JFIF\0":
            jfif = True
        elif marker == 0xEE and seg_len >= 14 and bytes(data[seg:seg + 5]) == b"Adobe":
            adobe_transform = data[seg + 11]
        pos += seg_len
    ncomp, factors = len(frame.ids), list(frame.factors)
    if ncomp == 1:
        cs = CS_GRAY
    elif ncomp == 3:
        # libjpeg's rule: Adobe transform 0 means RGB; JFIF or anything else means YCbCr
        cs = CS_RGB if (adobe_transform == 0 and not jfif) else CS_YCBCR
    else:
        cs = CS_YCCK if adobe_transform == 2 else CS_CMYK
    chroma = _chroma(factors) if ncomp != 4 else CHROMA_UNKNOWN
    progressive = frame.marker in _SOF_PROGRESSIVE or frame.marker == 0xCA
    blocks = coefficient_bytes(frame.width, frame.height, factors) // 128
    coef = blocks * 128 if (progressive or comps_in_scan < ncomp) else 0
    return JpegInfo(width=frame.width, height=frame.height, channels=ncomp, chroma=chroma, colorspace=cs,
                    progressive=progressive, arithmetic=frame.marker in _SOF_ARITH, precision=8,
                    scans=scans, coef_bytes=coef, blocks=blocks)


def coefficient_bytes(width: int, height: int, factors: list) -> int:
    """Bytes of libjpeg's whole-image coefficient buffer: 64 int16 per block, each component's
    blocks padded to whole MCUs (reference of native/fused.cpp coef_bytes)."""
    mh, mv = max(h for h, _ in factors), max(v for _, v in factors)
    mcux, mcuy = -(-width // (8 * mh)), -(-height // (8 * mv))
    return sum(mcux * h * mcuy * v for h, v in factors) * 128


def decode_refusal(info: JpegInfo, size: int, max_pixels: int = DEFAULT_MAX_PIXELS) -> str | None:
    """Why the decoders must not start on this JPEG of `size` bytes, or None: THE rule of what
    is decodable, used everywhere — pack and `recordtool index` refuse such a file, verify
    calls it damage, the Python decode paths and the Pillow retry refuse it, the GPU decoder
    routes it away, and native/fused.cpp run_one applies the same checks to libjpeg's header.

    Refused: more pixels than `max_pixels`; more than MAX_SCANS scans; more 8x8 blocks than a
    complete file of `size` bytes can hold. A Huffman-coded file spends at least one bit per
    block (in its DC scan), so a complete one has at most 8 blocks per byte = COEF_RATIO x its
    size in coefficient bytes (128 per block), COEF_FLOOR at least: a multi-scan file past that
    would make libjpeg buffer every coefficient, a single-scan one would make a full decode
    (Pillow's) spend the declared pixels on data that is not there (a 162-byte file declaring
    8192x8192). Arithmetic coding can go below a bit per block: an arithmetic-coded file of
    a large flat image may be refused too.
    """
    if info.width * info.height > max_pixels:
        return f"header declares {info.width}x{info.height}, more than max_pixels {max_pixels} (decompression bomb?)"
    if info.scans > MAX_SCANS:
        return f"{info.scans} scans, more than the {MAX_SCANS} a decoder will read (hostile progressive file?)"
    blocks_bytes = 128 * (info.blocks or info.coef_bytes // 128)
    if blocks_bytes > max(COEF_FLOOR, COEF_RATIO * size):
        if info.coef_bytes:
            return (f"multi-scan JPEG declares {info.width}x{info.height}: its {info.coef_bytes}-byte coefficient "
                    f"buffer is more than {COEF_RATIO}x its {size} bytes (truncated or hostile file)")
        return (f"JPEG declares {info.width}x{info.height} in {size} bytes: its {blocks_bytes // 128} blocks need "
                f"at least a bit each (truncated or hostile file)")
    return None

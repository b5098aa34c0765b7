"""Crafted hostile inputs, shared by tests/test_hostile.py and scripts/fuzz_hostile.py."""
from __future__ import annotations

import io
import struct

import numpy as np
from PIL import Image


def _jpeg(w, h, progressive=False, subsampling=2, quality=90, seed=0, mode="RGB") -> bytes:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    im = Image.fromarray(a, "RGB")
    if mode != "RGB":
        im = im.convert(mode)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality, progressive=progressive, subsampling=subsampling)
    return buf.getvalue()


def segments(data: bytes):
    """(marker, start, end) of each header segment up to and including the first SOS header;
    end of the SOS entry is where its entropy data starts."""
    pos, out = 2, []
    while pos < len(data):
        marker = data[pos + 1]
        seg_len = struct.unpack(">H", data[pos + 2:pos + 4])[0]
        out.append((marker, pos, pos + 2 + seg_len))
        if marker == 0xDA:
            break
        pos += 2 + seg_len
    return out


def set_size(data: bytes, w: int, h: int) -> bytes:
    """The same bytes with the frame header declaring w x h."""
    b = bytearray(data)
    for marker, a, _ in segments(data):
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            b[a + 5:a + 9] = struct.pack(">HH", h, w)
    return bytes(b)


def bomb_progressive(w=8192, h=8192) -> bytes:
    """A tiny progressive JPEG whose frame declares w x h: its first scan's data ends at once
    (EOI), so a decoder buffers w x h coefficients for a few hundred bytes of file."""
    src = _jpeg(16, 16, progressive=True, subsampling=0)
    segs = segments(src)
    first_scan_data = segs[-1][2]
    return set_size(src[:first_scan_data] + b"\x00\x00\xff\xd9", w, h)


def many_scans(scans=2000, w=512, h=512) -> bytes:
    """A progressive JPEG of a few KB with thousands of empty scans: each costs a pass over
    every block of the declared image."""
    src = _jpeg(16, 16, progressive=True, subsampling=0)
    segs = segments(src)
    head = src[:segs[-1][2]]
    # the last one-component (AC) scan with the Huffman table segment written just before it,
    # then its header repeated with no data in between
    sos, pos = [], segs[-1][1]
    while True:
        k = src.find(b"\xff\xda", pos)
        if k < 0:
            break
        n = struct.unpack(">H", src[k + 2:k + 4])[0]
        if src[k + 4] == 1:
            d = src.rfind(b"\xff\xc4", pos, k)
            sos.append((src[d:k] if d >= 0 else b"", src[k:k + 2 + n]))
        pos = k + 2
    dht, ac = sos[-1]
    body = b"\x00" * 8 + dht + ac * scans
    return set_size(head + body + b"\xff\xd9", w, h)


def corrupt_entropy(seed=0) -> bytes:
    """A baseline JPEG with garbage in its entropy-coded data (libjpeg warns and goes on)."""
    src = _jpeg(64, 64, seed=seed)
    start = segments(src)[-1][2]
    b = bytearray(src)
    rng = np.random.default_rng(seed)
    for p in rng.integers(start + 4, len(b) - 4, 40):
        b[p] = int(rng.integers(0, 255))  # never 0xFF: no marker made up
    return bytes(b)


def big_baseline(w=6000, h=6000) -> bytes:
    """A real (flat, so small) baseline JPEG of w x h: decoding its full window at scale 1
    needs w*h*3 bytes of region buffer."""
    im = Image.new("RGB", (w, h), (90, 120, 200))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=50)
    return buf.getvalue()


def example(image: bytes, label: int, key_image="image", key_label="label") -> bytes:
    """A serialized tf.train.Example with an image and an int64 label (tfds keys by default)."""
    from recordtool.format import example_pb2

    ex = example_pb2.Example()
    ex.features.feature[key_image].bytes_list.value.append(image)
    ex.features.feature[key_label].int64_list.value.append(label)
    return ex.SerializeToString()


def tfrecord(records) -> bytes:
    from recordtool.sources.tfrecord import frame_record

    return b"".join(frame_record(r) for r in records)


def ofrecord_part(images_labels) -> bytes:
    """An OFRecord part file of (image bytes, label) records, as pack writes them."""
    from recordtool.format.ofrecord import encode_ofrecord, frame

    out = []
    for image, label in images_labels:
        out.extend(bytes(p) for p in frame(encode_ofrecord({"encoded": image, "class/label": label})))
    return b"".join(out)


def gzip_bomb(path: str, inflated: int, head: bytes = b"") -> None:
    """A GZIP file inflating to `head` + zeros up to `inflated` bytes, written in pieces."""
    import zlib

    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(c.compress(head))
        block = bytes(1 << 22)
        left = inflated - len(head)
        while left > 0:
            f.write(c.compress(block[:min(left, len(block))]))
            left -= len(block)
        f.write(c.flush())


def _frame_at(data: bytes) -> tuple:
    """(start, end) of the first frame header (SOF) segment, marker included."""
    for marker, a, b in segments(data):
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return a, b
    raise ValueError("no SOF")


def two_frames(w=120, h=80, w2=1200, h2=800) -> bytes:
    """A baseline w x h JPEG with a second frame header (SOF) after the first, declaring
    w2 x h2: libjpeg refuses it ("Invalid JPEG file structure: two SOF markers")."""
    src = _jpeg(w, h)
    a, b = _frame_at(src)
    second = bytearray(src[a:b])
    second[5:9] = struct.pack(">HH", h2, w2)
    return src[:b] + bytes(second) + src[b:]


def duplicate_component_id(in_scan: bool = False) -> bytes:
    """A 4:2:0 JPEG whose frame header gives its second component the first one's id (and,
    with in_scan, so does its scan header)."""
    src = bytearray(_jpeg(64, 48))
    a, _ = _frame_at(bytes(src))
    first_id = src[a + 10]
    src[a + 13] = first_id
    if in_scan:
        sos = segments(bytes(src))[-1][1]
        src[sos + 7] = first_id
    return bytes(src)


def sampling(factors=((4, 4), (1, 1), (1, 1))) -> bytes:
    """A JPEG whose frame header declares these (h, v) sampling factors per component (its
    scan data is the 4:4:4 encoder's: what matters is that the decoders refuse the header)."""
    src = bytearray(_jpeg(64, 48, subsampling=0))
    a, _ = _frame_at(bytes(src))
    for c, (h, v) in enumerate(factors):
        src[a + 11 + 3 * c] = (h << 4) | v
    return bytes(src)


def tiny_baseline_declaring(w=8192, h=8192) -> bytes:
    """A baseline gray JPEG of a few hundred bytes whose frame declares w x h: its entropy data
    is one 8x8 block's, then EOI (libjpeg makes up the rest of the pixels, with a warning)."""
    src = _jpeg(8, 8, mode="L")
    return set_size(src, w, h)


# libturbojpeg's own limits, not libjpeg's: its API cannot name every chroma layout libjpeg
# decodes (4:1:0, ...) and does not convert CMYK to RGB
_TJ_ONLY = ("Could not determine subsampling type", "Unsupported color conversion request")


def libjpeg_disagreements(inputs) -> list:
    """(input, libjpeg's error) for each input the header reader and the one decodable rule
    accept (format.jpeg.probe, decode_refusal) but libjpeg-turbo refuses with an error (its
    warnings — corrupt data it decodes around — are not refusals). Full decodes through
    PyTurboJPEG; an accepted input is small (the rule bounds its blocks by its bytes)."""
    import warnings

    from recordtool.codec import turbojpeg
    from recordtool.format.jpeg import CS_CMYK, CS_YCCK, BadJPEG, NotJPEG, decode_refusal, probe

    tj = turbojpeg()
    out = []
    for data in inputs:
        try:
            info = probe(data)
        except (NotJPEG, BadJPEG):
            continue
        if decode_refusal(info, len(data)) or info.colorspace in (CS_CMYK, CS_YCCK):
            continue  # (arithmetic-coded files are decoded: libjpeg-turbo takes them)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                tj.decode(data)
            except OSError as e:
                if not any(s in str(e) for s in _TJ_ONLY):
                    out.append((data, str(e)))
    return out


def header_mutations(seed: int, n: int, seeds=None):
    """n mutations of JPEG headers (bytes flipped among the first 700, a header segment
    repeated or dropped), from valid seeds: what a crafted frame or scan header looks like."""
    rng = np.random.default_rng(seed)
    seeds = seeds or [_jpeg(96, 72, seed=1), _jpeg(64, 80, seed=2, subsampling=0, progressive=True),
                      _jpeg(50, 40, seed=3, mode="L"), _jpeg(72, 40, seed=4, subsampling=1, progressive=True)]
    for _ in range(n):
        src = seeds[int(rng.integers(0, len(seeds)))]
        b = bytearray(src)
        segs = segments(src)
        kind = int(rng.integers(0, 3))
        if kind == 0:
            for p in rng.integers(2, min(len(b), 700), int(rng.integers(1, 4))):
                b[p] = int(rng.integers(0, 256))
        else:
            _, a, e = segs[int(rng.integers(0, len(segs)))]
            b[a:e] = bytes(b[a:e]) * 2 if kind == 1 else b""
        yield bytes(b)


def forge_crc(data: bytearray, at: int, want: int) -> None:
    """Set data[at:at+4] so that the CRC32C of `data` is `want`, as whoever can write a file can:
    a CRC is affine in the bits, so 32 free bits reach any value (a checksum is no digest)."""
    import crc32c

    data[at:at + 4] = bytes(4)
    base = crc32c.crc32c(bytes(data))
    pivots = {}  # highest bit → (CRC change, the free bits that make it)
    for bit in range(32):
        d = bytearray(data)
        d[at + bit // 8] ^= 1 << (bit % 8)
        v, m = crc32c.crc32c(bytes(d)) ^ base, 1 << bit
        while v:
            h = v.bit_length() - 1
            if h not in pivots:
                pivots[h] = (v, m)
                break
            v, m = v ^ pivots[h][0], m ^ pivots[h][1]
    x, t = 0, want ^ base
    while t:
        v, m = pivots[t.bit_length() - 1]
        t, x = t ^ v, x ^ m
    data[at:at + 4] = x.to_bytes(4, "little")

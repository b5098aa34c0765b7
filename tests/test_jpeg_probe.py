"""The header probe against Pillow/libjpeg's own view of the same files."""
import io
import os

import pytest
from PIL import Image

from conftest import jpeg_bytes, png_bytes
from hostile_data import libjpeg_disagreements, segments
from recordtool.format import jpeg as J


@pytest.mark.parametrize("sub,chroma", [(0, J.CHROMA_444), (1, J.CHROMA_422), (2, J.CHROMA_420)])
@pytest.mark.parametrize("progressive", [False, True])
def test_subsampling_and_progressive(sub, chroma, progressive):
    data = jpeg_bytes(77, 51, subsampling=sub, progressive=progressive)
    info = J.probe(data)
    assert (info.width, info.height) == Image.open(io.BytesIO(data)).size == (77, 51)
    assert info.chroma == chroma
    assert info.progressive is progressive
    assert info.colorspace == J.CS_YCBCR and info.channels == 3 and info.decodable_as_is


def test_gray_cmyk():
    g = J.probe(jpeg_bytes(30, 20, mode="L"))
    assert (g.chroma, g.colorspace, g.channels) == (J.CHROMA_GRAY, J.CS_GRAY, 1)
    c = J.probe(jpeg_bytes(30, 20, mode="CMYK"))
    assert c.channels == 4 and c.colorspace in (J.CS_CMYK, J.CS_YCCK) and not c.decodable_as_is


def test_thumbnail_eoi_does_not_hide_truncation():
    # An EXIF thumbnail carries its own EOI inside APP1: truncation must still be caught.
    thumb = jpeg_bytes(16, 16, seed=3)
    exif_payload = b"Exif\0\0" + thumb
    app1 = b"\xff\xe1" + (len(exif_payload) + 2).to_bytes(2, "big") + exif_payload
    full = jpeg_bytes(64, 48)
    with_thumb = full[:2] + app1 + full[2:]
    assert J.probe(with_thumb).width == 64
    with pytest.raises(J.BadJPEG, match="truncated"):
        J.probe(with_thumb[:-400])


def test_rejections_name_offsets():
    data = jpeg_bytes()
    with pytest.raises(J.NotJPEG):
        J.probe(png_bytes())
    with pytest.raises(J.NotJPEG):
        J.probe(b"")
    with pytest.raises(J.BadJPEG, match="truncated"):
        J.probe(data[:len(data) // 2])
    with pytest.raises(J.BadJPEG, match="offset"):
        J.probe(data[:30])
    with pytest.raises(J.BadJPEG, match="expected a marker at offset 2"):
        J.probe(b"\xff\xd8garbage-garbage")


def test_sof_fields_are_read_not_guessed():
    data = bytearray(jpeg_bytes(64, 48))
    sof = data.find(b"\xff\xc0")
    data[sof + 5:sof + 9] = (60000).to_bytes(2, "big") + (60000).to_bytes(2, "big")
    info = J.probe(bytes(data))
    assert (info.width, info.height) == (60000, 60000)
    data[sof + 4] = 12
    with pytest.raises(J.BadJPEG, match="12-bit"):
        J.probe(bytes(data))


# tests/fixtures/jpeg: arithmetic-coded files (scripts/make_jpeg_fixtures.py: Pillow's JPEGs
# re-coded by libjpeg, coefficient for coefficient); each holds a DAC segment before its scan
ARITH = os.path.join(os.path.dirname(__file__), "fixtures", "jpeg")


def arith(name: str) -> bytes:
    with open(os.path.join(ARITH, name), "rb") as f:
        return f.read()


def dac(*pairs, length=None) -> bytes:
    """An arithmetic conditioning segment (DAC) of (index, value) pairs; `length` overrides its
    length field."""
    body = bytes(b for p in pairs for b in p)
    return b"\xff\xcc" + (length if length is not None else len(body) + 2).to_bytes(2, "big") + body


def with_segment(data: bytes, segment: bytes) -> bytes:
    """`segment` inserted just before the first scan header."""
    sos = segments(data)[-1][1]
    return data[:sos] + segment + data[sos:]


def _libjpeg_refuses(data: bytes) -> bool:
    import warnings

    from recordtool.codec import turbojpeg

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            turbojpeg().decode(data)
        except OSError:
            return True
    return False


@pytest.mark.parametrize("name, size, progressive, channels", [
    ("arith-420.jpg", (48, 32), False, 3), ("arith-progressive.jpg", (40, 24), True, 3),
    ("arith-gray.jpg", (24, 16), False, 1)])
def test_arithmetic_jpegs_are_read_and_marked_for_conversion(name, size, progressive, channels):
    """libjpeg-turbo decodes arithmetic-coded files; nvJPEG does not (Huffman only), and the
    index cannot route one away from it: the probe says so, pack converts (test_pack)."""
    data = arith(name)
    info = J.probe(data)
    assert (info.width, info.height) == Image.open(io.BytesIO(data)).size == size
    assert info.arithmetic and info.progressive is progressive and info.channels == channels
    assert not info.decodable_as_is and "arithmetic-coded" in info.convert_reason
    assert not _libjpeg_refuses(data)
    assert J.probe(jpeg_bytes()).convert_reason is None


def test_dac_segments_are_checked_as_libjpeg_does():
    """A DAC segment is read whatever the frame's coding: a bad one is refused, naming its
    offset, exactly where libjpeg-turbo refuses the file — in a Huffman-coded file and in an
    arithmetic-coded one; what libjpeg takes (tables up to 15, any AC value) is taken."""
    huffman, arithmetic = jpeg_bytes(), arith("arith-420.jpg")
    good = [dac(), dac((0x00, 0x10), (0x10, 0x05)), dac((0x0F, 0xFF), (0x1F, 0x00), (0x13, 0xC8))]
    bad = {"bogus DAC index": [dac((0x20, 0x10)), dac((0x10, 0x05), (0xFF, 0x00))],
           "bogus DAC value": [dac((0x00, 0x05)), dac((0x13, 0x05), (0x03, 0x3F))],
           "bogus marker length": [dac((0x00, 0x10), length=5), dac((0x00, 0x10), (0x10,))]}
    for base in (huffman, arithmetic):
        for seg in good:
            data = with_segment(base, seg)
            assert J.probe(data).width == J.probe(base).width and not _libjpeg_refuses(data), seg.hex()
        for why, segs in bad.items():
            for seg in segs:
                data = with_segment(base, seg)
                at = segments(base)[-1][1]
                with pytest.raises(J.BadJPEG, match=rf"\(DAC\) at offset {at}.*libjpeg: {why}"):
                    J.probe(data)
                assert _libjpeg_refuses(data), seg.hex()
    # the arithmetic file's own DAC, made bad in place: its offset named
    at = arithmetic.find(b"\xff\xcc")
    bad_index = bytearray(arithmetic)
    bad_index[at + 4] = 0x21
    with pytest.raises(J.BadJPEG, match=rf"\(DAC\) at offset {at}: table index 0x21 at offset {at + 4}"):
        J.probe(bytes(bad_index))
    assert _libjpeg_refuses(bytes(bad_index))
    assert libjpeg_disagreements([with_segment(b, s) for b in (huffman, arithmetic)
                                  for s in good + sum(bad.values(), [])]) == []

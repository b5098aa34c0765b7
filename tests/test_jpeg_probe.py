"""The header probe against Pillow/libjpeg's own view of the same files."""
import io

import pytest
from PIL import Image

from conftest import jpeg_bytes, png_bytes
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

#!/usr/bin/env python3
"""Write tests/fixtures/jpeg/ (run once, by hand): arithmetic-coded JPEGs, which neither Pillow
nor PyTurboJPEG can write.

Needs a C compiler, libjpeg-turbo's headers and library built with arithmetic coding
(Debian/Ubuntu: libjpeg62-turbo-dev) and Pillow. Small photo-like images saved by Pillow are
re-coded losslessly, coefficient for coefficient, with arithmetic coding (as `jpegtran
-arithmetic` does). Outputs:
  arith-420.jpg           sequential arithmetic (SOF9), YCbCr 4:2:0, 48x32, one DAC segment
  arith-progressive.jpg   progressive arithmetic (SOF10), YCbCr 4:4:4, 40x24
  arith-gray.jpg          sequential arithmetic (SOF9), grayscale, 24x16
"""
import io
import os
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "jpeg")

RECODE = r"""
#include <stdio.h>
#include <jpeglib.h>

int main(int argc, char **argv) {
  struct jpeg_decompress_struct src;
  struct jpeg_compress_struct dst;
  struct jpeg_error_mgr src_err, dst_err;
  src.err = jpeg_std_error(&src_err);
  jpeg_create_decompress(&src);
  dst.err = jpeg_std_error(&dst_err);
  jpeg_create_compress(&dst);
  jpeg_stdio_src(&src, stdin);
  jpeg_read_header(&src, TRUE);
  jvirt_barray_ptr *coefficients = jpeg_read_coefficients(&src);
  jpeg_copy_critical_parameters(&src, &dst);
  dst.arith_code = TRUE;
  if (argc > 1 && argv[1][0] == 'p')
    jpeg_simple_progression(&dst);
  jpeg_stdio_dest(&dst, stdout);
  jpeg_write_coefficients(&dst, coefficients);
  jpeg_finish_compress(&dst);
  jpeg_finish_decompress(&src);
  return 0;
}
"""


def photo(w, h, seed, mode="RGB", **save) -> bytes:
    rng = np.random.default_rng(seed)
    a = np.asarray(Image.fromarray(rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8))
                   .resize((w, h), Image.BICUBIC), np.float32) + rng.normal(0, 6, (h, w, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).convert(mode).save(buf, "JPEG", quality=90, **save)
    return buf.getvalue()


def main():
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        c, exe = os.path.join(tmp, "recode.c"), os.path.join(tmp, "recode")
        with open(c, "w") as f:
            f.write(RECODE)
        subprocess.run(["cc", "-O2", c, "-o", exe, "-ljpeg"], check=True)
        for name, data, mode in (("arith-420.jpg", photo(48, 32, 1, subsampling=2), "s"),
                                 ("arith-progressive.jpg", photo(40, 24, 2, subsampling=0), "p"),
                                 ("arith-gray.jpg", photo(24, 16, 3, mode="L"), "s")):
            out = subprocess.run([exe, mode], input=data, capture_output=True, check=True).stdout
            Image.open(io.BytesIO(out)).load()  # libjpeg reads it back
            with open(os.path.join(OUT, name), "wb") as f:
                f.write(out)
            print(name, len(out), "bytes", file=sys.stderr)


if __name__ == "__main__":
    main()

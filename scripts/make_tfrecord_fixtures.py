#!/usr/bin/env python3
"""Write tests/fixtures/tfrecord/ with TensorFlow's own tf.io.TFRecordWriter (run once, by hand).

Needs tensorflow-cpu and Pillow (e.g. a throwaway venv: pip install tensorflow-cpu pillow);
the tests themselves never import TensorFlow. Outputs:
  slim-0000{0,1}-of-00002   tf-slim ImageNet layout (1-based labels, synset/text, one PNG payload,
                            one CMYK JPEG, one grayscale JPEG)
  slim.gz, slim.zz          the same records, GZIP / ZLIB compressed by TensorFlow
  tfds.tfrecord             TFDS imagenet2012 layout (image, label 0-based, file_name)
  bad-data-byte, bad-length-byte, truncated, truncated.gz   corrupted copies of slim-00000
  expected.json             per file: [filename, 0-based label, sha256 of the image bytes]
"""
import hashlib
import io
import json
import os

import numpy as np
import tensorflow as tf
from PIL import Image

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tfrecord")
SYNSETS = ["n01440764", "n01443537", "n01484850"]
TEXTS = ["tench, Tinca tinca", "goldfish, Carassius auratus", "great white shark"]


def image(seed, fmt="JPEG", mode="RGB", size=(32, 24)):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (size[1] // 8 + 1, size[0] // 8 + 1, 3), dtype=np.uint8)
    im = Image.fromarray(a).resize(size, Image.BICUBIC).convert(mode)
    buf = io.BytesIO()
    im.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def b(v):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))


def i(v):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))


def slim_examples():
    out = []
    for k in range(12):
        label = k % 3
        payload = image(k)
        if k == 4:
            payload = image(k, fmt="PNG")  # like ImageNet's n02105855_2933.JPEG
        elif k == 7:
            payload = image(k, mode="CMYK")
        elif k == 9:
            payload = image(k, mode="L")
        name = f"{SYNSETS[label]}_{k}.JPEG".encode()
        ex = tf.train.Example(features=tf.train.Features(feature={
            "image/encoded": b(payload), "image/format": b(b"JPEG"), "image/class/label": i(label + 1),
            "image/class/synset": b(SYNSETS[label].encode()), "image/class/text": b(TEXTS[label].encode()),
            "image/filename": b(name), "image/height": i(24), "image/width": i(32),
            "image/colorspace": b(b"RGB"), "image/channels": i(3)}))
        out.append((ex.SerializeToString(), name.decode(), label, payload))
    return out


def write(path, records, compression=None):
    opts = tf.io.TFRecordOptions(compression_type=compression) if compression else None
    with tf.io.TFRecordWriter(path, options=opts) as w:
        for r in records:
            w.write(r)


def main():
    os.makedirs(OUT, exist_ok=True)
    expected = {}
    slim = slim_examples()
    halves = [slim[:6], slim[6:]]
    for n, part in enumerate(halves):
        name = f"slim-{n:05d}-of-00002"
        write(os.path.join(OUT, name), [r for r, *_ in part])
        expected[name] = [[f, lab, hashlib.sha256(p).hexdigest()] for _, f, lab, p in part]
    write(os.path.join(OUT, "slim.gz"), [r for r, *_ in slim], "GZIP")
    write(os.path.join(OUT, "slim.zz"), [r for r, *_ in slim], "ZLIB")
    expected["slim.gz"] = expected["slim.zz"] = [[f, lab, hashlib.sha256(p).hexdigest()] for _, f, lab, p in slim]
    tfds = []
    for k in range(5):
        payload = image(100 + k)
        ex = tf.train.Example(features=tf.train.Features(feature={
            "image": b(payload), "label": i(k % 2), "file_name": b(f"tfds_{k}.JPEG".encode())}))
        tfds.append(ex.SerializeToString())
        expected.setdefault("tfds.tfrecord", []).append([f"tfds_{k}.JPEG", k % 2,
                                                        hashlib.sha256(payload).hexdigest()])
    write(os.path.join(OUT, "tfds.tfrecord"), tfds)
    # corrupted copies of slim-00000: record k starts at offsets[k]
    raw = open(os.path.join(OUT, "slim-00000-of-00002"), "rb").read()
    offsets, pos = [], 0
    while pos < len(raw):
        offsets.append(pos)
        pos += 16 + int.from_bytes(raw[pos:pos + 8], "little")
    bad = bytearray(raw)
    bad[offsets[2] + 12 + 40] ^= 0xFF  # inside record 2's data
    open(os.path.join(OUT, "bad-data-byte"), "wb").write(bytes(bad))
    bad = bytearray(raw)
    bad[offsets[3] + 1] ^= 0x01  # record 3's length
    open(os.path.join(OUT, "bad-length-byte"), "wb").write(bytes(bad))
    open(os.path.join(OUT, "truncated"), "wb").write(raw[:offsets[5] + 100])  # record 5 cut short
    gz = open(os.path.join(OUT, "slim.gz"), "rb").read()
    open(os.path.join(OUT, "truncated.gz"), "wb").write(gz[: len(gz) * 2 // 3])
    expected["_offsets_slim-00000"] = offsets
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
    print(f"wrote {OUT} with TensorFlow {tf.__version__}")


if __name__ == "__main__":
    main()

"""Long fuzz run: mutated JPEGs, OFRecord parts, TFRecords, index files and manifests; a
hostile shard cache folder; a remote dataset behind a misbehaving S3 server; part files of a
packed dataset; Loader state dicts.

Every input must be accepted or refused with one of recordtool's named errors — never a crash
(signal), another exception type, or a slow input — and a JPEG the header reader accepts must
be one libjpeg-turbo does not refuse (hostile_data.libjpeg_disagreements). The kinds that serve
records check more: whatever was done to the index, the manifest, a part file, the cache
folder, the store or the saved state, every label served is the record's true label and
(but for a local part file changed in place, which is what it holds) every image its true
bytes; nothing outside the cache folder changes. Inputs are mutations of valid seeds (and of
the hostile seeds in tests/hostile_data.py): byte flips, truncation, inserted garbage,
length-field rewrites, index values rewritten column by column, JSON and state values of
other types and ranges. Each chunk runs in a child process with an address-space cap; each
input's outcome is counted — accepted, refused (a RecordtoolError), other (any other
exception), wrong_label, wrong_bytes, crash (the child died: a signal), hang (the chunk ran
past --timeout) — the last two at the input after the child's last progress line.

    python scripts/fuzz_hostile.py --total 1000000 --json fuzz.json
    python scripts/fuzz_hostile.py --kinds hostile --total 100000 --chunk 2000 --jobs 2 --json hostile.json

Reproduce a finding: `--only KIND --chunk-seed S --chunk N` re-runs the chunk that failed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import stat
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.join(HERE, "..", "tests"))
# after an installed recordtool (scripts/bootstrap.sh installs this tree's wheel into .venv, and
# the tests check the install): the tree is the fallback where none is installed
sys.path.append(os.path.join(HERE, ".."))

# share of the total per kind (the cache and remote kinds are slow per input: run them with --only)
KINDS = {"jpeg": 0.4, "ofrecord": 0.2, "tfrecord": 0.2, "index": 0.1, "manifest": 0.1, "cache": 0.0, "remote": 0.0,
         "parts": 0.0, "state": 0.0}
# `--kinds hostile`: what a dataset folder, a cache folder or a saved state can hand the library
HOSTILE = {"cache": 0.3, "index": 0.2, "manifest": 0.2, "parts": 0.15, "state": 0.15}
# per-input outcomes (crash and hang are counted by the parent from the child's last progress line)
OUTCOMES = ("accepted", "refused", "other", "wrong_label", "wrong_bytes", "crash", "hang")
SLOW_S = 1.0  # one input taking longer than this is a finding


def mutate(rng, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        kind = int(rng.integers(0, 6))
        if not b:
            b = bytearray(rng.bytes(int(rng.integers(1, 64))))
        if kind == 0:  # flip bytes
            for p in rng.integers(0, len(b), int(rng.integers(1, 8))):
                b[p] ^= int(rng.integers(1, 256))
        elif kind == 1:  # truncate
            b = b[:int(rng.integers(0, len(b)))]
        elif kind == 2:  # insert garbage
            p = int(rng.integers(0, len(b) + 1))
            b[p:p] = rng.bytes(int(rng.integers(1, 64)))
        elif kind == 3:  # 0xFF / 0x00 runs (markers, lengths)
            p = int(rng.integers(0, len(b)))
            b[p:p + int(rng.integers(1, 5))] = bytes([0xFF if rng.integers(0, 2) else 0]) * int(rng.integers(1, 5))
        elif kind == 4:  # rewrite a 2/4/8-byte field with an extreme value
            w = int(rng.choice([2, 4, 8]))
            p = int(rng.integers(0, max(1, len(b) - w)))
            vals = [0, 1, 2**(8 * w - 1) - 1, 2**(8 * w) - 1, int(rng.integers(0, 2**16))]
            v = vals[int(rng.integers(0, len(vals)))]
            b[p:p + w] = v.to_bytes(w, "little" if rng.integers(0, 2) else "big")
        else:  # duplicate a slice (repeated markers, scans, records)
            a = int(rng.integers(0, len(b)))
            e = min(len(b), a + int(rng.integers(1, 200)))
            b[a:a] = b[a:e] * int(rng.integers(1, 5))
    return bytes(b)


# ------------------------------------------------------------------ seeds and per-kind checks

def jpeg_seeds():
    import hostile_data as hd
    from conftest import jpeg_bytes

    return [jpeg_bytes(96, 72, seed=1, subsampling=2), jpeg_bytes(64, 80, seed=2, subsampling=0, progressive=True),
            jpeg_bytes(50, 40, seed=3, mode="L"), jpeg_bytes(72, 40, seed=4, subsampling=1, progressive=True),
            jpeg_bytes(40, 40, seed=5, mode="CMYK"), hd.bomb_progressive(), hd.many_scans(150, 64, 64),
            hd.corrupt_entropy(3), hd.two_frames(), hd.duplicate_component_id(in_scan=True),
            hd.sampling(((4, 2), (1, 1), (1, 1))), hd.tiny_baseline_declaring(1400, 1400)]


def run_jpeg(rng, n, stats):
    import numpy as np

    import hostile_data as hd

    from recordtool.decode import decode_crop_resize, native_available
    from recordtool.format.jpeg import BadJPEG, NotJPEG, probe

    assert native_available(), "fuzzing the native decoder needs it built"
    seeds = jpeg_seeds()
    batch = 64
    done = 0
    while done < n:
        k = min(batch, n - done)
        inputs = [mutate(rng, seeds[int(rng.integers(0, len(seeds)))]) for _ in range(k)]
        win = np.zeros((k, 4))
        for j, d in enumerate(inputs):
            w = h = 64.0
            try:
                info = probe(d)
                w, h = float(info.width), float(info.height)
                stats["accepted"] += 1
            except (NotJPEG, BadJPEG):
                stats["refused"] += 1
            # a window inside the declared image (mostly): the decode path, not the bounds check
            ww, wh = w * rng.uniform(0.05, 1.0), h * rng.uniform(0.05, 1.0)
            win[j] = (rng.uniform(0, h - wh + 1e-9), rng.uniform(0, w - ww + 1e-9), wh, ww)
        errors = []
        t = time.perf_counter()
        decode_crop_resize(inputs, win, size=(32, 32), threads=1, on_error="skip", errors=errors)
        slow = time.perf_counter() - t
        if slow > SLOW_S * k / 8:
            stats["slow"].append(f"jpeg batch of {k}: {slow:.2f} s")
        stats["decode_failures"] += len(errors)
        # what the header reader and the decodable rule accept, libjpeg must not refuse
        for data, why in hd.libjpeg_disagreements(inputs):
            stats["errors"].append(f"header reader accepts what libjpeg refuses ({why}): {data[:700].hex()}")
        done += k
    return done


def ofrecord_seed():
    import hostile_data as hd
    from conftest import jpeg_bytes

    return hd.ofrecord_part([(jpeg_bytes(40, 30, seed=i), i) for i in range(3)])


def run_ofrecord(rng, n, stats, tmp):
    from recordtool.errors import RecordtoolError
    from recordtool.format.ofrecord import decode_ofrecord, iter_records
    from recordtool.format.scan import index_parts, record_fields

    seed = ofrecord_seed()
    root = os.path.join(tmp, "parts")
    os.makedirs(root, exist_ok=True)
    for i in range(n):
        d = mutate(rng, seed)
        try:
            for rec in iter_records(d, "fuzz"):
                try:
                    decode_ofrecord(d, rec.data_offset, rec.data_offset + rec.length)
                    record_fields(d, rec, "encoded", "class/label", 1000)
                except (RecordtoolError, ValueError, UnicodeDecodeError):
                    stats["refused"] += 1
            stats["accepted"] += 1
        except RecordtoolError:
            stats["refused"] += 1
        if i % 50 == 0:  # the whole `recordtool index` path on some of them (files on disk)
            for name in os.listdir(root):
                os.unlink(os.path.join(root, name))
            with open(os.path.join(root, "part-00000"), "wb") as f:
                f.write(d)
            try:
                index_parts(root, progress=False)
            except RecordtoolError:
                pass
    return n


def tfrecord_seed():
    import hostile_data as hd
    from conftest import jpeg_bytes

    return hd.tfrecord([hd.example(jpeg_bytes(40, 30, seed=i), i) for i in range(3)])


def run_tfrecord(rng, n, stats, tmp):
    import gzip

    from recordtool.errors import OnError, RecordtoolError
    from recordtool.errors import Rejected
    from recordtool.sources.tfrecord import ScanResult, TFRecordSource, scan_buffer

    seed = tfrecord_seed()
    gz = gzip.compress(seed)
    path = os.path.join(tmp, "f.tfrecord")
    keys = {"image": "image", "label": "label", "label_offset": 0}
    for i in range(n):
        if i % 20 == 0:  # the whole source (inflate, scan, load) on a mutated GZIP file
            with open(path, "wb") as f:
                f.write(mutate(rng, gz))
            try:
                src = TFRecordSource([path], keys, tmpdir=tmp)
                for it in src.items:
                    try:
                        src.load(it)
                    except Rejected:
                        pass
                src.close()
                stats["accepted"] += 1
            except RecordtoolError:
                stats["refused"] += 1
            continue
        d = mutate(rng, seed)
        res = ScanResult()
        scan_buffer(d, "fuzz", 0, OnError.SKIP, res)
        stats["accepted" if not res.problems else "refused"] += 1
    left = [n for n in os.listdir(tmp) if n.startswith("recordtool-tfrecord-")]
    if left:
        stats["errors"].append(f"scratch folders left: {left}")
    return n


def index_seed(tmp):
    from recordtool.pack import pack
    from conftest import jpeg_bytes, write

    src = os.path.join(tmp, "src")
    for i in range(6):
        write(os.path.join(src, f"c{i % 2}", f"{i}.jpg"), jpeg_bytes(40 + i, 32, seed=i))
    out = os.path.join(tmp, "ds")
    pack(src, out, shards=2, progress=False)
    return out


def one(stats, what: str, fn) -> None:
    """Run one input (fn) and count its outcome: accepted (fn returned None), refused (a
    RecordtoolError), other (any other exception: a finding, with its traceback), or the
    finding fn returned ("wrong_label": a label served that is not the record's;
    "wrong_bytes": image bytes that are not the record's). Every 100 inputs the counts so far
    go to stdout, so the parent can count what a crash or a hang cut short."""
    from recordtool.errors import RecordtoolError

    try:
        wrong = fn()
    except RecordtoolError:
        stats["refused"] += 1
    except Exception:  # noqa: BLE001 — anything else escaping is what this script looks for
        stats["other"] += 1
        stats["errors"].append(f"{what}: {traceback.format_exc(limit=8)}")
    else:
        if wrong:
            stats[wrong] += 1
            stats["errors"].append(f"{what}: {wrong}")
        else:
            stats["accepted"] += 1
    stats["done"] += 1
    if stats["done"] % 100 == 0:
        progress(stats)


def progress(stats) -> None:
    print("PROGRESS " + json.dumps({k: stats[k] for k in OUTCOMES + ("done",) if k in stats}), flush=True)


def truth(root: str) -> tuple:
    """(labels, image bytes) of every record of the untouched dataset at root."""
    from recordtool.reader import Dataset

    with Dataset(root) as ds:
        return [int(x) for x in ds.labels], [bytes(ds[i][0]) for i in range(len(ds))]


def compare(ds, labels: list, images=None) -> str | None:
    """What `ds` serves against the truth: every record through `ds[i]` and the labels column."""
    if len(ds) != len(labels):
        return "wrong_label"
    got = [ds[i] for i in range(len(ds))]
    if [int(y) for _, y in got] != labels or [int(y) for y in ds.labels] != labels:
        return "wrong_label"
    if images is not None and [bytes(b) for b, _ in got] != images:
        return "wrong_bytes"
    return None


def _index_columns(data: bytes) -> list:
    """([(name, dtype, offset) of each column], row count) from an index file's header ([], 0 if unreadable)."""
    try:
        n = int.from_bytes(data[8:12], "little")
        header = json.loads(data[12:12 + n])
        return [(c["name"], c["dtype"], int(c["offset"])) for c in header["columns"]], int(header["count"])
    except Exception:  # noqa: BLE001 — a seed is valid; this only aims the mutations
        return [], 0


def mutate_index(rng, seed: bytes) -> bytes:
    """A byte-level mutation, or one row of one column rewritten with a plausible or extreme
    value (a label changed inside the class list: what no bounds check can see)."""
    import numpy as np

    cols, count = _index_columns(seed)
    if not cols or rng.integers(0, 2):
        return mutate(rng, seed)
    b = bytearray(seed)
    name, dtype, off = cols[int(rng.integers(0, len(cols)))]
    dt = np.dtype(dtype)
    row = int(rng.integers(0, max(1, count)))
    info = np.iinfo(dt) if dt.kind in "iu" else None
    cur = int(np.frombuffer(seed, dt, 1, off + row * dt.itemsize)[0])
    choices = [cur + 1, cur - 1, 0, 1, int(rng.integers(0, 8))] + ([info.min, info.max] if info else [])
    v = choices[int(rng.integers(0, len(choices)))]
    if info is not None:
        v = min(max(v, info.min), info.max)
    b[off + row * dt.itemsize:off + (row + 1) * dt.itemsize] = np.array([v], dt).tobytes()
    return bytes(b)


def run_index(rng, n, stats, tmp):
    """The dataset's index.rtx mutated (bytes, or one value of one column), then read, checked
    and opened as part of the dataset; every record served must be its true label and bytes."""
    from recordtool.format import index as ix
    from recordtool.format import manifest as mf
    from recordtool.reader import Dataset, check_rows

    ds = index_seed(tmp)
    labels, images = truth(ds)
    path = os.path.join(ds, "index.rtx")
    seed = open(path, "rb").read()
    shards = mf.load(ds)["shards"]
    for _ in range(n):
        data = mutate_index(rng, seed)
        os.unlink(path)  # truncating a file still mapped by the last round is slow
        with open(path, "wb") as f:
            f.write(data)

        def attempt():
            idx = ix.read_index(path)
            check_rows(idx, shards, path, 2)
            with Dataset(ds) as d:
                return compare(d, labels, images)

        one(stats, f"index {data[:300].hex()}", attempt)
    return n


def mutate_manifest(rng, seed: bytes) -> bytes:
    """Bytes mutated, or (half the time) one key's value — at the top or one level down —
    replaced by a value of another JSON type or range."""
    if rng.integers(0, 2):
        return mutate(rng, seed)
    m = json.loads(seed)
    keys = list(m)
    k = keys[int(rng.integers(0, len(keys)))]
    choices = [None, 7, -1, 0, "x", "../../etc/passwd", [], {}, [1, "a"], {"name": "/abs"}, 2**70, 1.5, True,
               "part-00001", "index.rtx", "00000000", -2**63, 1e308]
    target = m
    if isinstance(m[k], (dict, list)) and m[k] and rng.integers(0, 2):
        target = m[k] if isinstance(m[k], dict) else m[k][int(rng.integers(0, len(m[k])))]
        if isinstance(target, dict) and target:
            k = list(target)[int(rng.integers(0, len(target)))]
        else:
            target = m
    target[k] = choices[int(rng.integers(0, len(choices)))]
    return json.dumps(m).encode()


def run_manifest(rng, n, stats, tmp):
    """manifest.json mutated (bytes, or values of other types), then loaded and the dataset
    opened; every record served must be its true label and bytes."""
    from recordtool.format import manifest as mf
    from recordtool.reader import Dataset

    ds = index_seed(tmp)
    labels, images = truth(ds)
    path = os.path.join(ds, "manifest.json")
    seed = open(path, "rb").read()
    for _ in range(n):
        data = mutate_manifest(rng, seed)
        os.unlink(path)
        with open(path, "wb") as f:
            f.write(data)

        def attempt():
            mf.load(ds)
            with Dataset(ds) as d:
                return compare(d, labels, images)

        one(stats, f"manifest {data[:1500]!r}", attempt)
    return n


def run_parts(rng, n, stats, tmp):
    """A part file of the dataset mutated (bytes changed in place at its size, truncated,
    extended, swapped with the other part), then the dataset opened, every record and its
    parsed fields read (`ds.info`), and every 10th input one epoch through a Loader
    (on_error="skip", with_ids): every label served must be the record's. (The image bytes
    of a local part file changed in place are what it now holds: a local dataset's shards
    are not checksummed on read — `recordtool verify` does that.)"""
    import shutil
    import warnings

    import numpy as np

    from recordtool import Loader
    from recordtool.reader import Dataset

    ds = index_seed(tmp)
    labels, _ = truth(ds)
    names = sorted(n for n in os.listdir(ds) if n.startswith("part-"))
    originals = {name: open(os.path.join(ds, name), "rb").read() for name in names}
    for i in range(n):
        name = names[int(rng.integers(0, len(names)))]
        path = os.path.join(ds, name)
        act = int(rng.integers(0, 4))
        data = originals[name]
        if act == 0:  # in place, size kept
            data = (mutate(rng, data) + bytes(len(data)))[:len(data)]
        elif act == 1:
            data = mutate(rng, data)
        elif act == 2:  # the other part's bytes at this one's size
            other = originals[names[int(rng.integers(0, len(names)))]]
            data = (other + bytes(len(data)))[:len(data)]
        else:  # one 8-byte record length rewritten (a framing lie at the right size)
            b = bytearray(data)
            p = int(rng.integers(0, max(1, len(b) - 8)))
            values = [0, 1, 2**63 - 1, 2**64 - 1, len(b), int(rng.integers(0, 4096))]
            b[p:p + 8] = values[int(rng.integers(0, len(values)))].to_bytes(8, "little")
            data = bytes(b)
        for other in names:  # the rest as packed
            if other != name and open(os.path.join(ds, other), "rb").read() != originals[other]:
                os.unlink(os.path.join(ds, other))
                with open(os.path.join(ds, other), "wb") as f:
                    f.write(originals[other])
        os.unlink(path)
        with open(path, "wb") as f:
            f.write(data)

        def attempt():
            with Dataset(ds) as d:
                wrong = compare(d, labels)
                for r in range(len(d)):
                    d.info(r)
                    d.record(r)
            if wrong or i % 10:
                return wrong
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ld = Loader(ds, batch_size=2, size=16, train=bool(i % 20), threads=1, producers=1, as_torch=False,
                            with_ids=True, on_error="skip", seed=i)
                try:
                    for _, y, ids in ld:
                        if [int(v) for v in y] != [labels[int(r)] for r in ids]:
                            return "wrong_label"
                finally:
                    ld.close()
            return None

        one(stats, f"part {name} act {act}", attempt)
    shutil.rmtree(ds)
    del np
    return n


def mutate_state(rng, good: dict):
    """A Loader state dict with one to three keys removed, added or given another value (a
    type, a sign, a range, a neighbour), or something that is not a dict at all."""
    import numpy as np

    if rng.integers(0, 20) == 0:
        return [None, [], "state", 7, list(good.items()), (1, 2)][int(rng.integers(0, 6))]
    s = dict(good)
    keys = list(s) + ["extra"]
    for _ in range(int(rng.integers(1, 4))):
        k = keys[int(rng.integers(0, len(keys)))]
        act = int(rng.integers(0, 8))
        cur = s.get(k, 0)
        if act == 0:
            s.pop(k, None)
        elif act in (1, 2) and isinstance(cur, int) and not isinstance(cur, bool):  # a neighbour
            s[k] = cur + int(rng.integers(-3, 4))
        elif act == 3:  # a numpy integer (what torch.load and checkpoint code may hand back)
            dt = [np.int8, np.int32, np.int64, np.uint8, np.uint64][int(rng.integers(0, 5))]
            v = int(rng.integers(0, 300))
            s[k] = dt(v % (np.iinfo(dt).max + 1) if np.iinfo(dt).min == 0 else min(v, np.iinfo(dt).max))
        else:
            choices = [None, -1, 0, 1, 2, 3, 2**31, 2**63, 2**64 + 5, 10**30, 1.0, 1.5, float("nan"), float("inf"),
                       "3", "", True, False, [], {}, [1], b"1", np.float64(2.0), np.uint64(2**64 - 1), np.int64(-1),
                       np.array(1), np.array([1, 2]), "deadbeef" * 8, object()]
            s[k] = choices[int(rng.integers(0, len(choices)))]
    return s


def run_state(rng, n, stats, tmp):
    """Loader.load_state_dict with mutated state dicts (from the loader's own state_dict, or one
    taken mid-epoch); each accepted state is resumed: its first batch must be the batch that
    state names (ids and labels), and state_dict() afterwards must say where it stands."""
    import warnings

    from recordtool import Loader
    from recordtool.loader.stream import epoch_batches

    ds = index_seed(tmp)
    labels, _ = truth(ds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ld = Loader(ds, batch_size=2, size=16, train=True, threads=1, producers=1, as_torch=False, with_ids=True,
                    seed=3)
        saved = [ld.state_dict()]
        it = iter(ld)
        next(it)
        saved.append(ld.state_dict())  # mid-epoch
        ld.close()
    try:
        for _ in range(n):
            state = mutate_state(rng, saved[int(rng.integers(0, len(saved)))])

            def attempt():
                ld.load_state_dict(state)
                epoch, batch = int(state["epoch"]), int(state["batch"])
                want = epoch_batches(ld.sampler, ld.batch_size, ld.drop_last, epoch)
                if batch >= len(want):  # resumed at the epoch's end: the next iteration is empty
                    got = list(iter(ld))
                    return "wrong_label" if got else None
                it = iter(ld)
                try:
                    _, y, ids = next(it)
                    if [int(r) for r in ids] != [int(r) for r in want[batch]]:
                        return "wrong_label"
                    if [int(v) for v in y] != [labels[int(r)] for r in ids]:
                        return "wrong_label"
                    st = ld.state_dict()
                    if (st["epoch"], st["batch"]) not in ((epoch, batch + 1), (epoch + 1, 0)):
                        return "wrong_label"
                finally:
                    it.close()
                    ld.close()
                return None

            one(stats, f"state {state!r}"[:1500], attempt)
    finally:
        ld.close()
    return n


def _served(ds) -> list:
    return [(bytes(ds[i][0]), ds[i][1]) for i in range(len(ds))]


def _tree(root: str) -> dict:
    """Every file under root with its bytes (links as their target), to show nothing changed."""
    out = {}
    for d, dirs, names in os.walk(root):
        for n in dirs + names:
            p = os.path.join(d, n)
            out[p] = ("link", os.readlink(p)) if os.path.islink(p) else open(p, "rb").read() if os.path.isfile(p) \
                else "dir"
    return out


def _hostile_cache(rng, cache_dir: str, victim: str) -> str:
    """One random act against a cache folder (see run_cache); what it did."""
    import hostile_data as hd

    entries = []
    for d, dirs, names in os.walk(cache_dir):
        entries += [os.path.join(d, n) for n in dirs + names]
    if not entries:
        return "nothing cached"
    p = entries[int(rng.integers(0, len(entries)))]
    act = int(rng.integers(0, 12))
    plain = os.path.isfile(p) and not os.path.islink(p) and os.stat(p).st_nlink == 1  # (never the user's, linked)
    if plain and act <= 3:
        data = open(p, "rb").read()
        if act == 0:  # in place, size kept (cache poisoning)
            m = mutate(rng, data)
            m = (m + bytes(len(data)))[:len(data)]
        elif act == 1:  # truncated or extended
            m = mutate(rng, data)
        elif act == 2:  # another cached file's bytes, cut to this one's size
            other = [e for e in entries if os.path.isfile(e) and not os.path.islink(e) and not stat.S_ISFIFO(os.stat(e).st_mode)]
            o = open(other[int(rng.integers(0, len(other)))], "rb").read()
            m = (o + bytes(len(data)))[:len(data)]
        else:  # replaced by a new inode of the same size and mtime
            st = os.stat(p)
            tmp = p + ".new"
            with open(tmp, "wb") as f:
                f.write(bytes(reversed(data)))
            os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.replace(tmp, p)
            return f"replaced {p}"
        with open(p, "r+b") as f:
            f.write(m)
            f.truncate(len(m))
        return f"rewrote {p} (act {act})"
    if act in (4, 5):  # a link to the user's folder or file in its place
        target = victim if act == 4 else os.path.join(victim, "precious")
        if os.path.isdir(p) and not os.path.islink(p):
            import shutil

            shutil.rmtree(p)
        else:
            os.unlink(p)
        os.symlink(target, p)
        return f"linked {p} -> {target}"
    if act == 6:  # a FIFO in its place
        if os.path.isfile(p) or os.path.islink(p):
            os.unlink(p)
            os.mkfifo(p)
            return f"fifo {p}"
        return "no-op"
    if act == 7:  # a hard link to the user's file, named like a cached file
        d = p if os.path.isdir(p) and not os.path.islink(p) else os.path.dirname(p)
        os.link(os.path.join(victim, "precious"), os.path.join(d, f"zz{int(rng.integers(0, 1 << 30))}.0badc0de"))
        return f"hard link in {d}"
    if act == 8 and plain and os.path.getsize(p) >= 16:  # bytes changed, size and CRC32C kept
        import crc32c

        data = bytearray(open(p, "rb").read())
        want = crc32c.crc32c(bytes(data))
        m = bytearray((mutate(rng, bytes(data)) + bytes(len(data)))[:len(data)])
        hd.forge_crc(m, int(rng.integers(0, len(m) - 3)), want)
        with open(p, "r+b") as f:
            f.write(m)
        return f"rewrote {p}, CRC32C kept"
    is_lock = os.path.basename(os.path.dirname(p)) == "locks" or os.path.basename(p) == ".lock"
    if act in (9, 10) and is_lock and os.path.isfile(p) and not os.path.islink(p):
        os.unlink(p)
        if act == 9:  # a hard link to the user's file where a lock file goes
            os.link(os.path.join(victim, "precious"), p)
            return f"hard link at {p}"
        os.mkdir(p)  # a directory where a lock file goes
        return f"directory at {p}"
    if os.path.isfile(p) and not os.path.islink(p):  # deleted (a lock file, a shard, the index)
        os.unlink(p)
        return f"deleted {p}"
    return "no-op"


def run_cache(rng, n, stats, tmp):
    """A memory:// dataset read through a cache folder that is attacked between opens: each
    input does 1–3 random acts (bytes changed in place — also with the CRC32C kept —, truncated,
    swapped, replaced; a link to the user's folder or file, a FIFO, a hard link planted; a hard
    link to the user's file or a directory where a lock file goes; files deleted), then opens the
    dataset with a small cache_limit and reads every record. Each record served must be its
    true bytes and label; nothing in the user's folder may change; errors must be RecordtoolErrors."""
    import shutil
    import warnings

    import fsspec

    import recordtool
    from recordtool.errors import UnsafePath
    from recordtool.io import Retry

    local_root = index_seed(tmp)
    labels, images = truth(local_root)
    local = recordtool.open(local_root)
    mem = fsspec.filesystem("memory")
    mem.put(local_root, "/fuzz-cache/ds", recursive=True)
    url = "memory://fuzz-cache/ds"
    victim = os.path.join(tmp, "user")
    os.makedirs(victim)
    with open(os.path.join(victim, "precious"), "wb") as f:
        f.write(b"the user's data")
    snapshot = _tree(victim)
    limit = sum(sorted((s["bytes"] for s in local.shards), reverse=True)[:2])
    cache_dir = os.path.join(tmp, "cache")
    fast = Retry(attempts=2, backoff=0.001, max_backoff=0.001)
    for i in range(n):
        if i % 50 == 0 and os.path.exists(cache_dir):
            shutil.rmtree(cache_dir)  # start clean now and then: attacks on a fresh folder too
        acts = []
        if os.path.exists(cache_dir):
            for _ in range(int(rng.integers(1, 4))):
                acts.append(_hostile_cache(rng, cache_dir, victim))
        t = time.time()

        def attempt():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # bad copies dropped: warned, and expected here
                    ds = recordtool.open(url, cache_dir=cache_dir, cache_limit=limit, retry=fast)
                    try:
                        return compare(ds, labels, images)
                    finally:
                        ds.close()
            except UnsafePath:  # a planted link or FIFO stays refused until removed: the user starts clean
                shutil.rmtree(cache_dir)
                raise

        one(stats, f"cache after {acts}", attempt)
        if time.time() - t > 5 * SLOW_S:
            stats["slow"].append(f"{time.time() - t:.1f} s after {acts}")
        if _tree(victim) != snapshot:
            stats["errors"].append(f"the user's folder changed after {acts}")
            stats["other"] += 1
            return n
    return n


def run_remote(rng, n, stats, tmp):
    """A dataset on a local S3 server (moto) behind the fault proxy of tests/s3server.py: each
    input adds 0–3 faults on random objects (503 answers, short stalls against a short read
    timeout, truncated, altered and padded bodies) and, every 4th, damages an object on the
    store itself (bytes changed, cut, extended); then opens the dataset (fresh cache folder
    every 10th input) and reads every record. Served records must be their true bytes (unless
    the manifest itself was damaged: then only named errors count); errors must be RecordtoolErrors."""
    import shutil
    import warnings

    import s3fs
    from s3server import S3, Fault

    import recordtool
    from recordtool.errors import RecordtoolError
    from recordtool.io import Retry

    local_root = index_seed(tmp)
    local = recordtool.open(local_root)
    want = _served(local)
    server = S3()
    try:
        s3fs.S3FileSystem.retries = 1
        opts = dict(server.options, config_kwargs=dict(server.options["config_kwargs"], read_timeout=0.5))
        fs = s3fs.S3FileSystem(**server.options)
        fs.mkdir("fuzz")
        names = sorted(os.listdir(local_root))
        originals = {n: open(os.path.join(local_root, n), "rb").read() for n in names}

        def upload():
            for name in names:
                fs.pipe_file(f"fuzz/ds/{name}", originals[name])

        upload()
        cache_dir = os.path.join(tmp, "cache")
        fast = Retry(attempts=2, backoff=0.001, max_backoff=0.001)
        kinds = ["503", "stall", "truncate", "flip", "pad"]
        for i in range(n):
            server.proxy.clear()
            if i % 10 == 0 and os.path.exists(cache_dir):
                shutil.rmtree(cache_dir)
            faults = []
            for _ in range(int(rng.integers(0, 4))):
                key = names[int(rng.integers(0, len(names)))]
                kind = kinds[int(rng.integers(0, len(kinds)))]
                size = len(originals[key])
                faults.append(Fault(key, kind, times=int(rng.integers(1, 4)), seconds=0.8,
                                    keep=int(rng.integers(0, max(1, size))) if kind == "truncate" else
                                    int(rng.integers(1, 4 << 20)), offset=int(rng.integers(0, max(1, size)))))
            server.proxy.add(*faults)
            damaged = None
            if i % 4 == 3:
                damaged = names[int(rng.integers(0, len(names)))]
                fs.pipe_file(f"fuzz/ds/{damaged}", mutate(rng, originals[damaged]))
            t = time.time()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ds = recordtool.open("s3://fuzz/ds", cache_dir=cache_dir, storage_options=opts, retry=fast)
                    try:
                        got = _served(ds)
                    finally:
                        ds.close()
                if got != want and damaged != "manifest.json":
                    stats["errors"].append(f"served other bytes with faults {faults}, damaged {damaged}")
                stats["accepted"] += 1
            except RecordtoolError:
                stats["refused"] += 1
            if time.time() - t > 30:
                stats["slow"].append(f"{time.time() - t:.1f} s with faults {faults}, damaged {damaged}")
            if damaged is not None:
                server.proxy.clear()
                upload()
    finally:
        server.stop()
    return n


RUNNERS = {"jpeg": lambda rng, n, s, t: run_jpeg(rng, n, s), "ofrecord": run_ofrecord, "tfrecord": run_tfrecord,
           "index": run_index, "manifest": run_manifest, "cache": run_cache, "remote": run_remote,
           "parts": run_parts, "state": run_state}


def child(kind: str, seed: int, n: int, mem_mb: int, timeout: float) -> None:
    """One chunk in this (child) process; prints its stats as JSON on the last line."""
    import faulthandler

    import numpy as np

    resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
    faulthandler.enable()  # a crash prints where it happened (stderr goes to the parent's finding)
    faulthandler.dump_traceback_later(max(1.0, timeout - 5), exit=False)  # and so does a hang
    stats = {k: 0 for k in OUTCOMES}
    stats.update(decode_failures=0, done=0, errors=[], slow=[])
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="rt-fuzz-") as tmp:
        try:
            RUNNERS[kind](rng, n, stats, tmp)
        except Exception:  # anything but our named errors escaping the runner itself: a finding
            stats["other"] += 1
            stats["errors"].append(traceback.format_exc(limit=6))
    if not stats["done"]:  # the kinds that do not count one input at a time
        stats["done"] = n
    stats["errors"] = stats["errors"][:50]
    print(json.dumps(stats))


def _last_progress(out) -> dict:
    """The counts of the last PROGRESS line a child printed before it died or was killed."""
    if isinstance(out, bytes):
        out = out.decode(errors="replace")
    last = {}
    for line in (out or "").splitlines():
        if line.startswith("PROGRESS "):
            last = json.loads(line[len("PROGRESS "):])
    return last


def parse_kinds(text: str | None, only: str | None) -> dict:
    """kind → share of the total: --only, --kinds hostile, --kinds a=0.5,b=0.5, or KINDS."""
    if only:
        return {only: 1.0}
    if text is None:
        return KINDS
    if text == "hostile":
        return HOSTILE
    out = {}
    for part in text.split(","):
        k, _, share = part.partition("=")
        if k not in RUNNERS:
            raise SystemExit(f"--kinds: no kind {k!r} (kinds: {', '.join(RUNNERS)})")
        out[k] = float(share) if share else 1.0
    total = sum(out.values())
    return {k: v / total for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total", type=int, default=1_000_000, help="inputs in all, shared by KINDS")
    ap.add_argument("--chunk", type=int, default=20_000, help="inputs per child process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mem-mb", type=int, default=2048, help="address-space cap of each child")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds per chunk before it counts as a hang")
    ap.add_argument("--only", choices=sorted(KINDS), default=None)
    ap.add_argument("--kinds", default=None,
                    help="'hostile' (cache, index, manifest, parts, state) or kind=share,… (default: KINDS)")
    ap.add_argument("--chunk-seed", type=int, default=None, help="run one chunk with this seed (reproduce)")
    ap.add_argument("--json", default=None, help="write the summary here")
    ap.add_argument("--seconds", type=float, default=None, help="stop starting chunks after this long")
    ap.add_argument("--jobs", type=int, default=1, help="child processes at a time")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], int(a.child[1]), int(a.child[2]), int(a.child[3]), float(a.child[4]))
        return
    summary = run(parse_kinds(a.kinds, a.only), a.total, a.chunk, a.seed, a.mem_mb, a.timeout, a.chunk_seed,
                  a.seconds, exact=bool(a.only), jobs=a.jobs)
    print(json.dumps({k: v for k, v in summary.items() if k != "findings"}, indent=1))
    print(f"findings: {len(summary['findings'])}")
    for f in summary["findings"][:20]:
        print(json.dumps(f)[:1500])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    sys.exit(1 if summary["findings"] else 0)


def run(kinds: dict, total: int, chunk: int, seed: int = 0, mem_mb: int = 2048, timeout: float = 1200,
        chunk_seed=None, seconds=None, exact: bool = False, jobs: int = 1, log=print) -> dict:
    """Run `total` inputs shared by `kinds`, `chunk` per child process, `jobs` children at a
    time. A child that dies by a signal (or any other nonzero exit) counts one "crash", one
    killed at `timeout` one "hang", at the input after the last progress line it printed; the
    rest of its chunk is run by another child (another seed). Returns the summary: per kind,
    inputs and each outcome."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.time()
    summary = {"total": 0, "kinds": {}, "findings": [], "seed": seed, "outcomes": {k: 0 for k in OUTCOMES}}
    lock = threading.Lock()
    counter = iter(range(1 << 62))
    wants = {k: (total if exact else int(round(total * share))) for k, share in kinds.items()}
    aggs = {k: {"inputs": 0, "decode_failures": 0, "seconds": 0.0, **{o: 0 for o in OUTCOMES}}
            for k, w in wants.items() if w}

    def chunk_run(kind: str, n: int) -> None:
        """One child for n inputs of kind; what it left undone goes to another child."""
        while n > 0:
            if seconds is not None and time.time() - t0 > seconds:
                return
            with lock:
                cs = chunk_seed if chunk_seed is not None else seed * 1_000_003 + next(counter)
            t = time.time()
            try:
                p = subprocess.run([sys.executable, __file__, "--child", kind, str(cs), str(n), str(mem_mb),
                                    str(timeout)], capture_output=True, text=True, timeout=timeout)
                rc, out, err = p.returncode, p.stdout, p.stderr
            except subprocess.TimeoutExpired as e:
                rc, out, err = "timeout", e.stdout, e.stderr
            stats = None
            if rc == 0:
                try:
                    stats = json.loads(out.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    rc = "no summary"
            finding = None
            if stats is None:  # crashed or hung: what it finished, then the one input it died on
                stats = _last_progress(out)
                stats["done"] = min(n, stats.get("done", 0) + 1)
                stats["hang" if rc == "timeout" else "crash"] = 1
                if isinstance(err, bytes):
                    err = err.decode(errors="replace")
                finding = {"kind": kind, "chunk_seed": cs, "exit": rc, "input": stats["done"],
                           "stderr": (err or "")[-3000:]}
            with lock:
                agg = aggs[kind]
                agg["seconds"] += time.time() - t
                agg["inputs"] += stats["done"]
                for k in OUTCOMES + ("decode_failures",):
                    agg[k] += stats.get(k, 0)
                if finding:
                    summary["findings"].append(finding)
                for e in stats.get("errors", []) + stats.get("slow", []):
                    summary["findings"].append({"kind": kind, "chunk_seed": cs, "error": e})
                log(f"{kind}: {agg['inputs']}/{wants[kind]} inputs, {len(summary['findings'])} findings, "
                    f"{time.time() - t0:.0f} s", flush=True)
            n -= stats["done"]
            if chunk_seed is not None:
                return

    plan = []
    for kind in aggs:
        left = wants[kind]
        while left > 0:
            plan.append((kind, min(chunk, left)))
            left -= plan[-1][1]
            if chunk_seed is not None:
                break
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for f in [pool.submit(chunk_run, kind, n) for kind, n in plan]:
            f.result()
    for kind, agg in aggs.items():
        summary["kinds"][kind] = agg
        summary["total"] += agg["inputs"]
        for k in OUTCOMES:
            summary["outcomes"][k] += agg[k]
    summary["seconds"] = round(time.time() - t0, 1)
    summary["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}"
    try:
        summary["commit"] = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    except OSError:
        pass
    return summary


if __name__ == "__main__":
    main()

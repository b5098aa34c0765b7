"""`recordtool inspect`: what a dataset holds, from the manifest and index alone (no shard reads)."""
from __future__ import annotations

import numpy as np

from .format.jpeg import CHROMA_NAMES, CS_NAMES
from .datasets import open_dataset
from .io.fs import is_url
from .reader import Dataset

_SIDE_BUCKETS = [(0, 256), (256, 512), (512, 1024), (1024, 2048), (2048, 1 << 31)]


def _pct(a: np.ndarray) -> dict:
    if not len(a):
        return {}
    q = np.percentile(a, [0, 1, 50, 99, 100])
    return {"min": int(q[0]), "p1": int(q[1]), "p50": int(q[2]), "mean": float(a.mean()),
            "p99": int(q[3]), "max": int(q[4])}


def summarize(root: str, classes_of=None, **remote) -> dict:
    """What the dataset at `root` (a directory or an object-store URL) holds, as a dict.

    Args:
        root: the dataset directory or URL.
        classes_of: another dataset (its directory, manifest.json or URL; e.g. the training set
            of this validation set): the summary's "classes_of" compares the class lists
            (`compare_classes`).
        remote: cache_dir, cache_limit, storage_options, retry for a URL (only the manifest and
            the index are fetched).
    """
    reference = None
    if classes_of is not None:
        from .format.manifest import classes_of as read_classes

        reference = read_classes(classes_of, remote.get("storage_options") if is_url(classes_of) else None)
    ds = open_dataset(root, **remote)
    try:
        s = _summary(ds)
    finally:
        ds.close()
    if reference is not None:
        s["classes_of"] = compare_classes(s["class_names"], reference.names, reference.origin)
    return s


def compare_classes(names, reference, origin: str = "the reference") -> dict:
    """How a dataset's class list (`names`, position = label) differs from `reference`'s — what
    makes a model trained on one misread the other's labels: "missing" (in the reference, not
    here), "extra" (here, not in the reference), "renumbered" ({class, label, reference_label}
    of names in both at other labels); "same" when the lists are equal."""
    names, reference = list(names), list(reference)
    here = {n: k for k, n in enumerate(names)}
    there = {n: k for k, n in enumerate(reference)}
    return {"reference": origin, "same": names == reference,
            "missing": [n for n in reference if n not in here],
            "extra": [n for n in names if n not in there],
            "renumbered": [{"class": n, "label": k, "reference_label": there[n]} for n, k in here.items()
                           if n in there and there[n] != k]}


def _differences(c: dict, most: int = 10) -> str:
    """The one line `render` prints for a `compare_classes` result."""
    if c["same"]:
        return f"  classes: the same as {c['reference']} (names and labels)"

    def names(xs):
        return repr(xs[:most])[:-1] + (f", … {len(xs) - most} more]" if len(xs) > most else "]")

    parts = [f"missing {names(c['missing'])}"] if c["missing"] else []
    parts += [f"extra {names(c['extra'])}"] if c["extra"] else []
    r = c["renumbered"]
    if r:
        shown = ", ".join(f"{x['class']!r} {x['reference_label']} → {x['label']}" for x in r[:3])
        parts.append(f"renumbered {len(r)} ({shown}{', …' if len(r) > 3 else ''})")
    return f"  warning: classes differ from {c['reference']}: " + ", ".join(parts or ["same names, other order"])


def _summary(ds: Dataset) -> dict:
    c = ds.index.columns
    n = len(ds)
    long_side = np.maximum(c["width"], c["height"])
    per_class = np.bincount(c["label"], minlength=len(ds.classes)) if n else np.zeros(len(ds.classes), int)
    return {
        "path": ds.root,
        "records": n,
        "classes": len(ds.classes),
        "class_names": list(ds.classes),  # label k's name is class_names[k]
        "records_per_class": [int(v) for v in per_class],
        "per_class": {"min": int(per_class.min()) if len(per_class) else 0,
                      "max": int(per_class.max()) if len(per_class) else 0,
                      "empty": [ds.classes[i] for i in np.nonzero(per_class == 0)[0]]},
        "bytes": sum(s["bytes"] for s in ds.shards),
        "jpeg_bytes": _pct(c["jpeg_length"]),
        "width": _pct(c["width"]),
        "height": _pct(c["height"]),
        "long_side": {f"{lo}-{hi - 1}" if hi < 1 << 31 else f"{lo}+": int(((long_side >= lo) & (long_side < hi)).sum())
                      for lo, hi in _SIDE_BUCKETS},
        "chroma": {CHROMA_NAMES[int(k)]: int(v) for k, v in zip(*np.unique(c["chroma"], return_counts=True))},
        "colorspace": {CS_NAMES.get(int(k), str(k)): int(v)
                       for k, v in zip(*np.unique(c["colorspace"], return_counts=True))},
        "progressive": int(c["progressive"].sum()),
        "largest": [{"record": int(i), "bytes": int(c["jpeg_length"][i]),
                     "size": f"{int(c['width'][i])}x{int(c['height'][i])}"} for i in c["size_order"][:3]],
        "shards": [{"name": s["name"], "records": s["records"], "bytes": s["bytes"], "crc32c": s["crc32c"]}
                   for s in ds.shards],
        "source": ds.manifest.get("source"),
        "pack": ds.manifest.get("pack"),
    }


def render(s: dict, max_shards: int = 20, max_classes: int = 12) -> str:
    out = []
    w = out.append
    w(f"{s['path']}: {s['records']} records, {s['classes']} classes, {len(s['shards'])} shards, "
      f"{s['bytes'] / 1e6:.1f} MB")
    names, counts = s["class_names"], s["records_per_class"]
    shown = ", ".join(f"{k} {n!r} ({c})" for k, (n, c) in enumerate(zip(names[:max_classes], counts)))
    more = f", … {len(names) - max_classes} more (--json lists all)" if len(names) > max_classes else ""
    w(f"  classes: {shown}{more}")
    pc = s["per_class"]
    w(f"  per class: min {pc['min']}, max {pc['max']}" + (f", empty: {pc['empty']}" if pc["empty"] else ""))
    if "classes_of" in s:
        w(_differences(s["classes_of"]))
    for key, unit in (("jpeg_bytes", "B"), ("width", "px"), ("height", "px")):
        d = s[key]
        if d:
            w(f"  {key:<10} min {d['min']}  p1 {d['p1']}  p50 {d['p50']}  mean {d['mean']:.0f}  "
              f"p99 {d['p99']}  max {d['max']} {unit}")
    n = max(s["records"], 1)
    w("  long side  " + "  ".join(f"{k}: {v} ({100 * v / n:.1f}%)" for k, v in s["long_side"].items()))
    w("  chroma     " + "  ".join(f"{k}: {v} ({100 * v / n:.1f}%)" for k, v in s["chroma"].items()))
    w("  colour     " + "  ".join(f"{k}: {v}" for k, v in s["colorspace"].items()))
    w(f"  progressive {s['progressive']} ({100 * s['progressive'] / n:.1f}%)")
    w("  largest    " + ", ".join(f"#{x['record']} {x['bytes']} B {x['size']}" for x in s["largest"]))
    w("  shard          records        bytes    crc32c")
    for sh in s["shards"][:max_shards]:
        w(f"  {sh['name']:<12} {sh['records']:>9} {sh['bytes']:>12}  {sh['crc32c']}")
    if len(s["shards"]) > max_shards:
        w(f"  … {len(s['shards']) - max_shards} more shards (--json lists all)")
    return "\n".join(out)

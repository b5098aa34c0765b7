"""manifest.json: build it, write it, load and validate it (spec: FORMAT.md, "manifest.json").

Its presence means "this dataset is finished". Every reader goes through `load`, which checks
the JSON types and names before anything is used: a wrong type anywhere gives a FormatError
naming the key, and every file name must be a plain name inside the dataset directory.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from ..errors import ConfigError, DatasetNotFound, FormatError, UnsafePath
from ..io import files

MANIFEST_FILE = "manifest.json"
REPORT_FILE = "pack_report.json"
FORMAT_NAME = "recordtool-ofrecord"
FORMAT_VERSION = 1
MAX_BYTES = 256 << 20  # a manifest larger than this is refused unread (~2M shard entries)
# Labels must stay below this by default (`--max-classes`): the manifest stores a class name
# per label, so one record labelled 10**7 would otherwise make a manifest of a hundred megabytes.
MAX_CLASSES = 1_000_000
_HEX8 = re.compile(r"^[0-9a-f]{8}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def dump(obj) -> bytes:
    """Stable JSON: same content ⇒ same bytes, so re-runs are byte-identical. Names that are not
    valid UTF-8 (Linux file names can be any bytes) are kept as surrogate escapes → replaced."""
    text = json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    return text.encode("utf-8", "replace" if _has_surrogates(text) else "strict")


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def build(*, records: int, shards: list, index: dict, classes: list, keys: dict, source: dict,
          tool: dict, pack: dict | None = None, class_text: list | None = None, report: str | None = None,
          skipped: list | None = None, extra: dict | None = None) -> dict:
    """The manifest of a finished dataset, validated (so we never write one we would refuse).

    Args:
        records: number of records (= index rows).
        shards: `{name, records, bytes, crc32c, sha256}` per part file, in file-number order.
        index: `{file, bytes, crc32c, sha256}` of index.rtx.
        classes: class names; position = label.
        keys: feature keys used for image, label, height, width, filename.
        source: what was packed (`{kind, ...}`).
        tool: `{name, version}` of the writer.
        pack: the options that shaped the output (pack only).
        class_text: human-readable class names (TFRecord sources with text).
        report: file name of the pack report, when there is one.
        skipped: records `recordtool index` left out, `{shard, offset, reason}`.
        extra: more keys (readers ignore keys they do not know).
    """
    m = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "records": int(records),
         "shards": shards, "index": index, "classes": classes, "keys": keys, "source": source, "tool": tool}
    for k, v in (("pack", pack), ("class_text", class_text), ("report", report), ("skipped", skipped)):
        if v is not None:
            m[k] = v
    m.update(extra or {})
    validate(m, MANIFEST_FILE)
    return m


def write(root: str, manifest: dict) -> None:
    """Write root/manifest.json through a temporary file created exclusively, then rename."""
    files.replace_tmp(os.path.join(root, MANIFEST_FILE), dump(manifest))


def load(root: str) -> dict:
    """The validated manifest of the dataset at root; FormatError says what is wrong and where,
    DatasetNotFound that root does not exist or is a file."""
    if not os.path.isdir(root):
        if not os.path.lexists(root):
            raise DatasetNotFound(f"{root}: no such dataset directory (it does not exist)")
        raise DatasetNotFound(f"{root} is a file, not a dataset directory: give the folder `recordtool pack` "
                              "wrote (it holds manifest.json)")
    path = os.path.join(root, MANIFEST_FILE)
    try:
        raw = files.read_bounded(path, MAX_BYTES, "manifest")
    except FileNotFoundError:
        raise FormatError(f"{path}: no manifest, so {root} is not a finished recordtool dataset{_hint(root)}") \
            from None
    return parse(raw, path)


def parse(raw: bytes, path: str = MANIFEST_FILE) -> dict:
    """The validated manifest in `raw` (read from `path`, named in errors: a file or a URL)."""
    try:
        m = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: unreadable JSON ({e})") from None
    except RecursionError:  # json's decoder recurses per nesting level: a few KB of "[" reach the limit
        raise FormatError(f"{path}: JSON nested too deeply (a manifest nests a few levels)") from None
    return validate(m, path)


def _hint(root: str) -> str:
    try:
        names = os.listdir(root)
    except OSError:
        return ""
    if ".partial" in names:
        return " (an unfinished pack is there: re-run `recordtool pack` to finish it)"
    if any(n.startswith("part-") for n in names):
        return " (part files without an index: run `recordtool index` on them)"
    held = _source_images(root, names)
    if held:
        return (f" — it holds {held}, so it looks like a source folder: run `recordtool pack SRC OUT` first "
                "(SRC: the folder of class folders; or recordtool.pack.pack), then open OUT")
    return ""


SOURCE_LOOK = 64  # entries of a folder looked at to tell a source folder of images


def _source_images(root: str, names: list) -> str:
    """What a folder given where a packed dataset was expected holds, when it is what `recordtool
    pack` takes (class folders of images, ImageNet's layout) or one of its class folders (image
    files): "image files" / "class folders of images", else "". Looks at a few entries only."""
    from .schema import IMAGE_EXTENSIONS

    def images_in(names) -> bool:
        return any(n.lower().endswith(IMAGE_EXTENSIONS) for n in names[:SOURCE_LOOK])

    if images_in(names):
        return "image files"
    for n in sorted(names)[:SOURCE_LOOK]:
        sub = os.path.join(root, n)
        if os.path.isdir(sub) and not os.path.islink(sub):
            try:
                if images_in(os.listdir(sub)):
                    return "class folders of images"
            except OSError:
                continue
    return ""


def _need(cond: bool, path: str, what: str) -> None:
    if not cond:
        raise FormatError(f"{path}: {what}")


def _is_int(v) -> bool:
    """A JSON integer that fits the int64 arithmetic readers do with it."""
    return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63


def _digest_ok(entry: dict) -> bool:
    """`sha256` is optional (manifests written before it have none) but, when there, well formed:
    a reader checks cached copies against it."""
    v = entry.get("sha256")
    return v is None and "sha256" not in entry or isinstance(v, str) and bool(_HEX64.match(v))


def validate(m, path: str = MANIFEST_FILE) -> dict:
    """Check a parsed manifest's structure and types; return it. FormatError names the key."""
    _need(isinstance(m, dict), path, f"top level is {type(m).__name__}, not an object")
    if m.get("format") != FORMAT_NAME or m.get("format_version") != FORMAT_VERSION:
        raise FormatError(f"{path}: format {m.get('format')!r} v{m.get('format_version')!r} is not "
                          f"{FORMAT_NAME} v{FORMAT_VERSION}")
    _need(_is_int(m.get("records")) and m["records"] >= 0, path,
          f"'records' must be a non-negative integer, not {m.get('records')!r}")
    shards = m.get("shards")
    _need(isinstance(shards, list), path, f"'shards' must be a list, not {type(shards).__name__}")
    seen = set()
    for k, s in enumerate(shards):
        where = f"shards[{k}]"
        _need(isinstance(s, dict), path, f"{where} must be an object")
        name = s.get("name")
        try:
            files.plain_name(name, f"{where}.name")
        except UnsafePath as e:
            raise UnsafePath(f"{path}: {e}") from None
        _need(name not in seen, path, f"{where}.name {name!r} appears twice")
        _need(name not in (MANIFEST_FILE, REPORT_FILE) and not name.endswith(".tmp"), path,
              f"{where}.name {name!r} is not a part file name")
        seen.add(name)
        for key in ("records", "bytes"):
            _need(_is_int(s.get(key)) and s[key] >= 0, path,
                  f"{where}.{key} must be a non-negative integer, not {s.get(key)!r}")
        _need(isinstance(s.get("crc32c"), str) and bool(_HEX8.match(s["crc32c"])), path,
              f"{where}.crc32c must be 8 lowercase hex digits, not {s.get('crc32c')!r}")
        _need(_digest_ok(s), path, f"{where}.sha256 must be 64 lowercase hex digits, not {s.get('sha256')!r}")
    _need(sum(s["records"] for s in shards) == m["records"], path,
          f"shards hold {sum(s['records'] for s in shards)} records, 'records' says {m['records']}")
    idx = m.get("index")
    _need(isinstance(idx, dict), path, "'index' must be an object {file, bytes, crc32c}")
    try:
        files.plain_name(idx.get("file"), "index.file")
    except UnsafePath as e:
        raise UnsafePath(f"{path}: {e}") from None
    _need(idx["file"] not in seen and idx["file"] != MANIFEST_FILE, path,
          f"index.file {idx['file']!r} names another file of the dataset")
    _need(_is_int(idx.get("bytes")) and idx["bytes"] >= 0, path, "index.bytes must be a non-negative integer")
    _need(isinstance(idx.get("crc32c"), str) and bool(_HEX8.match(idx["crc32c"])), path,
          "index.crc32c must be 8 lowercase hex digits")
    _need(_digest_ok(idx), path, f"index.sha256 must be 64 lowercase hex digits, not {idx.get('sha256')!r}")
    classes = m.get("classes")
    _need(isinstance(classes, list) and all(isinstance(c, str) for c in classes), path,
          "'classes' must be a list of strings")
    ct = m.get("class_text")
    _need(ct is None or (isinstance(ct, list) and all(c is None or isinstance(c, str) for c in ct)), path,
          "'class_text' must be a list of strings or nulls")
    keys = m.get("keys", {})
    _need(isinstance(keys, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in keys.items()),
          path, "'keys' must map names to feature keys (strings)")
    if "report" in m:
        try:
            files.plain_name(m["report"], "report")
        except UnsafePath as e:
            raise UnsafePath(f"{path}: {e}") from None
    sk = m.get("skipped", [])
    _need(isinstance(sk, list) and all(isinstance(s, dict) for s in sk), path, "'skipped' must be a list of objects")
    for k, s in enumerate(sk):  # verify matches records against these
        _need(isinstance(s.get("shard", ""), str) and isinstance(s.get("reason", ""), str)
              and all(_is_int(s[key]) for key in ("offset", "records", "shorter_than") if key in s), path,
              f"skipped[{k}] must hold a shard name, integer offset/records/shorter_than and a reason")
    for key in ("source", "pack", "tool"):
        _need(m.get(key) is None or isinstance(m[key], dict), path, f"'{key}' must be an object")
    return m


@dataclass(frozen=True)
class ClassList:
    """A finished dataset's class names, position = label (its manifest's `classes`), and where
    they were read — the numbering a second pack of the same classes takes (`pack(...,
    classes_from=)`), or `recordtool inspect --classes-of` compares with. Names are unique
    (`classes_of` checks): each numbers one class folder."""

    names: tuple
    origin: str


def classes_of(where, storage_options: dict | None = None) -> ClassList:
    """The class list of the finished dataset at `where`: its directory, its manifest.json, or
    its URL (s3://bucket/prefix: only the manifest is read). ConfigError when `where` is none
    of these or its list names a class twice; FormatError when the manifest is not one."""
    if not isinstance(where, (str, os.PathLike)):
        raise ConfigError(f"classes_from must be a dataset path, its manifest.json or its URL, not "
                          f"{type(where).__name__}")
    where = os.fspath(where)
    from ..io.fs import check_options, is_url

    options = check_options(where, storage_options)
    if is_url(where):
        m = _remote_manifest(where, options)
    elif os.path.isdir(where):
        m = load(where)
    elif os.path.basename(where) == MANIFEST_FILE and os.path.isfile(where):
        m = parse(files.read_bounded(where, MAX_BYTES, "manifest"), where)
    else:
        raise ConfigError(f"classes_from {where}: not a packed dataset directory, its {MANIFEST_FILE} or its URL")
    names = tuple(m["classes"])
    first = {}
    for label, name in enumerate(names):
        if name in first:
            raise ConfigError(f"classes_from {where}: class {name!r} is listed twice (labels {first[name]} and "
                              f"{label}): it cannot number class folders")
        first[name] = label
    return ClassList(names, where)


def _remote_manifest(url: str, options: dict) -> dict:
    """The validated manifest of the dataset URL `url` (or of its manifest.json's URL)."""
    from ..io.fs import get_fs
    from ..io.transfer import Retry

    fs, path = get_fs(url, **options)
    path = path.rstrip("/")
    if not path.endswith("/" + MANIFEST_FILE):
        path = fs.join(path, MANIFEST_FILE)
    try:
        raw = Retry().call(lambda: fs.read_bytes(path, MAX_BYTES), fs.url(path))
    except FileNotFoundError:
        raise DatasetNotFound(f"{fs.url(path)}: no manifest, so it is not a finished recordtool dataset") from None
    return parse(raw, fs.url(path))

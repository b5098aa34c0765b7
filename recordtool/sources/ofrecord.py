"""An existing OFRecord dataset (OneFlow's, or ours) as a pack source: re-shard, re-index, fix."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import FormatError, OnError, Rejected, on_error as _on_error, report
from ..io import files
from ..format import manifest as mf
from ..format.scan import find_parts, part_records, synset_of
from ..checks import CLASSES_LIMIT, bounded_int
from ..format.schema import KEY_FILENAME, MAX_IMAGE_BYTES
from .base import DEFAULT_MAX_CLASSES, SourceArgs, no_classes, one_folder


@dataclass(frozen=True)
class Rec:
    shard: int
    offset: int
    image: tuple  # (a, b) span in the part file
    label: int
    filename: tuple | None


class OFRecordSource:
    """OFRecord part files (`part-NNNNN`, OneFlow's or ours) as a `Source`: one walk of the
    framing and of each record's wire format lists the items (image spans, labels).

    Args:
        root: folder holding the part files.
        image_key, label_key: feature keys of the image bytes and the integer label.
        on_error: a record or part whose framing is broken: "raise", "warn" or "skip" (listed
            in the pack report either way).
        max_classes: records with a label ≥ this are refused (a class name is stored per label).
    """

    kind = "ofrecord"  # --from ofrecord too

    @classmethod
    def usage(cls, args: SourceArgs) -> str | None:
        """SRC must be one folder; it has no class folders to number."""
        return one_folder(cls.kind, args.paths) or no_classes(cls.kind, args)

    @classmethod
    def open(cls, args: SourceArgs) -> "OFRecordSource":
        """The part files in `args.paths[0]`, read with the given feature keys (default OneFlow's)."""
        return cls(args.paths[0], image_key=args.image_key or "encoded", label_key=args.label_key or "class/label",
                   on_error=args.on_error, max_classes=args.max_classes)

    def __init__(self, root: str, image_key: str = "encoded", label_key: str = "class/label",
                 on_error: OnError | str = "skip", max_classes: int = DEFAULT_MAX_CLASSES):
        policy = _on_error(on_error)
        max_classes = bounded_int("max_classes", max_classes, 1, CLASSES_LIMIT)
        self.root = root
        self._abs_root = os.path.abspath(root)  # copies in Ray workers re-map from here
        self.names = find_parts(root)
        self.keys = {"image": image_key, "label": label_key}
        self.items, self.skipped, self.warnings = [], [], []
        self._maps, self._synsets = [], {}
        for s, name in enumerate(self.names):
            path = os.path.join(root, name)
            mm, _ = files.map_readonly(path)
            self._maps.append(mm)

            def bad(offset, reason, tiny, path=path):
                self.skipped.append((f"{path}: offset {offset}", reason))

            try:
                for rec, span, label, feats in part_records(mm, path, image_key, label_key, max_classes, policy,
                                                            bad):
                    fn = feats.get(KEY_FILENAME)
                    fn_span = fn[1][0] if fn and fn[1] and isinstance(fn[1][0], tuple) else None
                    self.items.append(Rec(s, rec.offset, span, label, fn_span))
                    syn = synset_of(mm, feats)
                    if syn is not None:
                        self._synsets.setdefault(label, syn)
            except FormatError as e:  # framing broken: the rest of this part is unreadable
                report(policy, str(e), FormatError)
                self.skipped.append((path, str(e)))
        self._classes = None
        if os.path.exists(os.path.join(root, mf.MANIFEST_FILE)):  # ours: keep its class names
            try:
                self._classes = mf.load(root)["classes"]
            except FormatError as e:
                self.warnings.append(f"class names of {root} not used: {e}")

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_maps"] = None
        return state

    def _map(self, k: int):
        if self._maps is None:  # an unpickled copy maps the part files on first use
            self._maps = [None] * len(self.names)
        if self._maps[k] is None:
            self._maps[k] = files.map_readonly(os.path.join(self._abs_root, self.names[k]))[0]
        return self._maps[k]

    def where(self, item: Rec) -> str:
        return f"{os.path.join(self.root, self.names[item.shard])}: offset {item.offset}"

    def load(self, item: Rec):
        mm = self._map(item.shard)
        a, b = item.image
        if b <= a:
            raise Rejected("empty image bytes")
        if b - a > MAX_IMAGE_BYTES:
            raise Rejected(f"{b - a} bytes of image, more than the {MAX_IMAGE_BYTES} an image may have")
        fn = bytes(mm[item.filename[0]:item.filename[1]]) if item.filename else b""
        return bytes(mm[a:b]), item.label, fn

    def classes(self, max_label: int):
        if self._classes and len(self._classes) > max_label:
            return list(self._classes), None
        return [self._synsets.get(i, str(i)) for i in range(max_label + 1)], None

    def describe(self) -> dict:
        return {"kind": self.kind, "path": self.root, "parts": len(self.names), "records": len(self.items),
                "keys": self.keys}

    def notes(self) -> dict:
        return {}

    def merge_notes(self, notes: dict) -> None:
        pass

    def close(self):
        import mmap

        for mm in self._maps or []:
            if isinstance(mm, mmap.mmap):
                mm.close()
        self._maps = None

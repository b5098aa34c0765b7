"""The source registry: a new pack input is one registered class; the CLI offers the kinds the
registry holds, by the names users type."""
import os
from dataclasses import dataclass

import pytest

import recordtool
from conftest import jpeg_bytes, write
from recordtool.errors import ConfigError, Rejected
from recordtool.sources import registry
from recordtool.sources.base import Source, SourceArgs, register, unregister


@dataclass(frozen=True)
class _Line:
    path: str
    label: int


class _ListSource:
    """A text file of `<image path> <label>` lines: a whole input format in one class."""

    kind = "imagelist"
    cli_name = "list"

    @classmethod
    def usage(cls, args: SourceArgs):
        return None if len(args.paths) == 1 and os.path.isfile(args.paths[0]) else "--from list takes one list file"

    @classmethod
    def open(cls, args: SourceArgs):
        return cls(args.paths[0])

    def __init__(self, path: str):
        self.path = path
        self.items, self.skipped, self.warnings = [], [], []
        with open(path) as f:
            for line in f:
                name, label = line.split()
                self.items.append(_Line(os.path.join(os.path.dirname(path), name), int(label)))

    def where(self, item):
        return item.path

    def load(self, item):
        try:
            with open(item.path, "rb") as f:
                return f.read(), item.label, os.fsencode(os.path.basename(item.path))
        except OSError as e:
            raise Rejected(f"unreadable: {e}") from None

    def classes(self, max_label: int):
        return [f"c{k}" for k in range(max_label + 1)], None

    def describe(self):
        return {"kind": self.kind, "path": self.path, "files": len(self.items)}

    def notes(self):
        return {}

    def merge_notes(self, notes):
        pass

    def close(self):
        pass


@pytest.fixture
def list_kind():
    register(_ListSource)
    try:
        yield _ListSource
    finally:
        unregister(_ListSource.kind)
    assert _ListSource.kind not in registry.source_kinds()


def test_a_registered_kind_packs_through_the_public_api(tmp_path, list_kind):
    """A class registered from outside recordtool is opened by name and packed: nothing but the
    class itself is needed for a new input format."""
    images = {f"img{k}.jpg": (jpeg_bytes(seed=k), k % 2) for k in range(5)}
    for name, (data, _) in images.items():
        write(tmp_path / "src" / name, data)
    write(tmp_path / "src" / "list.txt", "".join(f"{n} {lab}\n" for n, (_, lab) in images.items()).encode())
    assert "imagelist" in registry.source_kinds() and "list" in registry.cli_names()
    args = SourceArgs((str(tmp_path / "src" / "list.txt"),), str(tmp_path / "out"))
    assert registry.usage("list", args) is None
    assert registry.usage("imagelist", SourceArgs((str(tmp_path / "src"),), str(tmp_path / "out"))) == \
        "--from list takes one list file"
    source = registry.open_source("list", args)
    assert isinstance(source, Source)
    summary = recordtool.pack(source, tmp_path / "out", progress=False)
    assert summary.records == 5
    ds = recordtool.open(tmp_path / "out")
    got = {ds.info(i).filename: (bytes(ds[i][0]), ds[i][1]) for i in range(len(ds))}
    assert got == images
    assert ds.manifest["source"]["kind"] == "imagelist" and ds.classes == ["c0", "c1"]
    ds.close()


def test_a_kind_or_cli_name_is_registered_once(list_kind):
    taken = type("Other", (_ListSource,), {"kind": "other"})  # another class with the same --from name
    with pytest.raises(ConfigError, match="taken by _ListSource"):
        register(taken)
    assert registry.source_class("list") is _ListSource
    with pytest.raises(ConfigError, match="not one of"):
        registry.source_class("nope")


def test_the_cli_offers_the_registered_kinds_by_their_names():
    """--from's choices are the registry's, in its order, with the spellings users have."""
    from recordtool.cli.write import pack

    option = next(p for p in pack.params if p.name == "kind")
    assert tuple(option.type.choices) == registry.cli_names() == ("folder", "tfrecord", "ofrecord")
    assert option.default == "folder"
    assert registry.source_kinds() == ("imagefolder", "tfrecord", "ofrecord")
    assert registry.source_class("folder") is registry.source_class("imagefolder")

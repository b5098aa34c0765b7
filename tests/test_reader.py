"""Sampler and BlockSampler: per-epoch orders, exact cover across ranks; index file round trip."""
import numpy as np
import pytest

from recordtool import BlockSampler, Sampler
from recordtool.errors import ConfigError
from recordtool.format import index as ix
from recordtool.format.ofrecord import FormatError


@pytest.mark.parametrize("n,ws", [(10, 1), (10, 3), (11, 4), (1000, 8), (7, 7)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_cover_every_sample(n, ws, drop_last):
    parts = [Sampler(n, seed=3, rank=r, world_size=ws, drop_last=drop_last).indices(epoch=2)
             for r in range(ws)]
    assert len({len(p) for p in parts}) == 1  # equal counts per rank
    allx = np.concatenate(parts)
    if drop_last:
        assert len(allx) == n // ws * ws and len(set(allx.tolist())) == len(allx)
    else:
        assert set(allx.tolist()) == set(range(n))
        assert len(allx) == -(-n // ws) * ws  # padded by wrapping around: minimal repeats


def test_epochs_and_seeds_shuffle_deterministically():
    s = Sampler(1000, seed=1)
    e0, e1 = s.indices(0), s.indices(1)
    assert sorted(e0.tolist()) == list(range(1000)) and not np.array_equal(e0, e1)
    assert np.array_equal(e0, Sampler(1000, seed=1).indices(0))
    assert not np.array_equal(e0, Sampler(1000, seed=2).indices(0))
    assert np.array_equal(Sampler(5, shuffle=False).indices(9), np.arange(5))


@pytest.mark.parametrize("kw,match", [
    ({"rank": 3, "world_size": 3}, r"rank 3 not in \[0, world_size=3\)"), ({"rank": -1}, "rank must be at least 0"),
    ({"world_size": 0}, "world_size must be at least 1"), ({"world_size": True}, "world_size must be an integer"),
    ({"world_size": 2.0}, "world_size must be an integer"), ({"world_size": "2"}, "world_size must be an integer"),
    ({"rank": True, "world_size": 2}, "rank must be an integer"), ({"seed": -1}, "seed must be in"),
    ({"seed": 1.5}, "seed must be an integer"), ({"n": -1}, "n .samples. must be at least 0"),
    ({"n": 0}, "no samples to split over world_size=1"),
    ({"n": 2, "world_size": 3, "drop_last": True},
     "2 samples cannot be split over world_size=3 ranks with drop_last: .*at most 2 ranks.*drop_last=False"),
])
def test_sampler_rejects_bad_arguments_naming_them(kw, match):
    kw = dict({"n": 10}, **kw)
    with pytest.raises(ConfigError, match=match):
        Sampler(kw.pop("n"), **kw)


@pytest.mark.parametrize("n,ws", [(1, 4), (5, 8), (3, 3)])
def test_more_ranks_than_samples_pads_as_distributed_sampler(n, ws):
    """Without drop_last each of ws > n ranks gets one sample (torch's DistributedSampler pads
    the same way): every sample seen, the rest repeats; BlockSampler alike."""
    for make in (lambda r: Sampler(n, seed=2, rank=r, world_size=ws),
                 lambda r: BlockSampler(np.arange(n) % 2, 2, 1, seed=2, rank=r, world_size=ws)):
        parts = [make(r).indices(0) for r in range(ws)]
        assert all(len(p) == 1 for p in parts)
        assert set(np.concatenate(parts).tolist()) == set(range(n))


@pytest.mark.parametrize("bad", [-1, 0.5, 1.5, 2.0, "4", float("nan"), True, False, None])
def test_block_samplers_block_shards_is_an_integer_of_at_least_one(bad):
    match = "block_shards must be (an integer|at least 1)"
    with pytest.raises(ConfigError, match=match):
        BlockSampler(np.zeros(10, np.int64), 1, bad)
    with pytest.raises(ConfigError, match=match):
        BlockSampler(np.zeros(10, np.int64), 1, 0)
    assert BlockSampler(np.zeros(10, np.int64), 1, np.int64(3)).block_shards == 3


def test_index_round_trip_and_damage(tmp_path):
    n = 5000
    rng = np.random.default_rng(0)
    cols = {k: rng.integers(0, 100, n).astype(dt) for k, dt in ix.COLUMNS.items()}
    cols["size_order"] = ix.size_order(cols["jpeg_length"])
    p = str(tmp_path / "index.rtx")
    with open(p, 'wb') as f:
        f.write(ix.encode_index(ix.Index(cols)))
    back = ix.read_index(p)
    for k in ix.COLUMNS:
        assert back.columns[k].dtype == np.dtype(ix.COLUMNS[k]) and np.array_equal(back.columns[k], cols[k])
    raw = open(p, "rb").read()
    open(p, "wb").write(raw[:-10])
    with pytest.raises(FormatError, match="runs past the end"):
        ix.read_index(p)
    open(p, "wb").write(b"XXXX" + raw[4:])
    with pytest.raises(FormatError, match="offset 0: not a recordtool index"):
        ix.read_index(p)


def test_size_order_is_largest_first_and_stable():
    lens = np.array([5, 9, 5, 1, 9], dtype="<u4")
    assert ix.size_order(lens).tolist() == [1, 4, 0, 2, 3]


@pytest.mark.parametrize("n_shards,block,ws", [(8, 2, 1), (8, 3, 3), (5, 4, 2), (1, 1, 1)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_block_sampler_covers_every_sample_block_by_block(n_shards, block, ws, drop_last):
    rng = np.random.default_rng(0)
    shard_of = np.sort(rng.integers(0, n_shards, 97))
    samplers = [BlockSampler(shard_of, n_shards, block, seed=5, rank=r, world_size=ws, drop_last=drop_last)
                for r in range(ws)]
    parts = [s.indices(3) for s in samplers]
    assert len({len(p) for p in parts}) == 1 and len(parts[0]) == len(samplers[0])
    got = np.concatenate(parts)
    if drop_last:
        assert len(got) == 97 // ws * ws and len(set(got.tolist())) == len(got)
    else:
        assert set(got.tolist()) == set(range(97)) and len(got) == -(-97 // ws) * ws
    # the global order reads the blocks in turn: each block's shards form one stretch
    order = samplers[0].global_order(3)[:97 // ws * ws if drop_last else 97]
    blocks = samplers[0].blocks(3)
    block_of = {int(s): k for k, b in enumerate(blocks) for s in b}
    seq = [block_of[int(s)] for s in shard_of[order]]
    assert seq == sorted(seq)
    assert sorted(int(s) for b in blocks for s in b) == list(range(n_shards))
    assert all(len(b) == block for b in blocks[:-1])
    # pure function of (seed, epoch, rank, world_size)
    again = BlockSampler(shard_of, n_shards, block, seed=5, rank=0, world_size=ws, drop_last=drop_last)
    assert np.array_equal(again.indices(3), parts[0])


def test_block_sampler_shuffles_by_seed_and_epoch():
    shard_of = np.repeat(np.arange(10), 50)
    s = BlockSampler(shard_of, 10, 2, seed=1)
    e0, e1 = s.indices(0), s.indices(1)
    assert sorted(e0.tolist()) == list(range(500)) and not np.array_equal(e0, e1)
    assert not np.array_equal(e0, BlockSampler(shard_of, 10, 2, seed=2).indices(0))
    assert np.array_equal(BlockSampler(shard_of, 10, 2, shuffle=False).indices(4), np.arange(500))
    # within a block the two shards' samples are mixed, not read shard after shard
    first = shard_of[e0[:100]]
    assert len(set(first.tolist())) == 2 and (np.diff(first) != 0).sum() > 10
    with pytest.raises(ConfigError, match="block_shards must be at least 1, not 0"):
        BlockSampler(shard_of, 10, 0)


def test_jpeg_views_are_the_records_bytes(tmp_path):
    """Dataset.jpeg_views(ids) (a batch's bytes, columns gathered once) = [ds[i][0] for i in ids],
    negative ids too; an id out of range is an IndexError naming it."""
    import recordtool
    from conftest import jpeg_bytes, write
    from recordtool.pack import pack

    for i in range(12):
        write(str(tmp_path / "src" / f"c{i % 2}" / f"{i}.jpg"), jpeg_bytes(40 + i, 32, seed=i))
    pack(str(tmp_path / "src"), str(tmp_path / "out"), shards=3, progress=False)
    ds = recordtool.open(str(tmp_path / "out"))
    ids = np.array([11, 0, 5, 5, -1, 3], np.int64)
    views = ds.jpeg_views(ids)
    assert [bytes(v) for v in views] == [bytes(ds[int(i)][0]) for i in ids]
    assert all(isinstance(v, memoryview) for v in views) and ds.jpeg_views([]) == []
    with pytest.raises(IndexError, match="record 12 out of range"):
        ds.jpeg_views([1, 12])
    with pytest.raises(IndexError, match="out of range"):
        ds.jpeg_views(np.array([2**63 + 1], np.uint64))  # not wrapped to a negative id
    with pytest.raises(IndexError, match="integers"):
        ds.jpeg_views(np.array([1.5]))


@pytest.fixture(scope="module")
def six(tmp_path_factory):
    """A dataset of 6 records in 2 shards."""
    from conftest import packed_folder

    return packed_folder(tmp_path_factory.mktemp("six"), 6)


@pytest.mark.parametrize("bad,match", [(-1, "at least 0, not -1"), (0.5, "an integer, not 0.5"),
                                       (1.5, "an integer, not 1.5"), ("4", "an integer, not '4'"),
                                       (float("nan"), "an integer, not nan"), (True, "an integer, not True"),
                                       (0.0, "an integer, not 0.0")])
def test_block_shards_is_checked_where_it_is_given(six, bad, match):
    """`Dataset.sampler(block_shards=)` and the Loader's: a ConfigError naming it for anything
    but None or an integer ≥ 0 — bools and floats included, which were taken as shard counts."""
    import recordtool

    with pytest.raises(ConfigError, match="block_shards must be " + match):
        recordtool.open(six).sampler(block_shards=bad)
    with pytest.raises(ConfigError, match="block_shards must be " + match):
        recordtool.Loader(six, 2, block_shards=bad, as_torch=False)
    ds = recordtool.open(six)
    assert type(ds.sampler(block_shards=0)) is Sampler and ds.sampler(block_shards=np.int64(2)).block_shards == 2


def test_a_loader_over_more_ranks_than_records(six):
    """world_size > records: evaluation (no drop_last) pads each rank to one record, as torch's
    DistributedSampler does, and README's recipe (drop `padding`) counts each record once;
    training (drop_last) would leave every share empty: a ConfigError naming both numbers."""
    import recordtool

    seen = []
    for rank in range(10):
        ld = recordtool.Loader(six, 2, train=False, rank=rank, world_size=10, size=16, as_torch=False, with_ids=True)
        (batch,) = list(ld)
        assert len(batch[2]) == 1 and ld.padding == (1 if rank >= 6 else 0)
        seen += list(batch[2])[:1 - ld.padding]
    assert sorted(seen) == list(range(6))
    with pytest.raises(ConfigError, match="6 samples cannot be split over world_size=10 ranks with drop_last"):
        recordtool.Loader(six, 1, train=True, rank=0, world_size=10, as_torch=False)


def test_record_info_prints_metadata_and_the_image_as_its_length(six, capsys):
    """`print(ds.info(i))` shows the record's metadata — label, file, size, shard and offset,
    the image's length — with the image's bytes as `<N bytes>`, not dumped; the features still
    hold the bytes themselves."""
    import recordtool

    ds = recordtool.open(six)
    for i in range(len(ds)):
        info = ds.info(i)
        jpeg = bytes(ds[i][0])
        assert info.jpeg_length == len(jpeg) and info.features["encoded"] == [jpeg]
        assert info.offset == int(ds.index.offset[i]) and info.shard == ds.shards[int(ds.index.shard[i])]["name"]
        print(info)
        shown = capsys.readouterr().out
        assert "\\xff\\xd8" not in shown  # the JPEG's start, as bytes print
        assert f"'encoded': [<{len(jpeg)} bytes>]" in shown and len(shown) < 400
        for part in (f"id={i},", f"label={info.label},", f"filename={info.filename!r}", f"width={info.width},",
                     f"offset={info.offset},", f"jpeg_length={len(jpeg)},", f"shard={info.shard!r}",
                     f"'filename': [{info.filename.encode()!r}]"):  # short bytes as they are
            assert part in shown, (part, shown)
        assert repr(info) == shown.strip()

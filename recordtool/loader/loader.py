"""`Loader`: the configuration of a training input pipeline; iterating it runs one epoch.

Composition (FFCV's shape): the Loader holds the settings, the dataset, the sampler and a
batcher (CPUBatcher or GPUBatcher, kept across epochs); `iter(loader)` gives an `EpochIterator`
over the epoch's share of a `BatchStream` — ordered producer threads that call the batcher and,
by default, run on into the next epoch while this one's last batches are consumed (the next
`iter(loader)` takes up the stream where it stands; any other start begins a new one). A batch is
a pure function of (seed, epoch, rank, world_size, batch index), so `state_dict()` is just where
the epoch stands, and resuming yields exactly the batches an uninterrupted run would.
"""
from __future__ import annotations

import inspect
import weakref
from typing import Literal, Union

import numpy as np

from ..checks import bounded_int
from ..datasets import open_dataset
from ..decode.cpu import cores
from ..decode.spec import EvalCrop, Output, TrainCrop
from ..errors import BadState, ConfigError, NotADataset, OnError, on_error as _on_error
from ..reader import Dataset
from ..remote import RemoteDataset
from .args import RING_MEMORY_SHARE, dist_defaults as _dist_defaults, flag as _flag
from .args import memory_bound as _memory_bound
from .config import GPUOptions, RemoteOptions, parts as _parts
from .cpu import check_user_op
from .device import parse_device, resolve
from .prefetch import on_producer_thread
from .recipe import Recipe
from .epoch import EpochIterator, LoaderSampler
from .stream import BatchStream, epoch_batches

DeviceLike = Union[Literal["cpu", "cuda"], str, int, object]  # also "cuda:1", torch.device, cupy Device


class Loader:
    """Iterate `(images, labels)` batches of a packed dataset, one epoch per iteration.

    The configuration comes in a few frozen parts, each checked once when it is made
    (loader.config): `Output` (what a batch looks like), `TrainCrop` / `EvalCrop` (the
    augmentation), `GPUOptions` (a cuda Loader's decoders), `RemoteOptions` (a dataset URL's
    store and cache). Their fields may also be given flat, as keywords of the Loader
    (`size=224, dtype="bfloat16", scale=(0.2, 1.0), split="gpu", cache_dir=...`): each is
    folded into its part and checked there; a part and one of its keywords together are a
    ConfigError, and so is an unknown keyword (naming the nearest known one).

    Args:
        path: dataset directory, dataset URL (s3://bucket/prefix, any fsspec URL), or an open `Dataset`.
        batch_size: images per batch (≥ 1).
        device: "cpu" (native CPU decoder), or a GPU (NVJPG engines + hybrid decoder + CPU share):
            "cuda" (the caller's current CUDA device), "cuda:1", torch.device("cuda", 1), or 1.
        train: training (random windows and flips, keyed by (seed, epoch, sample id)) or
            evaluation (resize + centre crop). None: False when `augment` is an EvalCrop, else
            True; given, it must agree with `augment`'s kind.
        output: what the batch looks like — Output(size=224, mean=IMAGENET_MEAN,
            std=IMAGENET_STD, dtype="float32", layout="NCHW", memory_format="contiguous"):
            the side (an int, or (h, w)), the normalisation, the element type ("float32",
            "float16" or "bfloat16": the Loader normalises), the shape and the memory order
            (see Output). Keywords: size, mean, std, dtype, layout, memory_format.
        augment: TrainCrop(scale=(0.08, 1.0), ratio=(3/4, 4/3), hflip=0.5) — torchvision's
            RandomResizedCrop and RandomHorizontalFlip — or EvalCrop(crop_pct=0.875): resize
            to cover floor(size / crop_pct), centre crop (see each). Default: the one `train`
            says, at its defaults. Keywords: scale, ratio, hflip (train), crop_pct
            (evaluation); those of the other mode set away from their defaults are a
            ConfigError (they would do nothing).
        gpu: cuda only — GPUOptions(split="auto", first="engines", hybrid=True,
            chroma="interpolate", same_pixels=False, run_ahead=1): how images are shared between
            the engines, nvJPEG's hybrid decoder and the CPU, how chroma is upsampled, and how
            many steps of GPU work the training loop may keep queued (see GPUOptions). Given with
            device="cpu" it is a ConfigError, as are its keywords (split, first, hybrid, chroma,
            same_pixels, run_ahead) set away from their defaults.
        remote: a dataset URL only — RemoteOptions(cache_dir=None, cache_limit=None,
            storage_options=None, deadline=60.0): the local shard cache, the fsspec options that
            reach the store and how long one request may take, as `recordtool.open` takes them.
            Given for a local path or an open Dataset it is a ConfigError. Keywords: cache_dir,
            cache_limit, storage_options, deadline.
        shuffle: a new order every epoch (keyed by seed and epoch); default: `train`. False:
            record order, the same every epoch (evaluation).
        drop_last: drop the last partial batch (and cut the epoch to equal rank shares); default:
            `train`. False: every sample once (ranks padded to equal shares, as torch's
            DistributedSampler does).
        seed: keys the shuffle, windows, flips and keyed user ops.
        rank, world_size: this process's share; default from torch.distributed or RANK/WORLD_SIZE.
        block_shards: `Dataset.sampler`'s — None: block shuffle for URLs, global permutation for local data.
        threads: CPU decode threads (default: cores).
        producers: producer threads (default 2).
        prefetch: batches each producer makes ahead.
        continuous: the producers go on into the next epoch's first batches while the training
            loop takes this epoch's last ones (as DALI's pipeline does), so an epoch does not
            start from idle producers; the next `iter(loader)` takes them up when it starts
            where the stream stands (the next epoch, batch 0), any other start (set_epoch to
            another epoch, load_state_dict, a loop left early) discards them. False: nothing is
            made before it is asked for (each epoch starts from idle producers). Not for a
            dataset URL: its shard cache follows one epoch's block plan at a time.
        user_op: op(batch) or KeyedOp op(batch, keys) on each uint8 NHWC batch before
            normalisation (numpy on CPU, CuPy on GPU); returns the batch. Or a compiled per-image
            op (recordtool.ops.ImageOp, needs recordtool[numba]): run by the native decode threads
            on each image after the resize, before mirror and normalize (on cuda: its CUDA
            kernel, one launch per batch); compiled here, OpCompileError if it cannot be. A
            torchvision transform or a torch.nn.Module is refused (ConfigError naming what to pass
            instead): they take tensors, and v2 transforms hand a NumPy batch back unchanged.
        on_error: a record no decoder can decode — "raise" (RecordError naming shard and offset),
            "warn" (a warning; the sample is zeros, its label kept; listed in `bad_records`) or
            "skip" (the same without the warning).
        as_torch: torch tensors (DLPack on the GPU); None: when torch imports. bfloat16 comes
            as a torch.bfloat16 tensor; with as_torch=False as its bits in a uint16 array.
        with_ids: also yield each batch's sample ids.

    Read-only attributes: the parts (`output`, `augment`, `gpu` — None on the CPU —, `remote`
    — None unless given —) and their fields (`size` — an int for a square output —, `mean`,
    `std`, `dtype`, `layout`, `memory_format`, `scale`, `ratio`, `hflip`, `crop_pct` — None
    where the augmentation has no such field —, `split`, `hybrid`, `chroma`, `same_pixels` —
    None on the CPU), `device` ("cpu" or "cuda"; `dev` the parsed Device) and `gpu_id`.

    Epochs: each `iter(loader)` runs one epoch. A loop that leaves an epoch early (a `break`,
    Lightning's `limit_train_batches`) and iterates again gets the next epoch, never the same
    batches again; `set_epoch(e)` (called directly or on `loader.sampler`, as Lightning does at
    every epoch's start) chooses the epoch the next iteration runs, and `load_state_dict` the
    epoch and batch. `state_dict()` names the dataset, so a state is not taken on another one.

    Errors (all RecordtoolError): ConfigError for a bad argument, DeviceUnavailable for a GPU
    this process cannot use, DatasetNotFound / FormatError for the path.
    """

    # what torch's DataLoader has and code written for it reads (Lightning asks whether a loader
    # shuffles through it): the Loader batches itself, so there is no batch sampler
    batch_sampler = None

    def __init__(self, path, batch_size: int, device: DeviceLike = "cpu", *, train: bool | None = None,
                 output: Output | None = None, augment: TrainCrop | EvalCrop | None = None,
                 gpu: GPUOptions | None = None, remote: RemoteOptions | None = None, shuffle: bool | None = None,
                 drop_last: bool | None = None, seed: int = 0, rank: int | None = None, world_size: int | None = None,
                 block_shards: int | None = None, threads: int | None = None, producers: int | None = None,
                 prefetch: int = 2, continuous: bool = True, user_op=None, on_error: OnError | str = "raise",
                 as_torch: bool | None = None, with_ids: bool = False, **shorthand):
        # every argument checked here, once, into frozen parts (Output, TrainCrop / EvalCrop,
        # GPUOptions, RemoteOptions, Device) or ints; the layers below take them as they are
        self.dev = dev = parse_device(device)
        self.batch_size = bounded_int("batch_size", batch_size, 1, floats=False)
        self.train, self.output, self.augment, self.gpu, self.remote = _parts(
            path, dev, train=train, output=output, augment=augment, gpu=gpu, remote=remote, shorthand=shorthand,
            keywords=_KEYWORDS)
        self.shuffle = self.train if shuffle is None else _flag(shuffle, "shuffle")
        self.drop_last = self.train if drop_last is None else _flag(drop_last, "drop_last")
        self.seed = bounded_int("seed", seed, 0, floats=False)
        self.prefetch = bounded_int("prefetch", prefetch, 1, floats=False)
        self.continuous = _flag(continuous, "continuous")
        self.threads = cores() if threads is None else bounded_int("threads", threads, 1, floats=False)
        # producer threads, batches dealt round-robin and handed out in order: two, so one's
        # Python work (and user op) overlaps the other's decode. On the GPU, measured in training
        # with epochs running into each other (BENCHMARKS.md), 4 producers took twice the
        # producers' CPU for the same rate and cost the training loop more than 2.
        self.producers = 2 if producers is None else bounded_int("producers", producers, 1, floats=False)
        self.on_error = _on_error(on_error)
        self.with_ids = _flag(with_ids, "with_ids")
        as_torch = None if as_torch is None else _flag(as_torch, "as_torch")
        self.user_op = user_op = check_user_op(user_op)  # before the dataset opens: a refused op costs no download
        self.gpu_id = resolve(dev) if dev.cuda else None
        self._owns_ds = not isinstance(path, Dataset)  # opened here: a URL's cached shards let go of by close()
        self.ds = path if isinstance(path, Dataset) else open_dataset(
            path, **({} if self.remote is None else self.remote.open_args()))
        rank, world_size = _dist_defaults(rank, world_size)
        self.world_size = bounded_int("world_size", world_size, 1, floats=False)
        self.rank = bounded_int("rank", rank, 0, floats=False)
        if self.rank >= self.world_size:
            raise ConfigError(f"rank {self.rank} not in [0, world_size={self.world_size})")
        self._order = self.ds.sampler(seed=self.seed, rank=self.rank, world_size=self.world_size,
                                      drop_last=self.drop_last, shuffle=self.shuffle, block_shards=block_shards)
        self.sampler = LoaderSampler(self, self._order)
        planned = getattr(self._order, "on_plan", None) is not None  # a remote dataset's cache plans each epoch
        if planned:  # and counts a record served once its view is taken: no continuous epochs, no lanes (GPUBatcher)
            self.continuous = False
        share = len(self._order)
        if self.drop_last and share < self.batch_size:
            raise ConfigError(f"batch_size {self.batch_size} is more than the {share} records of this rank's share "
                              f"of {self.ds.root}: with drop_last every epoch would have no batch; lower batch_size "
                              "or pass drop_last=False")
        if as_torch is None:
            try:
                import torch  # noqa: F401
                as_torch = True
            except ImportError:
                as_torch = False
        self.as_torch = as_torch
        # where the Loader stands (epoch, batch): the next iteration's start, or, while an epoch
        # that an iteration took batches from is left unfinished (`_open`), where that epoch
        # stands — the next iteration then begins the following epoch (DataLoader users' habit)
        self._pos, self._open = (0, 0), False
        self._resumed = False  # _pos came from load_state_dict: set_epoch of its epoch keeps its batch
        self._generation = 0  # +1 at each iteration, set_epoch, load_state_dict: an older iteration's
        # batches no longer move _pos (a set_epoch inside a running loop holds after it)
        self._iterator = None  # weakref to the running EpochIterator
        self._stream = None  # the BatchStream the next iteration may take up
        self.bad_records: dict = {}  # record id → reason (on_error "warn" / "skip")
        self.last_split = None  # cuda: the last yielded batch's BatchReport
        self.stage_seconds, self.decoded = {}, {}  # producer-side s per stage, (cuda) images per decoder, summed
        # of decoded["cpu"]: GPU-bound images past the buffers' room (room.batch_room), and decoded ahead (loader.ahead)
        self.overflow = self.ahead = 0
        recipe = Recipe(self.ds, self.output, self.seed, self.augment)
        # batches alive at once: queued (producers × prefetch), being made (producers), and the
        # consumer's current and previous one; each as large as the largest batch this rank makes
        slots = self.producers * (self.prefetch + 1) + 2
        max_batch = max(1, min(self.batch_size, share))
        need, bound = slots * self.output.nbytes(max_batch), _memory_bound(self.gpu_id)
        if need > bound:
            where = "RAM" if self.gpu_id is None else f"GPU {self.gpu_id}'s memory"
            h, w = self.output.size
            raise ConfigError(f"the output ring would take {need / 2**30:.1f} GiB ({slots} batches of {max_batch} "
                              f"{self.output.dtype} images of {h}×{w}), more than {RING_MEMORY_SHARE:.0%} of "
                              f"{where} ({bound / 2**30:.1f} GiB): lower batch_size, size, prefetch or producers")
        if dev.cuda:
            from .gpu import GPUBatcher

            self.batcher = GPUBatcher(recipe, gpu_id=self.gpu_id, producers=self.producers, threads=self.threads,
                                      user_op=user_op, options=self.gpu, slots=slots, max_batch=max_batch,
                                      look_ahead=not planned)
        else:
            from .cpu import CPUBatcher

            self.batcher = CPUBatcher(recipe, threads=self.threads, user_op=user_op, slots=slots, max_batch=max_batch,
                                      producers=self.producers)

    # ------------------------------------------------------------------ the parts' fields, read-only
    @property
    def device(self) -> str:
        """"cpu" or "cuda" (the parsed Device is `dev`, its GPU `gpu_id`)."""
        return self.dev.type

    @property
    def spec(self) -> Output:
        """`output` by its other name (Output is also decode.spec.OutputSpec)."""
        return self.output

    @property
    def size(self):
        """The output side: an int for a square output, as given, else (h, w)."""
        h, w = self.output.size
        return h if h == w else (h, w)

    mean = property(lambda self: self.output.mean, doc="Output.mean.")
    std = property(lambda self: self.output.std, doc="Output.std.")
    dtype = property(lambda self: self.output.dtype, doc="Output.dtype.")
    layout = property(lambda self: self.output.layout, doc="Output.layout.")
    memory_format = property(lambda self: self.output.memory_format, doc="Output.memory_format.")
    scale = property(lambda self: getattr(self.augment, "scale", None), doc="TrainCrop.scale (None: evaluation).")
    ratio = property(lambda self: getattr(self.augment, "ratio", None), doc="TrainCrop.ratio (None: evaluation).")
    hflip = property(lambda self: getattr(self.augment, "hflip", None), doc="TrainCrop.hflip (None: evaluation).")
    crop_pct = property(lambda self: getattr(self.augment, "crop_pct", None), doc="EvalCrop.crop_pct (None: training).")
    split = property(lambda self: getattr(self.gpu, "split", None), doc="GPUOptions.split (None on the CPU).")
    hybrid = property(lambda self: getattr(self.gpu, "hybrid", None), doc="GPUOptions.hybrid (None on the CPU).")
    chroma = property(lambda self: getattr(self.gpu, "chroma", None), doc="GPUOptions.chroma (None on the CPU).")
    run_ahead = property(lambda self: getattr(self.gpu, "run_ahead", None),
                         doc="GPUOptions.run_ahead (None on the CPU).")
    same_pixels = property(lambda self: getattr(self.gpu, "same_pixels", None),
                           doc="GPUOptions.same_pixels (None on the CPU).")

    # ------------------------------------------------------------------ epoch bookkeeping
    def __len__(self) -> int:
        n = len(self._order)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    @property
    def epoch(self) -> int:
        """The epoch the Loader stands in: the one being iterated (or left unfinished, until the
        next iteration begins the following one), else the one the next iteration runs."""
        return self._pos[0]

    def set_epoch(self, epoch: int) -> None:
        """Run `epoch` at the next iteration (torch's `DistributedSampler.set_epoch`; Lightning
        calls it through `loader.sampler` at every epoch's start). Called inside a running loop,
        that loop finishes its own epoch and the next one runs `epoch`. After `load_state_dict`,
        the saved state's own epoch keeps its batch (a resume mid-epoch stays exact)."""
        epoch = bounded_int("epoch", epoch, 0, floats=False)
        self._generation += 1
        if not (self._resumed and epoch == self._pos[0]):
            self._pos, self._resumed = (epoch, 0), False
        self._open = False

    def _fingerprint_of_dataset(self) -> str:
        """The dataset's manifest fingerprint (`Dataset.fingerprint`): a state saved on one
        dataset names it, and another dataset refuses that state."""
        return self.ds.fingerprint

    def state_dict(self) -> dict:
        """Where the Loader stands: `epoch` and `batch` (batches of it already taken), with the
        settings a resume must share and the dataset's fingerprint. An epoch left early is saved
        where it was left: a Loader that loads the state resumes it there."""
        epoch, batch = self._pos
        return {"epoch": epoch, "batch": batch, "seed": self.seed, "rank": self.rank,
                "world_size": self.world_size, "batch_size": self.batch_size,
                "dataset": self._fingerprint_of_dataset()}

    def load_state_dict(self, state: dict) -> None:
        """Resume where `state` (from `state_dict()` of a loader with the same seed, rank,
        world_size and batch_size, on the same dataset) stood: the next iteration runs that
        epoch from that batch. Every field is checked first: BadState names a missing key, a
        value of the wrong type or out of range, another run's setting or another dataset
        (a state without `dataset`, from an older version, is taken on its other fields)."""
        if not isinstance(state, dict):
            raise BadState(f"state must be a dict from Loader.state_dict(), not {type(state).__name__}")
        missing = [k for k in ("epoch", "batch", "seed", "rank", "world_size", "batch_size") if k not in state]
        if missing:
            raise BadState(f"state_dict lacks {', '.join(repr(k) for k in missing)} (keys of Loader.state_dict())")
        for key, value in state.items():
            if key in ("epoch", "batch", "seed", "rank", "world_size", "batch_size") and \
                    (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0):
                raise BadState(f"state_dict {key}={value!r}: an integer ≥ 0 expected")
        for key in ("seed", "rank", "world_size", "batch_size"):
            if int(state[key]) != getattr(self, key):
                raise BadState(f"state_dict {key}={state[key]} does not match this loader's {getattr(self, key)}: "
                               "resume with the settings of the run that saved it")
        if "dataset" in state:
            mine = self._fingerprint_of_dataset()
            if not isinstance(state["dataset"], str) or state["dataset"] != mine:
                raise BadState(f"state_dict dataset={state['dataset']!r} was saved on another dataset than "
                               f"{self.ds.root} ({mine}): resume on the dataset the state was taken from")
        batches = len(self)
        if not 0 <= int(state["batch"]) <= batches:
            raise BadState(f"state_dict batch={state['batch']} is outside this loader's epoch of {batches} batches")
        self._generation += 1
        self._pos, self._open, self._resumed = (int(state["epoch"]), int(state["batch"])), False, True

    @property
    def padding(self) -> int:
        """Samples of this rank's epoch that are repeats (0 or 1): with drop_last=False the ranks'
        shares are padded to equal length as torch's DistributedSampler pads them, by wrapping
        around the epoch's order, and a padded sample is always the last one of this rank's
        last batch. To count every sample once in a distributed evaluation, leave out the last
        `padding` samples of the last batch (README: distributed evaluation)."""
        n, world = len(self.ds), self.world_size
        if self.drop_last or n % world == 0:
            return 0
        return 1 if self.rank >= n % world else 0

    def batch_ids(self, epoch: int) -> list:
        """The sample ids of each batch of `epoch` for this rank."""
        epoch = bounded_int("epoch", epoch, 0, floats=False)
        return epoch_batches(self._order, self.batch_size, self.drop_last, epoch)

    @property
    def ring(self):
        """The output ring (spills, free slots) — the GPU's OutputRing or the CPU's HostRing."""
        return self.batcher.ring

    # ------------------------------------------------------------------ not a Dataset
    _NOT_A_DATASET = ("the Loader is itself the data loader (batches made by its own threads): iterate it "
                      "directly, `for images, labels in loader`, not through torch.utils.data.DataLoader. For "
                      "DataLoader worker processes, give the DataLoader the Dataset instead: "
                      "DataLoader(recordtool.open(path), collate_fn=...) with the decoding in collate_fn "
                      "(README, Train: With PyTorch)")

    def __getitem__(self, index):
        """A DataLoader wrapping the Loader asks it for samples: say what to do instead."""
        raise NotADataset(f"Loader[{index!r}]: {self._NOT_A_DATASET}")

    def __reduce_ex__(self, protocol):
        """A Loader holds threads, native pools and its output ring: it does not cross into
        another process (a spawned DataLoader worker pickles its dataset); say what does."""
        raise NotADataset(f"a Loader cannot be pickled into another process: {self._NOT_A_DATASET}")

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> "EpochIterator":
        """One epoch's batches: the epoch the Loader stands at (`set_epoch`, `load_state_dict`),
        or, when the last iteration took batches of an epoch and left it early, the next epoch
        — an epoch is never repeated unless asked for."""
        if self._open:
            self._pos = (self._pos[0] + 1, 0)
        self._open, self._resumed = False, False
        self._generation += 1
        start = self._pos
        it = self._iterator() if self._iterator is not None else None
        stream = self._stream
        if stream is None or stream.closed or stream.position != start or (it is not None and not it.finished):
            self._stop()  # a new start: what the producers made ahead is not this
            stream = self._stream = BatchStream(  # kept before its producers start: one may run our __del__
                self.batcher, self._order, self.batch_size, self.drop_last, len(self), *start, launch=False,
                producers=self.producers, depth=self.prefetch, continuous=self.continuous,
                draws=self.batcher.recipe.draws, ahead=getattr(self.batcher, "announce", None))
            stream.launch()
        it = EpochIterator(self, stream, *start)
        self._iterator = weakref.ref(it)
        return it

    def _taken(self, generation: int, epoch: int, taken: int) -> None:
        """An iteration took `taken` batches of `epoch`: the Loader stands there, unless it was
        told another place since that iteration began (set_epoch, load_state_dict, a new one)."""
        if generation != self._generation:
            return
        if taken >= len(self):
            self._pos, self._open = (epoch + 1, 0), False
        else:
            self._pos, self._open = (epoch, taken), taken > 0

    def _stop(self) -> None:
        """Stop the producer threads (a new start and `del` do)."""
        if self._stream is not None:
            self._stream.close()
        self._stream = self._iterator = None

    def close(self) -> None:
        """Stop the producer threads and, for a dataset URL the Loader opened, its downloads
        and its cached shards (unmapped and unpinned, their fds closed: other processes'
        Loaders on the cache may evict them; a dataset collected with the Loader lets go of
        them too). A later iteration starts the producers and maps the shards again."""
        self._stop()
        if self._owns_ds and isinstance(self.ds, RemoteDataset):
            self.ds.close()

    def __del__(self):
        try:
            # a collection may run this on one of this Loader's own producers (a reference cycle): stop
            # the stream; leave the batcher, which that producer may be using mid-batch, to the collection
            # (the dataset is not closed here: a collection may run this on a thread inside one of
            # its locks; a dataset collected with the Loader lets go of its shards itself)
            on_producer = on_producer_thread()
            self._stop()
            if not on_producer:
                self.batcher.close()
        except Exception:
            pass


# the Loader's own keywords, for the did-you-mean of an unknown one (loader.config.parts)
_KEYWORDS = tuple(p for p in inspect.signature(Loader.__init__).parameters if p not in ("self", "shorthand"))

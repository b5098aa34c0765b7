"""`Loader`: the configuration of a training input pipeline; iterating it runs one epoch.

Composition (FFCV's shape): the Loader holds the settings, the dataset, the sampler and a
backend (decode.backend.Backend: the CPU's or the GPU's, from decode.device.make_backend, kept
across epochs; the loader itself is the same for both devices); `iter(loader)` gives an
`EpochIterator` over the epoch's share of a `BatchStream` — ordered producer threads that call
the backend and, by default, run on into the next epoch while this one's last batches are consumed (the next
`iter(loader)` takes up the stream where it stands; any other start begins a new one). A batch is
a pure function of (seed, epoch, rank, world_size, batch index), so `state_dict()` is just where
the epoch stands, and resuming yields exactly the batches an uninterrupted run would.

Not split: a fifth of the module is the Loader's documented parameters (every parameter a user
passes, with its default and why), and what remains is the state one object owns — where the
epoch stands, the rank's share, the stream it runs on — whose methods read and move it together;
the work itself is in epoch.py, stream.py, args.py and the backends.
"""
from __future__ import annotations

import inspect
import weakref
from typing import Literal, Union

import numpy as np

from ..checks import MAX_DECODE_THREADS, MAX_PRODUCERS, bounded_int, flag as _flag
from ..datasets import open_dataset
from ..decode.cpu import cores
from ..decode.device import RING_MEMORY_SHARE, make_backend, memory_bound, parse_device, resolve
from ..decode.recipe import Recipe
from ..decode.spec import EvalCrop, Output, TrainCrop
from ..errors import BadState, ConfigError, NotADataset, OnError, RecordtoolError, on_error as _on_error
from ..reader import Dataset
from .. import distributed
from ..remote import RemoteDataset
from .args import check_user_op, compiled_op
from .config import GPUOptions, RemoteOptions, fold as _fold, parts as _parts
from .prefetch import on_producer_thread
from .epoch import EpochIterator, LoaderSampler
from .stream import BatchStream, epoch_batches

DeviceLike = Union[Literal["cpu", "cuda"], str, int, object]  # also "cuda:1", torch.device, cupy Device


class Loader:
    """Iterate `(images, labels)` batches of a packed dataset, one epoch per iteration.

    The configuration comes in a few frozen parts, each checked once when it is made
    (loader.config): `Output` (what a batch looks like), `TrainCrop` / `EvalCrop` (the
    augmentation), `GPUOptions` (a cuda Loader's decoders), `RemoteOptions` (a dataset URL's
    store and cache). The parts are the documented form, and the Loader keeps them whole
    (`loader.output.size`, `loader.augment.scale`, `loader.gpu.split`). Their fields may also
    be given flat, as a shorthand (`size=224, dtype="bfloat16", split="gpu"`): one adapter
    (loader.config.fold) sorts them by part, and each is checked there; a part and one of its
    keywords together are a ConfigError, and so is an unknown keyword (naming the nearest
    known one).

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
        rank, world_size: this process's share; default from torch.distributed's process group,
            else RANK / WORLD_SIZE, else 0 and 1 — read when the Loader first needs its share
            (its first batch, `len()`, `state_dict()`), so a Loader made before the launcher's
            process group (Lightning's DDP, whose processes learn their rank in `fit()`) takes
            the group's; from its first batch on the Loader keeps it. One given alone must agree
            with the launcher's; both given are taken as they are, but a rank that contradicts the
            process group of that world size is refused. An environment with WORLD_SIZE and no
            RANK (or the reverse) and no process group is a ConfigError, never rank 0 (see
            recordtool.distributed).
        block_shards: `Dataset.sampler`'s — None: block shuffle for URLs, global permutation for local data.
        threads: CPU decode threads (default: cores), at most MAX_DECODE_THREADS (256), checked
            before any thread starts.
        producers: producer threads (default 2), at most MAX_PRODUCERS (32).
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

    Attributes: the parts as checked (`output`, `augment`, `gpu` — None on the CPU —, `remote`
    — None unless given —; their fields are read there: `loader.output.size`, a (h, w) pair),
    `train`, `device` ("cpu" or "cuda"; `dev` the parsed Device) and `gpu_id`.

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
            path, dev, train=train, output=output, augment=augment, gpu=gpu, remote=remote,
            flat=_fold(shorthand, _KEYWORDS))
        self.shuffle = self.train if shuffle is None else _flag(shuffle, "shuffle")
        self.drop_last = self.train if drop_last is None else _flag(drop_last, "drop_last")
        self.seed = bounded_int("seed", seed, 0, floats=False)
        self.prefetch = bounded_int("prefetch", prefetch, 1, floats=False)
        self.continuous = _flag(continuous, "continuous")
        self.threads = cores() if threads is None else bounded_int("threads", threads, 1, MAX_DECODE_THREADS,
                                                                   floats=False)
        # producer threads, batches dealt round-robin and handed out in order: two, so one's
        # Python work (and user op) overlaps the other's decode. More do not make the rate: on the
        # GPU each producer keeps one batch at the engines, so another one only splits the same
        # engines' time into more calls, and its Python work takes cores the training loop needs
        # (BENCHMARKS.md, "Producers and the hybrid decoder").
        self.producers = 2 if producers is None else bounded_int("producers", producers, 1, MAX_PRODUCERS, floats=False)
        self.on_error = _on_error(on_error)
        self.with_ids = _flag(with_ids, "with_ids")
        as_torch = None if as_torch is None else _flag(as_torch, "as_torch")
        self.user_op = user_op = check_user_op(user_op)  # before the dataset opens: a refused op costs no download
        self.gpu_id = resolve(dev) if dev.cuda else None
        self._owns_ds = not isinstance(path, Dataset)  # opened here: a URL's cached shards let go of by close()
        self.ds = path if isinstance(path, Dataset) else open_dataset(
            path, **({} if self.remote is None else self.remote.open_args()))
        # the placement (rank, world_size): the arguments as given, resolved against the launcher
        # when the share is needed (_share), fixed at the first batch (_fix)
        self._rank_arg = None if rank is None else bounded_int("rank", rank, 0, floats=False)
        self._world_arg = None if world_size is None else bounded_int("world_size", world_size, 1, floats=False)
        if self._rank_arg is not None and self._world_arg is not None and self._rank_arg >= self._world_arg:
            raise ConfigError(f"rank {self._rank_arg} not in [0, world_size={self._world_arg})")
        self._block_shards = block_shards
        self._placed = self._order = None  # the placement _order was made for, and this rank's order
        self._fixed = False  # the first batch (or load_state_dict) fixed the placement
        self.sampler = LoaderSampler(self)
        if self._rank_arg is not None and self._world_arg is not None or not distributed.pending():
            kind = self._share()  # the share now: a bad placement or batch size is refused at once
        else:  # a launcher's process that learns its rank later (Lightning's DDP before fit)
            kind = self._make_order(0, 1)
        planned = getattr(kind, "on_plan", None) is not None  # a remote dataset's cache plans each epoch
        if planned:  # and counts a record served once its view is taken: no continuous epochs, no lanes (GPUBackend)
            self.continuous = False
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
        self.last_split = None  # the last yielded batch's report (cuda: its BatchReport)
        self.stage_seconds, self.decoded = {}, {}  # producer-side s per stage, (cuda) images per decoder, summed
        # of decoded["cpu"]: GPU-bound images past the buffers' room, and decoded ahead (Backend.stats)
        self.overflow = self.ahead = 0
        recipe = Recipe(self.ds, self.output, self.seed, self.augment)
        # batches alive at once: queued (producers × prefetch), being made (producers), and the
        # consumer's current and previous one; each as large as the largest batch any rank makes
        # (the placement may be learnt later: a rank's share is at most the dataset)
        slots = self.producers * (self.prefetch + 1) + 2
        max_batch = max(1, min(self.batch_size, len(self.ds)))
        need, bound = slots * self.output.nbytes(max_batch), memory_bound(self.gpu_id)
        if need > bound:
            where = "RAM" if self.gpu_id is None else f"GPU {self.gpu_id}'s memory"
            h, w = self.output.size
            raise ConfigError(f"the output ring would take {need / 2**30:.1f} GiB ({slots} batches of {max_batch} "
                              f"{self.output.dtype} images of {h}×{w}), more than {RING_MEMORY_SHARE:.0%} of "
                              f"{where} ({bound / 2**30:.1f} GiB): lower batch_size, size, prefetch or producers")
        self.backend = make_backend(recipe, self.gpu_id, gpu=self.gpu, threads=self.threads, producers=self.producers,
                                    slots=slots, max_batch=max_batch, user_op=user_op,
                                    image_op=compiled_op(user_op, self.gpu_id), look_ahead=not planned)

    @property
    def device(self) -> str:
        """"cpu" or "cuda" (the parsed Device is `dev`, its GPU `gpu_id`)."""
        return self.dev.type

    # ------------------------------------------------------------------ placement (rank, world_size)
    @property
    def rank(self) -> int:
        """This process's rank (see `_share`: resolved until the first batch, then fixed)."""
        self._share()
        return self._placed[0]

    @property
    def world_size(self) -> int:
        """The processes sharing each epoch (see `rank`)."""
        self._share()
        return self._placed[1]

    def _share(self):
        """This rank's order (a Sampler or BlockSampler): for the placement the process has now
        (recordtool.distributed.resolve) until the first batch fixes it, then that one. Remade
        when the placement changed (a process group initialised since); ConfigError for an
        inconsistent placement, or one whose share has no batch."""
        if not self._fixed:
            where = distributed.resolve(self._rank_arg, self._world_arg)
            if where != self._placed:
                self._order, self._placed = self._make_order(*where), where
        return self._order

    def _make_order(self, rank: int, world_size: int):
        """The order of rank `rank` of `world_size`, checked: its share must hold a batch."""
        try:
            order = self.ds.sampler(seed=self.seed, rank=rank, world_size=world_size, drop_last=self.drop_last,
                                    shuffle=self.shuffle, block_shards=self._block_shards)
        except ValueError as e:
            if isinstance(e, RecordtoolError):
                raise
            raise ConfigError(f"{self.ds.root}: {e}") from None
        share = len(order)
        if self.drop_last and share < self.batch_size:
            raise ConfigError(f"batch_size {self.batch_size} is more than the {share} records of this rank's share "
                              f"of {self.ds.root} (rank {rank} of {world_size}): with drop_last every epoch would "
                              "have no batch; lower batch_size or pass drop_last=False")
        return order

    def _fix(self) -> None:
        """The placement is this Loader's from its first batch (or a loaded state) on: its epochs'
        shares must not change under it. A process group initialised afterwards that gives this
        process another place is a ConfigError (make the Loader after init_process_group)."""
        if not self._fixed:
            self._share()
            self._fixed = True
            return
        g = distributed.group()
        if g is None:
            return
        now = distributed.placement(self._rank_arg, self._world_arg, g, "torch.distributed's process group")
        if now != self._placed:
            raise ConfigError(f"this Loader made its batches as rank {self._placed[0]} of {self._placed[1]}, and "
                              f"torch.distributed's process group, initialised since, makes this process rank "
                              f"{now[0]} of {now[1]}: make the Loader after init_process_group, or draw no batch "
                              "from it before (with Lightning: none before fit)")

    # ------------------------------------------------------------------ epoch bookkeeping
    def __len__(self) -> int:
        n = len(self._share())
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    @property
    def epoch(self) -> int:
        """The epoch the Loader stands in: the one being iterated (or left unfinished, until the
        next iteration begins the following one), else the one the next iteration runs."""
        return self._pos[0]

    def _next_start(self) -> tuple:
        """(epoch, batch) an iteration whose first batch were drawn now would start at."""
        return (self._pos[0] + 1, 0) if self._open else self._pos

    def set_epoch(self, epoch: int) -> None:
        """Run `epoch` at the next iteration (torch's `DistributedSampler.set_epoch`; Lightning
        calls it through `loader.sampler` at every epoch's start, after making its iterator):
        an iterator that has drawn no batch yet runs `epoch`. Called inside a running loop, that
        loop finishes its own epoch and the next one runs `epoch`. After `load_state_dict`,
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
        self._share()  # the placement now (a ConfigError before any field is taken)
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
        self._fix()  # the state's batch counts in this placement's share
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
        return epoch_batches(self._share(), self.batch_size, self.drop_last, epoch)

    @property
    def ring(self):
        """The output ring (spills, free slots) — the GPU's OutputRing or the CPU's HostRing."""
        return self.backend.ring

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
        another process (a spawned DataLoader worker pickles its dataset, Lightning's
        strategy="ddp_spawn" its Trainer's loaders); say what does."""
        raise NotADataset(f"a Loader cannot be pickled into another process: {self._NOT_A_DATASET}. Under "
                          "Lightning, strategy=\"ddp_spawn\" pickles the loaders given to fit: use strategy=\"ddp\" "
                          "(each process runs the script and makes its own Loader; rank and world size come from "
                          "the process group fit initialises), or make the Loaders in a LightningDataModule's "
                          "train_dataloader() / val_dataloader()")

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> "EpochIterator":
        """One epoch's batches: the epoch the Loader stands at when the iterator's first batch
        is drawn (`set_epoch`, `load_state_dict`), or, when the last iteration took batches of
        an epoch and left it early, the next epoch — an epoch is never repeated unless asked
        for. Lightning makes its iterator first and then calls `set_epoch` (and, resuming,
        `load_state_dict`): `it = iter(loader); loader.set_epoch(2); list(it)` is epoch 2.
        The producers start here on where the Loader stands (`_prepare`); the first batch
        checks that place."""
        it = EpochIterator(self)
        self._prepare()
        return it

    def _prepare(self) -> None:
        """Start the producers on the batches an iteration beginning now would run, so that its
        first batches are under way before they are asked for — unless they already are (a
        continuous stream there), another iteration is running (its producers are stopped when
        the new one draws its first batch, not before), or this process's placement is not known
        yet. Nothing is decided here: `_begin` discards a stream that stands elsewhere."""
        last = self._iterator() if self._iterator is not None else None
        if last is not None and not last.finished:
            return
        try:
            order = self._share()
        except RecordtoolError:
            return  # raised at the first batch, where the caller asks for one
        start, stream = self._next_start(), self._stream
        if stream is None or stream.closed or stream.position != start or stream.order is not order:
            self._new_stream(start)

    def _new_stream(self, start: tuple) -> None:
        """A BatchStream from (epoch, batch) `start` for the current order, the old one stopped."""
        self._stop()  # a new start: what the producers made ahead is not this
        stream = self._stream = BatchStream(  # kept before its producers start: one may run our __del__
            self.backend.make, self._order, self.batch_size, self.drop_last, len(self), *start, launch=False,
            producers=self.producers, depth=self.prefetch, continuous=self.continuous, draws=self.backend.recipe.draws,
            ahead=self.backend.announce if self.backend.announces else None)
        stream.launch()

    def _begin(self, it: "EpochIterator") -> tuple:
        """`it` draws its first batch: (its BatchStream, epoch, first batch, generation). The
        placement and the place are fixed now; the stream is the one the producers run on where
        the Loader stands (from the last epoch, or started by iter()), else a new one."""
        self._fix()
        start = self._next_start()
        self._pos, self._open, self._resumed = start, False, False
        self._generation += 1
        last = self._iterator() if self._iterator is not None else None
        stream = self._stream
        if stream is None or stream.closed or stream.position != start or stream.order is not self._order \
                or (last is not None and not last.finished):
            self._new_stream(start)
        self._iterator = weakref.ref(it)
        return self._stream, start[0], start[1], self._generation

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
            # the stream; leave the backend, which that producer may be using mid-batch, to the collection
            # (the dataset is not closed here: a collection may run this on a thread inside one of
            # its locks; a dataset collected with the Loader lets go of its shards itself)
            on_producer = on_producer_thread()
            self._stop()
            if not on_producer:
                self.backend.close()
        except Exception:
            pass


# the Loader's own keywords, for the did-you-mean of an unknown one (loader.config.fold)
_KEYWORDS = tuple(p for p in inspect.signature(Loader.__init__).parameters if p not in ("self", "shorthand"))

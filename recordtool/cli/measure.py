"""`recordtool bench` (with `--train`) and `recordtool tune`: the measuring commands; their work is
recordtool/tools/'s."""
from __future__ import annotations

import json

import click

from .. import checks
from .options import BATCH, EPOCHS, Finite, Ints, SEED, THREADS, errors


@click.command()
@click.argument("root", type=click.Path(exists=True, file_okay=False))
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Decode on the CPU (native threads) or the GPU (NVJPG engines + CPU, auto split).")
@click.option("--batch-size", type=BATCH, default=256, show_default=True, help="Images per batch.")
@click.option("--threads", type=THREADS, default=None,
              help="CPU decode threads, and baseline processes (default: cores; with --train: --cores).")
@click.option("--epochs", type=EPOCHS, default=2, show_default=True, help="Loader epochs timed (the first warms up).")
@click.option("--images", type=click.IntRange(1), default=None,
              help="Use only this many records (default: all); the Loader runs whole epochs of about that many.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write all numbers here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of every pipeline's img/s side by side (needs matplotlib: pip install "
              "'recordtool[plot]').")
@click.option("--producers", type=THREADS, default=None, help="Loader producer threads (default: the Loader's).")
@click.option("--dali/--no-dali", default=True, show_default=True,
              help="Run NVIDIA DALI's pipeline on the same records when nvidia.dali imports.")
@click.option("--dali-files", type=click.Path(exists=True, file_okay=False), default=None,
              help="Also run DALI reading this ImageNet-style folder's JPEG files (the original files).")
@click.option("--baseline/--no-baseline", default=True, show_default=True, help="Run the Pillow baseline.")
@click.option("--train", "train_arch", default=None, metavar="ARCH",
              help="Train this torchvision model (resnet50, resnet18, …) with each pipeline instead: "
                   "synthetic, the Loader, DALI and torchvision on --dali-files (recordtool.tools.train_bench).")
@click.option("--steps", type=click.IntRange(1, 100000), default=50, show_default=True,
              help="--train: timed steps per run (after 15 warm-up steps).")
@click.option("--repeats", type=click.IntRange(1, 100), default=3, show_default=True,
              help="--train: runs of each pipeline, interleaved.")
@click.option("--pipelines", default="synthetic;recordtool;dali;torchvision", show_default=True,
              help="--train: ';'-separated; 'recordtool:split=gpu,producers=2' sets Loader options.")
@click.option("--compile", "compile_", is_flag=True, help="--train: torch.compile the model.")
@click.option("--cores", type=int, default=None,
              help="--train: pin the whole process to the first N cores it may use, a GPU's share of a node "
                   "(default: all); --threads follows.")
@click.option("--dali-load", default=None, metavar="LOADS",
              help="--train: DALI's hw_decoder_load, comma-separated, each its own pipeline 'dali:load=X'; the "
                   "ratio is against the best (default on cuda: 0.65,0.75,0.9,0.99).")
@click.option("--consumer-ms", type=Finite(0, 10000), default=60.0, show_default=True,
              help="--train with --device cpu: CPU milliseconds the consumer spends per batch (no model).")
@click.option("--op", type=click.Choice(["grayscale", "cutout", "jitter"]), default=None,
              help="Also run the Loader with this user op compiled (recordtool.ops, needs recordtool[numba]) and as "
                   "a batch op, and DALI with its own counterpart (fn.hsv, fn.erase, fn.color_twist).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@errors
def bench(root, device, batch_size, threads, epochs, images, json_path, plot_path, producers, dali, dali_files,
          baseline, op, train_arch, steps, repeats, pipelines, compile_, consumer_ms, cores, dali_load, quiet):
    """Measure read, the decode stage and the full Loader on ROOT, against DALI and Pillow.

    DALI (RandomResizedCrop → resize → flip → normalize; on cuda the best of hw_decoder_load
    0.65/0.75/0.9) and the Pillow baseline (decode + RandomResizedCrop + ToTensor, one process per
    thread) run on the same records, batch and threads in the same run; the table gives ratios.

    With --train ARCH: end-to-end training throughput instead — the model trained with synthetic
    data, the Loader, DALI and torchvision's DataLoader (the last two on --dali-files) in turn,
    each --repeats times; img/s, ratios to synthetic and DALI (at its best --dali-load), the host's
    wait per step, cores busy, the GPU memory the pipeline holds and the host's peak RSS, on --cores.
    """
    from ..tools import plots
    from ..tools.bench import run, table

    if train_arch is not None:
        from ..tools import train_bench

        if device == "cuda":
            train_bench.require_gpu()  # before any pipeline: one line, not each run's traceback
        names = [p for p in pipelines.split(";") if p]
        if dali_files is None:
            names = [p for p in names if p.partition(":")[0] not in ("dali", "torchvision")]
        res = train_bench.run(root, dali_files, train_arch, None, batch_size, steps, 15, repeats, names, threads,
                              device, compile_, consumer_ms, dali_load, log=lambda m: None if quiet else click.echo(m),
                              cores=cores)
        click.echo(train_bench.table(res))
        if json_path:
            train_bench.write_json(res, json_path)
        failed = res.all_failed()
        if failed:
            raise click.ClickException(failed)
        return

    if plot_path:
        plots.require()  # before the measurement, not after it
    r = run(root, device=device, batch_size=batch_size, threads=threads, epochs=epochs, images=images,
            progress=not quiet, dali=dali, dali_files=dali_files, baseline=baseline, producers=producers, op=op)
    click.echo(table(r))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(r, f, indent=1, default=str)
    if plot_path:
        plots.bench(r, plot_path)


@click.command()
@click.argument("src", type=click.Path(exists=True, file_okay=False))
@click.option("--images", type=click.IntRange(1), default=1000, show_default=True,
              help="Sample size, drawn with --seed.")
@click.option("--seed", type=SEED, default=0, show_default=True,
              help="Seed of the sample, the crop windows and loaders.")
@click.option("--sides", type=Ints(1, checks.MAX_SIDE), default=",".join(map(str, (256, 320, 384, 448, 512))),
              show_default=True,
              help="--max-side candidates, comma-separated.")
@click.option("--qualities", type=Ints(1, 100), default=",".join(map(str, (75, 85, 90, 95))), show_default=True,
              help="--quality candidates, comma-separated (each side is tried with each quality).")
@click.option("--min-psnr", type=Finite(0, 200), default=35.0, show_default=True,
              help="Recommend among candidates whose median crop PSNR against the originals is at least this (dB).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Loaders to time: auto = the CPU, and the GPU too when CuPy finds one.")
@click.option("--batch-size", type=BATCH, default=128, show_default=True, help="Loader batch size.")
@click.option("--epochs", type=EPOCHS, default=5, show_default=True,
              help="Loader epochs per candidate; the first warms up, the median of the others counts (their "
              "spread is shown and taken into account by the recommendation).")
@click.option("--threads", type=THREADS, default=None, help="Decode threads (default: cores).")
@click.option("--workers", type=THREADS, default=None, help="Pack workers (default 2×cores).")
@click.option("--work-dir", type=click.Path(file_okay=False), default=None,
              help="Where the temporary folder for the sample's packs is made (default: the system's temp dir).")
@click.option("--keep", is_flag=True, help="Keep the packs (their folder is printed) instead of removing them.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write all numbers here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of speed against fidelity, the recommended point marked (needs matplotlib: "
              "pip install 'recordtool[plot]').")
@click.option("--quiet", "-q", is_flag=True, help="No line per candidate.")
@errors
def tune(src, images, seed, sides, qualities, min_psnr, device, batch_size, epochs, threads, workers, work_dir, keep,
         json_path, plot_path, quiet):
    """Measure what --max-side / --quality buy on a sample of SRC (an ImageNet-style folder).

    Packs the sample as it is and with every side × quality candidate (in a temporary folder,
    removed afterwards), times the real Loader on each, and compares its 224² RandomResizedCrop
    outputs with Pillow's from the original files under the same windows (PSNR, SSIM). Prints
    a table and the fastest candidate within --min-psnr; `pack --preset` names measured settings.
    """
    from ..tools import plots
    from ..tools.tune import candidates, gpu_available, run
    from ..tools.tune_report import table

    if plot_path:
        plots.require()  # before the measurement, not after it
    cands = candidates(sides, qualities)
    if device == "cuda" and not gpu_available():
        raise click.UsageError("--device cuda: CuPy finds no GPU here")
    devices = ("cpu", "cuda") if device == "cuda" or (device == "auto" and gpu_available()) else ("cpu",)
    r = run(src, images=images, seed=seed, cands=cands, min_psnr=min_psnr, devices=devices,
            batch_size=batch_size, epochs=epochs, threads=threads, workers=workers, work_dir=work_dir,
            keep=keep, progress=not quiet)
    click.echo(table(r))
    if keep:
        click.echo(f"packs kept in {r['work_dir']}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(r, f, indent=1, default=str)
    if plot_path:
        plots.tune(r, plot_path)

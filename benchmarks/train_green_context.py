"""Training throughput with the Loader's producers in a CUDA green context.

`python -m recordtool.tools.train_bench` with one change: every producer thread the Loader
starts runs with a green context of all the device's SMs current (engines_beside_load.py's
`--context green`: cuGreenCtxCreate, CUDA >= 12.4), so the decoders' nvJPEG calls, streams and
buffers live in a CUDA context of their own instead of the one the model trains in. Beside a
free-running training loop (engines_beside_load.py) that context let the engines deliver more;
this measures whether training gains from it. A probe of the mechanism, not a mode of the
library. `--context primary` runs the same command unchanged, for an A/B in one call.

Usage (on a GPU machine; the other arguments are train_bench's):
  python benchmarks/train_green_context.py --context green /tmp/bench-packed --arch resnet18 --batch 512 \\
      --cores 16 --repeats 2 --steps 30 --warmup 10 --pipelines recordtool
"""
from __future__ import annotations

import argparse
import os
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", choices=("primary", "green"), default="green",
                    help="where the Loader's producers run their CUDA work")
    args, rest = ap.parse_known_args(argv)
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import engines_beside_load

    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the primary context made current first (cuGreenCtxCreate asks it)
    if args.context == "green":
        engines_beside_load.producers_in(*engines_beside_load.green_context())
    from recordtool.tools import train_bench

    return train_bench.main(rest)


if __name__ == "__main__":
    sys.exit(main())

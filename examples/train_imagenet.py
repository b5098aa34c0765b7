#!/usr/bin/env python3
"""Drop-in example: torchvision ResNet training step with AMP, fed by either loader.

  train_imagenet.py --loader torchvision --data IMAGEFOLDER   # ImageFolder + DataLoader
  train_imagenet.py --loader recordtool  --data PACKED [--device cuda|cpu]

Same model, optimizer, batch size and transforms (RandomResizedCrop 224 + flip + normalize);
reports img/s over the timed steps (after warm-up). One flag switches the input pipeline.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # an installed recordtool first


def torchvision_loader(root, batch, workers):
    from torchvision import datasets, transforms

    tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(),
                             transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    ds = datasets.ImageFolder(root, tf)
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, pin_memory=True,
                                       drop_last=True, persistent_workers=workers > 0)


def recordtool_loader(root, batch, device, threads):
    import recordtool

    output = recordtool.Output(size=224, dtype="float16" if device == "cuda" else "float32")
    return recordtool.Loader(root, batch_size=batch, device=device, output=output, threads=threads)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loader", choices=["torchvision", "recordtool"], required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    import torchvision

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = getattr(torchvision.models, a.arch)(num_classes=1000).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    scaler = torch.amp.GradScaler(enabled=dev.type == "cuda")
    if a.loader == "torchvision":
        loader = torchvision_loader(a.data, a.batch, a.workers)
    else:
        loader = recordtool_loader(a.data, a.batch, a.device, a.workers)
    step, seen, t0 = 0, 0, None
    epoch = 0
    while step < a.steps + a.warmup:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        for x, y in loader:
            x = x.to(dev, non_blocking=True).to(memory_format=torch.channels_last)
            y = y.to(dev, non_blocking=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16 if dev.type == "cpu" else torch.float16,
                                enabled=True):
                loss = torch.nn.functional.cross_entropy(model(x), y % 1000)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            step += 1
            if step == a.warmup:
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            elif step > a.warmup:
                seen += x.shape[0]
            if step >= a.steps + a.warmup:
                break
        epoch += 1
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(f"train_imagenet: loader={a.loader} arch={a.arch} batch={a.batch} steps={a.steps} "
          f"{seen / dt:,.0f} img/s (loss {loss.item():.3f})")


if __name__ == "__main__":
    main()

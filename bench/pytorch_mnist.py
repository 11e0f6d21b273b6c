#!/usr/bin/env python3
"""PyTorch baseline of the Fashion-MNIST job (apps/train_mnist --kvstore local --init torch).

BENCHMARKS.md's recipe: MLP 784-256-10 with ReLU (--model mlp) or 784-4096-4096-10 with ReLU
(--model mlp-wide, 20,037,642 parameters, issue 23's communication-heavy model), pixels / 255,
PyTorch's default initialisation (what train_mnist --init torch draws: weight and bias uniform in
+-1/sqrt(fan_in)), SGD lr 0.1 without momentum, batch 128 with the last partial batch dropped,
one thread. Prints one JSON line per epoch and a final one:

  {"bench":"pytorch_mnist","epoch":1,"train_loss":...,"train_acc":...,"test_acc":...,
   "samples_per_s":...,"time_s":...}
  {"bench":"pytorch_mnist","model":"mlp",...,"steps":...,"final_test_acc":...,"samples_per_s":...}

samples_per_s counts only the training loop (forward, backward, step), not evaluation or data
loading. --steps N caps each epoch at N steps (train_mnist's --max-batches), for timing a fixed
number of steps; "steps" in the final line is the total trained. The whole set lives in memory as tensors and batches are taken by indexing a seeded
permutation, as troupe's iterator does; torch's DataLoader would add per-sample Python overhead
and make the baseline slower than PyTorch needs to be.

  /usr/bin/python3 bench/pytorch_mnist.py --epochs 5 --seed 0 --threads 1
  /usr/bin/python3 bench/pytorch_mnist.py --model mlp-wide --epochs 1 --steps 50
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_data  # noqa: E402

mnist_data.rerun_with_a_better_blas_core()  # before torch loads OpenBLAS

import torch  # noqa: E402
from torch import nn  # noqa: E402

MODELS = ("mlp", "mlp-wide")


def make_model(name="mlp"):
    """The network of --model, with PyTorch's default initialisation (torch.manual_seed first)."""
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    if name == "mlp-wide":
        return nn.Sequential(nn.Linear(784, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                             nn.Linear(4096, 10))
    raise ValueError(f"unknown model {name!r}")


def parameter_count(model):
    return sum(p.numel() for p in model.parameters())


def evaluate(model, x, y, batch=1000):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return 100.0 * correct / x.shape[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=MODELS, default="mlp")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=0,
                        help="at most N steps per epoch (0: every full batch)")
    parser.add_argument("--data-dir", default=mnist_data.DEFAULT_DATA_DIR)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_x, train_y, test_x, test_y = (torch.from_numpy(a) for a in mnist_data.load(args.data_dir))
    model = make_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    order_gen = torch.Generator().manual_seed(args.seed)
    batches = train_x.shape[0] // args.batch_size  # drop_last
    if args.steps > 0:
        batches = min(batches, args.steps)

    total_samples, total_time = 0, 0.0
    test_acc = 0.0
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(train_x.shape[0], generator=order_gen)
        loss_sum, correct = 0.0, 0
        start = time.perf_counter()
        for b in range(batches):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            x, y = train_x[idx], train_y[idx]
            out = model(x)
            loss = loss_fn(out, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
            correct += (out.argmax(1) == y).sum().item()
        elapsed = time.perf_counter() - start
        samples = batches * args.batch_size
        total_samples += samples
        total_time += elapsed
        test_acc = evaluate(model, test_x, test_y)
        print(json.dumps({"bench": "pytorch_mnist", "epoch": epoch,
                          "train_loss": round(loss_sum / batches, 5),
                          "train_acc": round(100.0 * correct / samples, 3),
                          "test_acc": round(test_acc, 3),
                          "samples_per_s": round(samples / elapsed, 1),
                          "time_s": round(elapsed, 3)}), flush=True)
    print(json.dumps({"bench": "pytorch_mnist", "model": args.model,
                      "parameters": parameter_count(model), "threads": args.threads,
                      "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                      "steps": batches * args.epochs, "time_s": round(total_time, 3),
                      "final_test_acc": round(test_acc, 3),
                      "samples_per_s": round(total_samples / total_time, 1)}), flush=True)


if __name__ == "__main__":
    main()

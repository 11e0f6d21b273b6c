#!/usr/bin/env python3
"""PyTorch DistributedDataParallel baseline of the distributed Fashion-MNIST job
(troupe-launch -n 2 -s 1 -- apps/train_mnist --kvstore dist_sync --batch-size 64 --init torch).

The recipe of bench/pytorch_mnist.py (--model mlp: 784-256-10, or mlp-wide: 784-4096-4096-10,
ReLU, pixels / 255, PyTorch's default init, SGD lr 0.1, no momentum) over --world processes with
gloo: each process has one thread, a DistributedSampler shard and batch 64, so one step of 2
processes sees 128 samples in all; DDP averages the gradients of the per-process mean losses,
which is the single-process batch-128 update. Process rank 0 evaluates the whole test set after
each epoch and prints JSON lines:

  {"bench":"pytorch_ddp_mnist","epoch":1,"train_loss":...,"test_acc":...,"samples_per_s":...}
  {"bench":"pytorch_ddp_mnist","model":"mlp",...,"steps":...,"final_test_acc":...,
   "samples_per_s":...}

samples_per_s is global: samples trained by all processes over the slowest process's time in
the training loop (all start it after a barrier). --steps N caps each epoch at N steps per
process (train_mnist's --max-batches); "steps" in the final line is the total per process.

Two modes:

  # one machine: spawns --world processes rendezvousing on 127.0.0.1
  /usr/bin/python3 bench/pytorch_ddp_mnist.py --epochs 5 --seed 0
  /usr/bin/python3 bench/pytorch_ddp_mnist.py --model mlp-wide --epochs 1 --steps 50

  # one process per host (or network namespace): start this on every host, ranks 0..N-1, all
  # naming rank 0's address; --ifname (GLOO_SOCKET_IFNAME) picks the interface gloo's pairs use
  /usr/bin/python3 bench/pytorch_ddp_mnist.py --rank R --world N --master-addr 10.0.0.1 \
      --master-port 29500 [--ifname veth0] --model mlp-wide --epochs 1 --steps 50
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
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

import gloo_ranks  # noqa: E402
from pytorch_mnist import MODELS, evaluate, make_model, parameter_count  # noqa: E402


def train_sharded(bench, rank, world, args, data, model, optimizer, barrier, job_elapsed,
                  evaluated=None, extra=None):
    """The training loop of the distributed job, shared with bench/troupe_torch_mnist.py: each
    rank trains its DistributedSampler shard (seeded, reshuffled per epoch) with batch
    --batch-size and the mean loss; rank 0 evaluates `evaluated` (default: `model`) and prints the
    JSON lines of the module's docstring under the name `bench`, the final one with `extra`'s
    fields too. barrier() starts every epoch together; job_elapsed(seconds) is the epoch's time
    for the whole job (the slowest rank's)."""
    train_x, train_y, test_x, test_y = data
    evaluated = evaluated or model
    loss_fn = nn.CrossEntropyLoss()
    sampler = DistributedSampler(range(train_x.shape[0]), num_replicas=world, rank=rank,
                                 shuffle=True, seed=args.seed, drop_last=True)
    batches = len(sampler) // args.batch_size  # drop_last; equal on every rank
    if args.steps > 0:
        batches = min(batches, args.steps)

    total_samples, total_time, test_acc = 0, 0.0, 0.0
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)))
        loss_sum = 0.0
        barrier()
        start = time.perf_counter()
        for b in range(batches):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            x, y = train_x[idx], train_y[idx]
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
        elapsed = job_elapsed(time.perf_counter() - start)
        samples = batches * args.batch_size * world
        total_samples += samples
        total_time += elapsed
        if rank == 0:
            test_acc = evaluate(evaluated, test_x, test_y)
            print(json.dumps({"bench": bench, "epoch": epoch,
                              "train_loss": round(loss_sum / batches, 5),
                              "test_acc": round(test_acc, 3),
                              "samples_per_s": round(samples / elapsed, 1),
                              "time_s": round(elapsed, 3)}), flush=True)
    if rank == 0:
        print(json.dumps({"bench": bench, "model": args.model,
                          "parameters": parameter_count(evaluated), "world": world,
                          "threads_per_process": args.threads, "epochs": args.epochs,
                          "batch_size": args.batch_size, "lr": args.lr, **(extra or {}),
                          "steps": batches * args.epochs, "time_s": round(total_time, 3),
                          "final_test_acc": round(test_acc, 3),
                          "samples_per_s": round(total_samples / total_time, 1)}), flush=True)


def worker(rank, args, addr, port):
    torch.set_num_threads(args.threads)
    gloo_ranks.join(rank, args, addr, port)
    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP broadcasts anyway)
    data = tuple(torch.from_numpy(a) for a in mnist_data.load(args.data_dir))
    model = DistributedDataParallel(make_model(args.model), bucket_cap_mb=args.bucket_cap_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    def slowest(seconds):
        elapsed = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        return elapsed.item()

    train_sharded("pytorch_ddp_mnist", rank, args.world, args, data, model, optimizer,
                  dist.barrier, slowest, evaluated=model.module)
    # Every rank leaves together: a gloo rank that tears its group down while rank 0 still
    # evaluates was seen spinning a core for ever once rank 0 had gone (torch 1.13, 4 hosts).
    dist.barrier()
    dist.destroy_process_group()


def add_recipe_arguments(parser):
    """The flags of the job's recipe, which bench/troupe_torch_mnist.py takes too."""
    parser.add_argument("--model", choices=MODELS, default="mlp")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=0,
                        help="at most N steps per epoch on each process (0: every full batch)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="threads per process")
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--data-dir", default=mnist_data.DEFAULT_DATA_DIR)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_recipe_arguments(parser)
    gloo_ranks.add_arguments(parser)
    parser.add_argument("--bucket-cap-mb", type=float, default=25, help="DDP's gradient buckets")
    args = parser.parse_args()
    gloo_ranks.run(parser, args, worker)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PyTorch DistributedDataParallel baseline of the distributed Fashion-MNIST job
(troupe-launch -n 2 -s 1 -- apps/train_mnist --kvstore dist_sync --batch-size 64).

The recipe of bench/pytorch_mnist.py (MLP 784-256-10 ReLU, pixels / 255, default init, SGD lr
0.1, no momentum) over 2 processes on 127.0.0.1 with gloo: each process has one thread, a
DistributedSampler shard and batch 64, so one step sees 128 samples in all; DDP averages the
gradients of the per-process mean losses, which is the single-process batch-128 update. Process
rank 0 evaluates the whole test set after each epoch and prints JSON lines:

  {"bench":"pytorch_ddp_mnist","epoch":1,"train_loss":...,"test_acc":...,"samples_per_s":...}
  {"bench":"pytorch_ddp_mnist","final_test_acc":...,"samples_per_s":...}

samples_per_s is global: samples trained by all processes over the slowest process's time in
the training loop (both start it after a barrier).

  /usr/bin/python3 bench/pytorch_ddp_mnist.py --epochs 5 --seed 0
"""

import argparse
import datetime
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_data  # noqa: E402

mnist_data.rerun_with_a_better_blas_core()  # before torch loads OpenBLAS

import torch  # noqa: E402
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from pytorch_mnist import evaluate, make_model  # noqa: E402


def free_port():
    # The port is free when the script asks; gloo's store binds it a moment later. A race with
    # another program on the machine is possible but harmless for a benchmark (it then fails).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, args, port):
    torch.set_num_threads(args.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    # Bounded: a rank whose peer never arrives gives up instead of waiting (or spinning) forever.
    dist.init_process_group("gloo", rank=rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP broadcasts anyway)
    train_x, train_y, test_x, test_y = (torch.from_numpy(a) for a in mnist_data.load(args.data_dir))
    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    sampler = DistributedSampler(range(train_x.shape[0]), num_replicas=args.world, rank=rank,
                                 shuffle=True, seed=args.seed, drop_last=True)
    batches = len(sampler) // args.batch_size  # drop_last; equal on every rank

    total_samples, total_time, test_acc = 0, 0.0, 0.0
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)))
        loss_sum = 0.0
        dist.barrier()
        start = time.perf_counter()
        for b in range(batches):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            x, y = train_x[idx], train_y[idx]
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        elapsed = elapsed.item()
        samples = batches * args.batch_size * args.world
        total_samples += samples
        total_time += elapsed
        if rank == 0:
            test_acc = evaluate(model.module, test_x, test_y)
            print(json.dumps({"bench": "pytorch_ddp_mnist", "epoch": epoch,
                              "train_loss": round(loss_sum / batches, 5),
                              "test_acc": round(test_acc, 3),
                              "samples_per_s": round(samples / elapsed, 1),
                              "time_s": round(elapsed, 3)}), flush=True)
    if rank == 0:
        print(json.dumps({"bench": "pytorch_ddp_mnist", "world": args.world,
                          "threads_per_process": args.threads, "epochs": args.epochs,
                          "final_test_acc": round(test_acc, 3),
                          "samples_per_s": round(total_samples / total_time, 1)}), flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="threads per process")
    parser.add_argument("--world", type=int, default=2, help="processes")
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--data-dir", default=mnist_data.DEFAULT_DATA_DIR)
    args = parser.parse_args()
    mp.spawn(worker, args=(args, free_port()), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The distributed Fashion-MNIST job of bench/pytorch_ddp_mnist.py, trained through troupe.torch
(DistributedOptimizer) instead of DistributedDataParallel: run as each worker of a job,

  PYTHONPATH=build/python build/apps/troupe-launch -n 2 -s 1 -- \\
      /usr/bin/python3 bench/troupe_torch_mnist.py --epochs 1

The same recipe as the DDP baseline (bench/pytorch_mnist.py's --model, PyTorch's default init
from --seed, pixels / 255, SGD lr 0.1 without momentum, batch 64 per worker, the mean loss of each
worker's batch), and the same data order: each worker reads the shard of a DistributedSampler
seeded as DDP's. DistributedOptimizer pushes each gradient as backward makes it and averages the
workers' sums, which is DDP's update; with --update-on-kvstore the servers run the SGD. Worker 0
prints JSON lines as the DDP script does:

  {"bench":"troupe_torch_mnist","epoch":1,"train_loss":...,"test_acc":...,"samples_per_s":...}
  {"bench":"troupe_torch_mnist","model":"mlp",...,"steps":...,"final_test_acc":...,
   "samples_per_s":...}

samples_per_s is global: the samples of all workers over the training loop's time between two
barriers (so the slowest worker's). bench/run_train_bench.sh SETTINGS=torch runs it against DDP.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_data  # noqa: E402

mnist_data.rerun_with_a_better_blas_core()  # before torch loads OpenBLAS

import torch  # noqa: E402

import troupe.torch as tt  # noqa: E402
from pytorch_ddp_mnist import add_recipe_arguments, train_sharded  # noqa: E402
from pytorch_mnist import make_model  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_recipe_arguments(parser)
    parser.add_argument("--kvstore", default="dist_sync")
    parser.add_argument("--update-on-kvstore", action="store_true",
                        help="the servers run SGD (MXNet's update_on_kvstore)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    kv = tt.init(args.kvstore)
    torch.manual_seed(args.seed)
    data = tuple(torch.from_numpy(a) for a in mnist_data.load(args.data_dir))
    model = make_model(args.model)
    tt.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = tt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                        model.named_parameters(),
                                        update_on_kvstore=args.update_on_kvstore)

    def after_a_barrier(seconds):
        """The epoch's time until every worker has finished it."""
        start = time.perf_counter() - seconds
        kv.barrier()
        return time.perf_counter() - start

    train_sharded("troupe_torch_mnist", tt.rank(), tt.size(), args, data, model, optimizer,
                  kv.barrier, after_a_barrier,
                  extra={"update_on_kvstore": args.update_on_kvstore})
    kv.barrier()  # rank 0 evaluates while the others wait, then every worker leaves together
    tt.shutdown()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""gloo all_reduce microbenchmark: what DistributedDataParallel's collective costs on a link.

Each rank all_reduces (sum) a float32 tensor of --bytes bytes --reps times after --warmup
untimed calls; every timed call starts after a barrier, so the ranks enter it together. Rank 0
prints one JSON line per size:

  {"bench":"gloo_allreduce","world":2,"bytes":80150568,"reps":20,"median_ms":...,
   "min_ms":...,"max_ms":...,"slowest_rank_median_ms":...,"busbw_gb_s":...}

median_ms, min_ms and max_ms are over rank 0's calls; slowest_rank_median_ms is the largest of
the ranks' medians. busbw_gb_s is NCCL's "bus bandwidth" of a ring all-reduce,
2 (N-1)/N x bytes / median time (the bytes each rank sends and receives), 0 for one rank.
machine_cpu_s is the CPU-seconds the whole machine was busy over rank 0's timed calls, barriers
included (meaningful when the job is alone on the machine).
--bytes takes a comma-separated list (suffixes K, M, G: powers of 1024); the default includes
80150568, the float32 gradients of train_mnist --model mlp-wide (20,037,642 parameters).

  # one machine: spawns --world processes on 127.0.0.1
  /usr/bin/python3 bench/gloo_allreduce.py --world 2 --bytes 4K,1M,80150568 --reps 20

  # one process per host (or network namespace), ranks 0..N-1, all naming rank 0's address;
  # --ifname sets GLOO_SOCKET_IFNAME, the interface gloo's pairs use
  /usr/bin/python3 bench/gloo_allreduce.py --rank R --world N --master-addr 10.0.0.1 \\
      --master-port 29500 [--ifname veth0] --bytes 80150568 --reps 20
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gloo_ranks  # noqa: E402

MLP_WIDE_GRADIENT_BYTES = 20037642 * 4


def parse_bytes(text):
    sizes = []
    for part in text.split(","):
        part = part.strip().upper()
        scale = 1
        if part and part[-1] in "KMG":
            scale = 1024 ** ("KMG".index(part[-1]) + 1)
            part = part[:-1]
        size = int(float(part) * scale)
        if size < 4 or size % 4:
            raise argparse.ArgumentTypeError(f"{size} bytes is not a whole number of float32s")
        sizes.append(size)
    return sizes


def machine_busy_seconds():
    """CPU-seconds the whole machine has been busy (/proc/stat, all but idle and iowait), as
    bench/machine_cpu.hpp reads it; None where it cannot be read."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run(rank, args, addr, port):
    torch.set_num_threads(args.threads)
    gloo_ranks.join(rank, args, addr, port)
    for size in args.bytes:
        tensor = torch.ones(size // 4, dtype=torch.float32)
        for _ in range(args.warmup):
            dist.all_reduce(tensor)
        times = []
        busy_at_start = machine_busy_seconds()
        for _ in range(args.reps):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        busy_at_end = machine_busy_seconds()
        median = statistics.median(times)
        slowest = torch.tensor([median], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            factor = 2.0 * (args.world - 1) / args.world
            print(json.dumps({"bench": "gloo_allreduce", "world": args.world, "bytes": size,
                              "reps": args.reps, "median_ms": round(median * 1e3, 4),
                              "min_ms": round(min(times) * 1e3, 4),
                              "max_ms": round(max(times) * 1e3, 4),
                              "slowest_rank_median_ms": round(slowest.item() * 1e3, 4),
                              "busbw_gb_s": round(factor * size / median / 1e9, 4),
                              "machine_cpu_s": None if busy_at_start is None or busy_at_end is None
                              else round(busy_at_end - busy_at_start, 3)}),
                  flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bytes", type=parse_bytes,
                        default=parse_bytes(f"4K,64K,1M,16M,{MLP_WIDE_GRADIENT_BYTES}"),
                        help="comma-separated sizes in bytes (K, M, G suffixes)")
    parser.add_argument("--reps", type=int, default=20, help="timed calls per size")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per size")
    gloo_ranks.add_arguments(parser)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    args = parser.parse_args()
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    gloo_ranks.run(parser, args, run)


if __name__ == "__main__":
    main()

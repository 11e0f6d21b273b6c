#!/usr/bin/env python3
"""Apache MXNet 1.9.1's KVStore timed as bench/kvbench times troupe's, for bench/compare.sh.

MXNet is not a Debian package: it runs from a venv (python3 -m venv mx && mx/bin/pip install
mxnet==1.9.1 'numpy<1.24'). For each --sizes total (bytes, float32) spread evenly over each of
--keys keys, every worker inits the keys and then times --repeats calls of each of --ops after one
untimed call: push (of all keys), pull (of all keys into their outputs), pushpull (push then
pull, MXNet 1.9.1's dist store has no one-request pushpull), each followed by mx.nd.waitall().
No optimizer is set, so the servers store the sum of the pushes, as kvbench's jobs do. Rank 0
prints one JSON line per size, keys and op, with kvbench's fields:

  {"bench":"mxnet_kvbench","type":"dist_sync","op":"pushpull","bytes":16777216,"keys":1,
   "workers":1,"repeats":20,"median_us":...,"min_us":...,"max_us":...,"gbps":...}

gbps = payload bytes moved per second: push and pull count the size once, pushpull twice.

  # a dist_sync job on this machine: a scheduler, -s servers and -n workers on 127.0.0.1
  mx/bin/python bench/mxnet_kvbench.py --launch-local -n 1 -s 1 --sizes 4096,16777216 --keys 1
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mxnet_cluster  # noqa: E402


def int_list(text):
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kvstore", default="dist_sync", choices=["dist_sync", "dist_async"])
    parser.add_argument("--sizes", type=int_list, default=[4096, 16777216],
                        help="total bytes per measurement, comma-separated")
    parser.add_argument("--keys", type=int_list, default=[1],
                        help="numbers of keys the bytes are spread over, comma-separated")
    parser.add_argument("--ops", default="push,pull,pushpull")
    parser.add_argument("--repeats", type=int, default=20)
    mxnet_cluster.add_arguments(parser)
    return parser.parse_args()


def main():
    args = parse_args()
    if args.launch_local:
        sys.exit(mxnet_cluster.launch_local(__file__, args))
    mxnet_cluster.apply_role(args)
    os.environ.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")

    import mxnet as mx  # a scheduler or server serves in here and exits

    if os.environ.get("DMLC_ROLE", "worker") != "worker":
        return
    kv = mx.kv.create(args.kvstore)
    ops = [op for op in args.ops.split(",") if op]
    next_key = 0
    for size in args.sizes:
        for keys in args.keys:
            elements = max(1, size // 4 // keys)
            names = list(range(next_key, next_key + keys))
            next_key += keys
            values = [mx.nd.ones((elements,)) for _ in names]
            outs = [mx.nd.zeros((elements,)) for _ in names]
            kv.init(names, values)
            kv._barrier()
            calls = {
                "push": lambda: kv.push(names, values),
                "pull": lambda: kv.pull(names, out=outs),
                "pushpull": lambda: (kv.push(names, values), kv.pull(names, out=outs)),
            }
            for op in ops:
                times = []
                for r in range(args.repeats + 1):
                    start = time.perf_counter()
                    calls[op]()
                    mx.nd.waitall()
                    if r > 0:
                        times.append(time.perf_counter() - start)
                kv._barrier()
                if kv.rank != 0:
                    continue
                median = statistics.median(times)
                moved = elements * 4 * keys * (2 if op == "pushpull" else 1)
                print(json.dumps({
                    "bench": "mxnet_kvbench", "type": args.kvstore, "op": op,
                    "bytes": elements * 4 * keys, "keys": keys, "workers": kv.num_workers,
                    "repeats": args.repeats, "median_us": round(median * 1e6, 1),
                    "min_us": round(min(times) * 1e6, 1), "max_us": round(max(times) * 1e6, 1),
                    "gbps": round(moved / median / 1e9, 3)}), flush=True)


if __name__ == "__main__":
    main()

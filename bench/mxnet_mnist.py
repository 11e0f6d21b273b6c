#!/usr/bin/env python3
"""Apache MXNet 1.9.1 (Gluon) baseline of the Fashion-MNIST job: apps/train_mnist --init torch,
locally or as the workers of a dist_sync job with MXNet's own parameter servers (ps-lite).

MXNet is not a Debian package: it runs from a venv (here called mx):

  /usr/bin/python3 -m venv mx
  mx/bin/pip install mxnet==1.9.1 'numpy<1.24'

The recipe of bench/pytorch_mnist.py: --model mlp (784-256-10) or mlp-wide (784-4096-4096-10,
20,037,642 parameters), ReLU, pixels / 255 from the IDX files bench/mnist_data.py reads, SGD lr
0.1 without momentum, batch 128, one thread. --init torch (the default) gives every Dense
layer's weight and bias mx.init.Uniform(1/sqrt(fan_in)), exactly PyTorch's default law and
train_mnist --init torch's; --init xavier is MXNet's Xavier (uniform, magnitude 3, factor avg)
with zero biases, train_mnist's default.

With --kvstore dist_sync (or dist_async) worker r of n trains on part r of n of the training set
(MXNet's num_parts / part_index), every worker runs as many steps as the smallest part has full
batches (capped by --steps), the servers run the optimizer (Gluon's update_on_kvstore) and
trainer.step gets batch x workers, so n workers of batch b make the single-process batch n·b
update, as train_mnist's default --step-batch does. Rank 0 evaluates the test set after each
epoch and prints JSON lines:

  {"bench":"mxnet_mnist","epoch":1,"train_loss":...,"train_acc":...,"test_acc":...,
   "samples_per_s":...,"time_s":...}
  {"bench":"mxnet_mnist","model":"mlp",...,"steps":...,"final_test_acc":...,"samples_per_s":...}

samples_per_s counts the training loop only (after a barrier in a dist job) and, in a dist job,
every worker's samples over rank 0's loop time (dist_sync keeps the workers in step). "steps" is
the total per worker.

Three ways to run it:

  # one process, local store
  mx/bin/python bench/mxnet_mnist.py --model mlp-wide --epochs 1 --steps 50

  # a dist_sync job on this machine: a scheduler, -s servers and -n workers on 127.0.0.1
  mx/bin/python bench/mxnet_mnist.py --launch-local -n 2 -s 1 \\
      --kvstore dist_sync --batch-size 64 --model mlp-wide --epochs 1 --steps 50

  # one process per host (or network namespace): the same flags everywhere but --role and
  # --node-host/--interface, which are this process's address and the interface it has
  common="--root-uri 10.0.0.1 --root-port 9091 --num-workers 2 --num-servers 1"
  mxnet_mnist.py --role scheduler $common --node-host 10.0.0.1 --interface veth0   # on 10.0.0.1
  mxnet_mnist.py --role server    $common --node-host 10.0.0.2 --interface veth0
  mxnet_mnist.py --role worker    $common --node-host 10.0.0.3 --interface veth0 \\
      --kvstore dist_sync --batch-size 64 --model mlp-wide --epochs 1 --steps 50
  mxnet_mnist.py --role worker    $common --node-host 10.0.0.4 ...                    # likewise

The role flags only set MXNet's environment (DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT,
DMLC_NUM_WORKER, DMLC_NUM_SERVER, DMLC_NODE_HOST, DMLC_INTERFACE) before it is imported; a
process started with those variables set and no flags behaves the same. A scheduler or server
serves inside `import mxnet` and exits when the workers are done; only workers train.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_data  # noqa: E402
import mxnet_cluster  # noqa: E402

MODELS = {"mlp": [784, 256, 10], "mlp-wide": [784, 4096, 4096, 10]}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--init", choices=["torch", "xavier"], default="torch")
    parser.add_argument("--kvstore", default="local",
                        choices=["local", "device", "dist_sync", "dist_async"])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0,
                        help="at most N steps per epoch on each worker (0: every full batch)")
    parser.add_argument("--batch-size", type=int, default=128, help="per worker")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP/OpenBLAS threads (MXNET_CPU_WORKER_NTHREADS stays 1)")
    parser.add_argument("--data-dir", default=mnist_data.DEFAULT_DATA_DIR)
    mxnet_cluster.add_arguments(parser)
    return parser.parse_args()


def main():
    args = parse_args()
    if args.launch_local:
        if not args.kvstore.startswith("dist"):
            sys.exit("--launch-local needs --kvstore dist_sync or dist_async")
        sys.exit(mxnet_cluster.launch_local(__file__, args))
    mxnet_cluster.apply_role(args)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    os.environ.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")
    # The same OpenBLAS kernels as the other baselines (bench/mnist_data.py), before MXNet loads.
    mnist_data.rerun_with_a_better_blas_core()

    import mxnet as mx  # a scheduler or server serves in here and exits
    from mxnet import autograd, gluon

    role = os.environ.get("DMLC_ROLE", "worker")
    if role != "worker":  # not reached with MXNet 1.9.1, which exits inside the import
        return
    mx.random.seed(args.seed)
    kv = mx.kv.create(args.kvstore)
    rank, workers = kv.rank, kv.num_workers

    widths = MODELS[args.model]
    net = gluon.nn.HybridSequential()
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        if args.init == "torch":  # PyTorch's nn.Linear: weight and bias in +-1/sqrt(fan_in)
            bound = 1.0 / fan_in ** 0.5
            weight_init, bias_init = mx.init.Uniform(bound), mx.init.Uniform(bound)
        else:
            weight_init = mx.init.Xavier(rnd_type="uniform", factor_type="avg", magnitude=3)
            bias_init = mx.init.Zero()
        last = i == len(widths) - 2
        net.add(gluon.nn.Dense(fan_out, activation=None if last else "relu", in_units=fan_in,
                               weight_initializer=weight_init, bias_initializer=bias_init))
    net.initialize()
    parameters = sum(int(p.data().size) for p in net.collect_params().values())

    train_x, train_y, test_x, test_y = mnist_data.load(args.data_dir)
    bounds = [len(train_x) * r // workers for r in range(workers + 1)]
    part = np.arange(bounds[rank], bounds[rank + 1])
    steps = min(bounds[r + 1] - bounds[r] for r in range(workers)) // args.batch_size
    if args.steps > 0:
        steps = min(steps, args.steps)
    train_x_nd = mx.nd.array(train_x)
    train_y_nd = mx.nd.array(train_y.astype(np.float32))
    test_x_nd = mx.nd.array(test_x)

    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": args.lr},
                            kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    step_batch = args.batch_size * workers
    rng = np.random.default_rng(args.seed + rank)
    dist = args.kvstore.startswith("dist")

    total_samples, total_time, test_acc = 0, 0.0, 0.0
    for epoch in range(1, args.epochs + 1):
        order = mx.nd.array(rng.permutation(part).astype(np.float32))
        loss_sum, correct = 0.0, 0
        if dist:
            kv._barrier()
        start = time.perf_counter()
        for b in range(steps):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            x, y = mx.nd.take(train_x_nd, idx), mx.nd.take(train_y_nd, idx)
            with autograd.record():
                out = net(x)
                loss = loss_fn(out, y)
            loss.backward()
            trainer.step(step_batch)
            loss_sum += loss.mean().asscalar()
            correct += int((out.argmax(axis=1) == y).sum().asscalar())
        mx.nd.waitall()
        elapsed = time.perf_counter() - start
        samples = steps * args.batch_size * workers
        total_samples += samples
        total_time += elapsed
        if rank == 0:
            predicted = np.concatenate([net(test_x_nd[i:i + 1000]).argmax(axis=1).asnumpy()
                                        for i in range(0, len(test_x), 1000)])
            test_acc = 100.0 * float((predicted == test_y).mean())
            print(json.dumps({"bench": "mxnet_mnist", "epoch": epoch,
                              "train_loss": round(loss_sum / steps, 5),
                              "train_acc": round(100.0 * correct / (steps * args.batch_size), 3),
                              "test_acc": round(test_acc, 3),
                              "samples_per_s": round(samples / elapsed, 1),
                              "time_s": round(elapsed, 3)}), flush=True)
    if rank == 0:
        print(json.dumps({"bench": "mxnet_mnist", "mxnet": mx.__version__, "model": args.model,
                          "init": args.init, "parameters": parameters, "kvstore": args.kvstore,
                          "workers": workers, "threads": args.threads, "epochs": args.epochs,
                          "batch_size": args.batch_size, "step_batch": step_batch,
                          "lr": args.lr, "steps": steps * args.epochs,
                          "time_s": round(total_time, 3), "final_test_acc": round(test_acc, 3),
                          "samples_per_s": round(total_samples / total_time, 1)}), flush=True)


if __name__ == "__main__":
    main()

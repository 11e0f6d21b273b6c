#!/usr/bin/env python3
"""Fashion-MNIST with PyTorch's autograd and troupe's parameter servers (docs/python.md).

    build/apps/troupe-launch -n 2 -s 1 -- /usr/bin/python3 examples/python/train_fashion_mnist.py

(with PYTHONPATH=build/python, or troupe installed by `pip install .`). The job of
apps/train_mnist.cpp, in Python: the same MLP (--model mlp: 784-256-10, or mlp-wide:
784-4096-4096-10 with 20,037,642 parameters; ReLU; Xavier's uniform weights and zero biases as
train_mnist's default --init xavier, or --init torch: PyTorch's default law, train_mnist --init
torch), the same data (Debian's dataset-fashion-mnist), SGD with learning rate 0.1 run on the
servers (MXNet's update_on_kvstore: set_optimizer), each worker on its part of the training set
with batch 64, the gradients of the workers summed and rescaled by 1/(64 * workers). PyTorch
computes the gradients; each step pushes them and pulls the updated parameters straight into the
model's tensors (pushpull, no copies). Rank 0 prints after each epoch

    epoch 1: train_loss 0.6446 train_acc 0.7802 test_acc 0.8232 samples_per_s 53123 time_s 1.1

and every worker ends with

    worker 0 of 2: final test_acc 0.8232, parameters sha256 7faf35f8...

where the digest covers every parameter's bytes, equal on all workers of a dist_sync job.
--kvstore local trains in one process; --max-batches N caps each epoch at N steps.
"""

import argparse
import gzip
import hashlib
import os
import struct
import time

import numpy as np
import torch

import troupe


def read_idx(path):
    """An IDX file (plain or gzip) as a NumPy array of its shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, type_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or type_code != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load(data_dir, prefix):
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0)
    return x, torch.from_numpy(labels.astype(np.int64))


def make_model(name, init, seed):
    torch.manual_seed(seed)
    widths = {"mlp": [784, 256, 10], "mlp-wide": [784, 4096, 4096, 10]}[name]
    layers = []
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])  # no ReLU after the last layer
    if init == "xavier":
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                torch.nn.init.xavier_uniform_(layer.weight)  # MXNet's Xavier: uniform, magnitude 3
                torch.nn.init.zeros_(layer.bias)
    # init "torch": nn.Linear's own, uniform in +-1/sqrt(fan_in) for weight and bias
    return model


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kvstore", default="dist_sync")
    parser.add_argument("--model", choices=["mlp", "mlp-wide"], default="mlp")
    parser.add_argument("--init", choices=["xavier", "torch"], default="xavier")
    parser.add_argument("--max-batches", type=int, default=0,
                        help="at most N steps per epoch (0: every full batch)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="per worker")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core per worker: the job's processes share the machine

    kv = troupe.kv.create(args.kvstore)
    rank, workers = kv.rank, kv.num_workers
    train_x, train_y = load(args.data_dir, "train")
    test_x, test_y = load(args.data_dir, "t10k")
    # Worker r reads part r of `workers` (MXNet's part_index / num_parts), and every worker runs
    # as many steps as the smallest part has full batches, so that no sync round waits for a
    # worker that has finished.
    bounds = [len(train_x) * r // workers for r in range(workers + 1)]
    part = np.arange(bounds[rank], bounds[rank + 1])
    steps = min(bounds[r + 1] - bounds[r] for r in range(workers)) // args.batch_size
    if args.max_batches > 0:
        steps = min(steps, args.max_batches)

    model = make_model(args.model, args.init, args.seed)
    names = [name for name, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    # Rank 0's initial values go to the servers; every worker then pulls them into its model.
    kv.init(names, params)
    kv.set_optimizer("sgd", learning_rate=args.lr,
                     rescale_grad=1.0 / (args.batch_size * workers))
    kv.pull(names, out=params)
    for p in params:
        p.grad = torch.zeros_like(p)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")

    rng = np.random.default_rng(args.seed + rank)
    for epoch in range(1, args.epochs + 1):
        start = time.monotonic()
        order = torch.from_numpy(rng.permutation(part))
        loss_sum, correct = 0.0, 0
        for step in range(steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            x, y = train_x[batch], train_y[batch]
            for p in params:
                p.grad.zero_()
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            # The servers sum the workers' gradients and run SGD; the new parameters are
            # written into the model's own tensors.
            kv.pushpull(names, [p.grad for p in params], out=params)
            loss_sum += loss.item()
            correct += (out.argmax(dim=1) == y).sum().item()
        seconds = time.monotonic() - start
        samples = steps * args.batch_size
        if rank == 0:
            print(f"epoch {epoch}: train_loss {loss_sum / samples:.4f} "
                  f"train_acc {correct / samples:.4f} "
                  f"test_acc {accuracy(model, test_x, test_y):.4f} "
                  f"samples_per_s {samples * workers / seconds:.0f} time_s {seconds:.1f}",
                  flush=True)
        kv.barrier()

    kv.pull(names, out=params)
    digest = hashlib.sha256()
    for p in params:
        digest.update(p.detach().numpy().tobytes())
    print(f"worker {rank} of {workers}: final test_acc {accuracy(model, test_x, test_y):.4f}, "
          f"parameters sha256 {digest.hexdigest()}", flush=True)
    kv.close()


if __name__ == "__main__":
    main()

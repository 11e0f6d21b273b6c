#!/usr/bin/env python3
"""Fashion-MNIST with PyTorch's autograd and troupe's parameter servers (docs/python.md).

    build/apps/troupe-launch -n 2 -s 1 -- /usr/bin/python3 examples/python/train_fashion_mnist.py

(with PYTHONPATH=build/python, or troupe installed by `pip install .`). The job of
apps/train_mnist.cpp, in Python: the same MLP (--model mlp: 784-256-10, or mlp-wide:
784-4096-4096-10 with 20,037,642 parameters; ReLU; Xavier's uniform weights and zero biases as
train_mnist's default --init xavier, or --init torch: PyTorch's default law, train_mnist --init
torch), the same data (Debian's dataset-fashion-mnist), SGD with learning rate 0.1, each worker on
its part of the training set with batch 64 and the mean loss of its batch.

troupe.torch's DistributedOptimizer wraps torch.optim.SGD, as BytePS's does: each gradient is
pushed as soon as backward has made it, the last layer's first while backward goes on with the
earlier ones (whose pushes carry the higher priority: the next forward needs them first), and
optimizer.step() waits for the sums, averages them over the workers and runs SGD here. With
--update-on-kvstore the servers run SGD instead (MXNet's update_on_kvstore) and step() writes the
updated weights into the model. Either way one step of 2 workers is the update of one batch of
128. Rank 0 prints after each epoch

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

import troupe.torch as tt


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
    parser.add_argument("--update-on-kvstore", action="store_true",
                        help="the servers run SGD (MXNet's update_on_kvstore)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core per worker: the job's processes share the machine

    kv = tt.init(args.kvstore)
    rank, workers = tt.rank(), tt.size()
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
    params = list(model.parameters())
    # Every worker starts from rank 0's parameters.
    tt.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = tt.DistributedOptimizer(torch.optim.SGD(params, lr=args.lr),
                                        model.named_parameters(),
                                        update_on_kvstore=args.update_on_kvstore)
    loss_fn = torch.nn.CrossEntropyLoss()

    rng = np.random.default_rng(args.seed + rank)
    for epoch in range(1, args.epochs + 1):
        start = time.monotonic()
        order = torch.from_numpy(rng.permutation(part))
        loss_sum, correct = 0.0, 0
        for step in range(steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            x, y = train_x[batch], train_y[batch]
            optimizer.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()  # pushes each gradient as it is made
            optimizer.step()  # waits for the sums, averages them, runs SGD
            loss_sum += loss.item() * len(batch)
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

    digest = hashlib.sha256()
    for p in params:
        digest.update(p.detach().numpy().tobytes())
    print(f"worker {rank} of {workers}: final test_acc {accuracy(model, test_x, test_y):.4f}, "
          f"parameters sha256 {digest.hexdigest()}", flush=True)
    tt.shutdown()


if __name__ == "__main__":
    main()

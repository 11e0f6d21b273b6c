"""A worker of a dist_sync job of 2 workers, checking troupe.torch against the plain pushpull loop
it replaces:

    troupe-launch -n 2 -s 1 -- python3 tests/python/torch_worker.py

Each check raises (and so fails the worker, and the job) when it does not hold; the last line is
"torch_worker R of N: ok". Without PyTorch the worker exits 77 (CTest: skipped).

  - broadcast_parameters from root 1 and from root 0: every worker ends with the root's values
    (each worker builds the root's model itself, from the root's seed, to compare);
  - broadcast_optimizer_state of SGD from root 1 and of Adam from root 0: the other worker's fresh
    optimizer (another learning rate, no state) ends with the root's state, bit for bit;
  - DistributedOptimizer (SGD with momentum, gradients averaged) gives, after STEPS steps on each
    worker's own data, bit for bit the parameters of the plain loop (kv.pushpull of every
    gradient after backward, torch.div by the workers, the same SGD): the same operations on the
    same values, and a sum of two gradients does not depend on their order. The pushes start
    during backward: after loss.backward() a request is under way for every parameter;
  - with update_on_kvstore=True (SGD on the servers) the same, against the loop of
    examples/python/train_fashion_mnist.py (kv.pushpull of the gradients out= the parameters).
"""

import sys

try:
    import torch
except ImportError:
    print("SKIP: this interpreter cannot import torch (python3-torch)", flush=True)
    sys.exit(77)

import troupe
import troupe.torch as tt

STEPS = 5
LR = 0.1
MOMENTUM = 0.9
BATCH = 64


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def batch(rank, step):
    """Worker `rank`'s data of `step`: the same in both runs."""
    generator = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.rand(BATCH, 784, generator=generator)
    y = torch.randint(0, 10, (BATCH,), generator=generator)
    return x, y


def loss_of(model, rank, step):
    x, y = batch(rank, step)
    return torch.nn.functional.cross_entropy(model(x), y)


def assert_equal_tensors(actual, expected, what):
    for (name, a), b in zip(actual, expected):
        if not torch.equal(a, b):
            difference = (a - b).abs().max().item()
            raise AssertionError(f"{what}: {name} differs, by at most {difference}")


def check_broadcasts(kv, rank):
    for root in (1, 0):
        model = make_model(seed=10 + rank)  # different on each worker
        tt.broadcast_parameters(model.state_dict(), root_rank=root, kvstore=kv)
        expected = make_model(seed=10 + root).state_dict().values()
        assert_equal_tensors(model.state_dict().items(), expected,
                             f"broadcast_parameters from root {root}")

    def stepped_optimizer(kind, root):
        """The root's optimizer: one step made its state (SGD's momentum buffers; Adam's moments
        and its step count, a 0-d tensor)."""
        model = make_model(seed=20)
        extra = {"momentum": MOMENTUM} if kind is torch.optim.SGD else {}
        optimizer = kind(model.parameters(), lr=LR, **extra)
        loss_of(model, root, 0).backward()
        optimizer.step()
        return optimizer

    for kind, root in ((torch.optim.SGD, 1), (torch.optim.Adam, 0)):
        if rank == root:
            optimizer = stepped_optimizer(kind, root)
        else:  # fresh: no state, another learning rate
            optimizer = kind(make_model(seed=20).parameters(), lr=0.5)
        tt.broadcast_optimizer_state(optimizer, root_rank=root, kvstore=kv)
        state, expected = optimizer.state_dict(), stepped_optimizer(kind, root).state_dict()
        what = f"broadcast_optimizer_state of {kind.__name__} from root {root}"
        assert state["param_groups"] == expected["param_groups"], (what, state["param_groups"])
        assert sorted(state["state"]) == sorted(expected["state"]), (what, sorted(state["state"]))
        for index, entry in expected["state"].items():
            for name, value in entry.items():
                assert torch.equal(state["state"][index][name], value), (what, index, name)


def train_plain(kv, rank, workers, on_servers):
    """The loop troupe.torch replaces: keys "plain.<name>" (or "plain-servers.<name>")."""
    model = make_model(seed=0)
    named = list(model.named_parameters())
    params = [p for _, p in named]
    keys = [("plain-servers." if on_servers else "plain.") + name for name, _ in named]
    optimizer = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    if on_servers:
        kv.init(keys, params)
        kv.pull(keys, out=params)
    else:
        sums = [torch.zeros_like(p) for p in params]
        kv.init(keys, sums)
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, rank, step).backward()
        if on_servers:  # the store's SGD (set by the DistributedOptimizer before) updates
            kv.pushpull(keys, [p.grad for p in params], out=params)
            continue
        kv.pushpull(keys, [p.grad for p in params], out=sums)
        for p, summed in zip(params, sums):
            torch.div(summed, workers, out=p.grad)
        optimizer.step()
    return named


def train_distributed(kv, rank, on_servers):
    model = make_model(seed=0)
    optimizer = tt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM), model.named_parameters(),
        kvstore=kv, update_on_kvstore=on_servers,
        key_prefix="servers." if on_servers else "workers.")
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, rank, step).backward()
        under_way = len(optimizer._requests)
        assert under_way == 4, f"after backward {under_way} of 4 gradients are under way"
        optimizer.step()
    return list(model.named_parameters())


def main():
    kv = tt.init("dist_sync")
    rank, workers = tt.rank(), tt.size()
    assert workers == 2, workers
    torch.set_num_threads(1)

    check_broadcasts(kv, rank)

    distributed = train_distributed(kv, rank, on_servers=False)
    plain = train_plain(kv, rank, workers, on_servers=False)
    assert_equal_tensors(distributed, [p for _, p in plain], "DistributedOptimizer (averaged)")
    start = make_model(seed=0)
    moved = sum((a - b).abs().sum().item() for (_, a), b in zip(plain, start.parameters()))
    assert moved > 0, "the parameters did not change in training"  # the comparison means something

    # The servers run SGD from here on, for every key of the store.
    distributed = train_distributed(kv, rank, on_servers=True)
    plain = train_plain(kv, rank, workers, on_servers=True)
    assert_equal_tensors(distributed, [p for _, p in plain],
                         "DistributedOptimizer (on the servers)")

    try:
        tt.broadcast_parameters(make_model(seed=0).state_dict(), root_rank=1, kvstore=kv)
        raise AssertionError("a broadcast from root 1 through a store running SGD did not raise")
    except ValueError as error:
        assert "optimizer on the servers" in str(error), str(error)

    kv.barrier()
    tt.shutdown()
    print(f"torch_worker {rank} of {workers}: ok", flush=True)


if __name__ == "__main__":
    main()

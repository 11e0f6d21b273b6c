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
    examples/python/train_fashion_mnist.py (kv.pushpull of the gradients out= the parameters);
  - an embedding with sparse gradients (torch.nn.Embedding(sparse=True), named in sparse_names):
    only the rows a batch used are pushed, and the parameters after STEPS steps of plain SGD are
    bit for bit those of the plain loop pushing the same gradients dense, with the sums on the
    workers and with SGD on the servers (lazy there: plain SGD moves no unused row either).
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


class PlainLoop:
    """The reduction troupe.torch replaces, for the parameters `named` under keys prefix + name:
    kv.pushpull of the gradients, then their average into .grad (the optimizer steps after), or
    with on_servers out= the parameters (the store's SGD, set by a DistributedOptimizer before,
    updates them)."""

    def __init__(self, kv, prefix, named, on_servers):
        self.kv = kv
        self.params = [p for _, p in named]
        self.keys = [prefix + name for name, _ in named]
        self.on_servers = on_servers
        if on_servers:
            kv.init(self.keys, self.params)
            kv.pull(self.keys, out=self.params)
        else:
            self.sums = [torch.zeros_like(p) for p in self.params]
            kv.init(self.keys, self.sums)

    def reduce(self, grads, workers):
        """True when the optimizer must step."""
        if self.on_servers:
            self.kv.pushpull(self.keys, grads, out=self.params)
            return False
        self.kv.pushpull(self.keys, grads, out=self.sums)
        for p, summed in zip(self.params, self.sums):
            p.grad = torch.div(summed, workers)
        return True


def train_plain(kv, rank, workers, on_servers):
    """The loop troupe.torch replaces: keys "plain.<name>" (or "plain-servers.<name>")."""
    model = make_model(seed=0)
    named = list(model.named_parameters())
    params = [p for _, p in named]
    loop = PlainLoop(kv, "plain-servers." if on_servers else "plain.", named, on_servers)
    optimizer = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, rank, step).backward()
        if loop.reduce([p.grad for p in params], workers):
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


VOCABULARY = 300


def make_embedding_model(seed, sparse):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(VOCABULARY, 8, sparse=sparse),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 8, 10))


def embedding_loss(model, rank, step):
    generator = torch.Generator().manual_seed(5000 + 1000 * rank + step)
    words = torch.randint(0, VOCABULARY // 3, (BATCH, 4), generator=generator)
    y = torch.randint(0, 10, (BATCH,), generator=generator)
    return torch.nn.functional.cross_entropy(model(words), y)


def train_embedding(kv, rank, workers, sparse, on_servers):
    """STEPS steps of plain SGD on a model whose embedding has sparse gradients: troupe.torch
    pushing their rows (sparse), or the plain loop pushing them dense; keys under their own
    prefix."""
    model = make_embedding_model(seed=3, sparse=True)
    named = list(model.named_parameters())
    params = [p for _, p in named]
    prefix = f"embedding-{sparse}-{on_servers}."
    if sparse:
        optimizer = tt.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=LR), model.named_parameters(), kvstore=kv,
            update_on_kvstore=on_servers, key_prefix=prefix, sparse_names=["0.weight"])
    else:
        optimizer = torch.optim.SGD(params, lr=LR)
        loop = PlainLoop(kv, prefix, named, on_servers)
    for step in range(STEPS):
        # set_to_none: a gradient that backward writes into a zeroed dense one sums its repeated
        # rows in another order than coalesce() does, in the last bit.
        optimizer.zero_grad(set_to_none=True)
        embedding_loss(model, rank, step).backward()
        if sparse:
            grad = params[0].grad
            assert grad.is_sparse and grad.coalesce().indices().shape[1] < VOCABULARY // 3 + 1
            optimizer.step()
            continue
        grads = [p.grad.coalesce().to_dense() if p.grad.is_sparse else p.grad for p in params]
        if loop.reduce(grads, workers):
            optimizer.step()
    return named


def check_sparse_embeddings(kv, rank, workers, on_servers):
    sparse = train_embedding(kv, rank, workers, True, on_servers)
    dense = train_embedding(kv, rank, workers, False, on_servers)
    assert_equal_tensors(sparse, [p for _, p in dense],
                         f"sparse embedding (update_on_kvstore={on_servers})")
    table = sparse[0][1]
    start = make_embedding_model(seed=3, sparse=True)[0].weight
    unused = table[VOCABULARY // 3:]
    assert torch.equal(unused, start[VOCABULARY // 3:]), "rows no batch used moved"
    assert not torch.equal(table, start), "the embedding did not change in training"


def main():
    kv = tt.init("dist_sync")
    rank, workers = tt.rank(), tt.size()
    assert workers == 2, workers
    torch.set_num_threads(1)

    check_broadcasts(kv, rank)

    check_sparse_embeddings(kv, rank, workers, on_servers=False)

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
    check_sparse_embeddings(kv, rank, workers, on_servers=True)

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

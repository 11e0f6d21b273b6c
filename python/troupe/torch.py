"""troupe.torch: data-parallel PyTorch training on troupe's parameter servers, in BytePS's style.

    import troupe.torch as tt

    kv = tt.init("dist_sync")                     # in a worker started by troupe-launch
    model = ...
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = tt.DistributedOptimizer(optimizer, model.named_parameters())
    tt.broadcast_parameters(model.state_dict(), root_rank=0)
    tt.broadcast_optimizer_state(optimizer, root_rank=0)
    for x, y in batches:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()           # each gradient is pushed as autograd makes it
        optimizer.step()                          # waits for the summed gradients, then steps

DistributedOptimizer registers a hook on every parameter's gradient accumulator: as soon as
backward has written a parameter's gradient it is pushed and the key's sum pulled back
(pushpull_async), with priority -index in the order of named_parameters (MXNet's rule: the first
layers, which the next forward needs first, come back first), while backward goes on with the
earlier layers. step() waits for the pulls, divides the sums by the number of workers (average=
True, BytePS's and DDP's rule: the learning rate of a single-process recipe carries over) or
keeps them (average=False, MXNet's rule), writes them into the parameters' .grad and runs the
wrapped optimizer. With update_on_kvstore=True the servers run the optimizer instead (MXNet's
update_on_kvstore: set_optimizer) and step() writes the pulled weights into the parameters.

Sparse gradients (torch.nn.Embedding(sparse=True), named in sparse_names=): the key is a row_sparse
key and only the rows a batch used are pushed; the sum comes back as MXNet's Trainer brings it
back across machines, whole (row_sparse_pull of every row: the rows the other workers pushed are
not known here), and becomes the parameter's sparse .grad (its non-zero rows), or with
update_on_kvstore the servers update only the pushed rows (lazy_update) and the weight comes back.

Keys are "<key_prefix><parameter name>" (str keys: a store used by troupe.torch holds no int
keys). Every tensor is passed to the store as it lies (a zero-copy NumPy view): a gradient must
not change from its push until step() (zero_grad() in between raises), and CPU tensors only.

Importable only with PyTorch installed (python3-torch); see docs/python.md.
"""

import json
import weakref

try:
    import torch
except ImportError as missing:
    raise ImportError(
        "troupe.torch needs PyTorch, which this interpreter cannot import "
        f"({missing}); install python3-torch (Debian) or torch (pip), or use troupe.kv "
        "directly") from missing

import numpy as np

import troupe.kv

__all__ = ["init", "shutdown", "rank", "size", "DistributedOptimizer", "broadcast_parameters",
           "broadcast_optimizer_state"]

_store = None  # the store init() made: the default of every call's kvstore=None
_server_optimizer_stores = weakref.WeakSet()  # stores whose pushes run an optimizer we set
_broadcasts = weakref.WeakKeyDictionary()  # store -> broadcasts made on it (their keys' number)


def init(type="dist_sync"):
    """Creates the store of this process (troupe.kv.create(type)) that the calls below use when
    given no kvstore=, and returns it; again, returns the same store."""
    global _store
    if _store is None:
        _store = troupe.kv.create(type)
    elif _store.type != type:
        raise ValueError(f"troupe.torch.init({type!r}): this process's store is already a "
                         f"{_store.type!r}")
    return _store


def shutdown():
    """Closes the store of init() (the worker leaves its job)."""
    global _store
    if _store is not None:
        _store.close()
        _store = None


def _resolve(kvstore):
    if kvstore is not None:
        return kvstore
    if _store is None:
        raise ValueError("no store: call troupe.torch.init() first, or pass kvstore=")
    return _store


def rank(kvstore=None):
    """This worker's rank in the job of the store."""
    return _resolve(kvstore).rank


def size(kvstore=None):
    """The job's number of workers."""
    return _resolve(kvstore).num_workers


# ---------------------------------------------------------------------------------------------
# DistributedOptimizer


def _server_optimizer_of(optimizer):
    """troupe's name and parameters of the optimizer the servers run for `optimizer`: SGD only
    (troupe's sgd is MXNet's, which updates as torch.optim.SGD does, up to rounding, while the
    learning rate stays constant); for any other, server_optimizer= names it."""
    if not isinstance(optimizer, torch.optim.SGD):
        raise ValueError(
            f"update_on_kvstore=True runs the optimizer on the servers, and troupe translates "
            f"only torch.optim.SGD; for a {type(optimizer).__name__} pass "
            "server_optimizer=(name, params), e.g. ('adam', {'learning_rate': 1e-3}), with "
            "MXNet's names (docs/python.md)")
    settings = set()
    for group in optimizer.param_groups:
        if group.get("dampening", 0) != 0 or group.get("nesterov") or group.get("maximize"):
            raise ValueError("update_on_kvstore=True: SGD with dampening, nesterov or maximize "
                             "has no counterpart on the servers; pass server_optimizer=")
        settings.add((group["lr"], group.get("momentum", 0), group.get("weight_decay", 0)))
    if len(settings) != 1:
        raise ValueError(f"update_on_kvstore=True: the servers run one optimizer for every key, "
                         f"and the parameter groups differ: (lr, momentum, weight_decay) "
                         f"{sorted(settings)}")
    lr, momentum, wd = settings.pop()
    return "sgd", {"learning_rate": lr, "momentum": momentum, "wd": wd}


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods DistributedOptimizer adds to (or replaces in) the class of the optimizer it
    wraps (BytePS's construction: the result is still a torch.optim.SGD, an Adam...)."""

    def __init__(self, params, named_parameters, kvstore, update_on_kvstore, average,
                 backward_passes_per_step, key_prefix, server_optimizer, sparse_names):
        super(self.__class__, self).__init__(params)
        self._kv = _resolve(kvstore)
        self._update_on_kvstore = update_on_kvstore
        self._average = average
        self._passes = backward_passes_per_step
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step is {backward_passes_per_step}; at least 1")

        in_groups = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is None:
            named = [(f"param.{i}", p) for i, p in enumerate(in_groups)]
        else:
            named = [(name, p) for name, p in named_parameters]
        names = [name for name, _ in named]
        if len(set(names)) != len(names):
            repeated = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"named_parameters repeats the names {repeated}")
        known = {id(p) for p in in_groups}
        strangers = [name for name, p in named if id(p) not in known]
        if strangers:
            raise ValueError(f"named_parameters has parameters the optimizer does not update: "
                             f"{strangers}")
        if len(named) != len(in_groups):
            raise ValueError(f"the optimizer updates {len(in_groups)} parameters, and "
                             f"named_parameters names {len(named)}: name them all")

        elsewhere = [name for name, p in named if p.device.type != "cpu"]
        if elsewhere:
            raise ValueError(f"troupe.torch takes CPU tensors, and these parameters are not on "
                             f"the CPU: {elsewhere}")
        # In named_parameters' order, which is the model's order of definition: index i gets
        # priority -i, so the first layers' values come back first.
        self._ordered = [p for _, p in named if p.requires_grad]
        self._keys = {p: key_prefix + name for name, p in named}
        sparse_names = set(sparse_names or ())
        unknown = sorted(sparse_names - set(names))
        if unknown:
            raise ValueError(f"sparse_names names parameters that named_parameters does not: "
                             f"{unknown}")
        self._sparse = {p for name, p in named if name in sparse_names and p.requires_grad}
        flat = [name for name, p in named if p in self._sparse and p.dim() == 0]
        if flat:
            raise ValueError(f"sparse_names: a sparse gradient has rows, and these parameters "
                             f"are scalars: {flat}")
        self._priority = {p: -i for i, p in enumerate(self._ordered)}
        self._requests = {}
        self._passes_left = {p: self._passes for p in self._ordered}
        dense = [p for p in self._ordered if p not in self._sparse]
        keys = [self._keys[p] for p in dense]
        if update_on_kvstore:  # refused before the store is touched
            name, hyper = server_optimizer or _server_optimizer_of(self)
            hyper = dict(hyper)
            hyper.setdefault("rescale_grad", 1.0 / self._kv.num_workers if average else 1.0)
        with torch.no_grad():
            if update_on_kvstore:
                # The servers hold the weights (rank 0's) and update them; the pulled weights
                # land here before step() writes them into the parameters.
                self._received = [p.detach().clone(memory_format=torch.contiguous_format)
                                  for p in dense]
                self._kv.init(keys, self._received)
                for p in self._sparse:
                    self._kv.init(self._keys[p], troupe.kv.row_sparse_array(
                        p.detach().contiguous().numpy()))
                self._kv.set_optimizer(name, **hyper)
                _server_optimizer_stores.add(self._kv)
                self._kv.pull(keys, out=self._received)
                for p, weight in zip(dense, self._received):
                    p.copy_(weight)
                for p in self._sparse:
                    p.copy_(self._pull_every_row(p))
            else:
                # The servers hold each key's last sum of gradients.
                self._received = [torch.zeros_like(p, memory_format=torch.contiguous_format)
                                  for p in dense]
                self._kv.init(keys, self._received)
                for p in self._sparse:
                    self._kv.init(self._keys[p], self._no_rows(p))
        self._received = dict(zip(dense, self._received))
        # The module reaches a tensor through tensor.detach().numpy() on every call; NumPy views
        # made once (of the buffers) or here in Python (of the gradients) cost less per call.
        self._received_views = {p: received.numpy() for p, received in self._received.items()}

        self._grad_accumulators = []  # the hooks live as long as their accumulators
        self._hooks = []
        for p in self._ordered:
            if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
                self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))
            else:
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                self._hooks.append(accumulator.register_hook(self._make_hook(p)))
                self._grad_accumulators.append(accumulator)

    def _make_hook(self, p):
        def hook(*_):
            if p in self._requests:
                raise RuntimeError(
                    f"the gradient of {self._keys[p]!r} was computed more than "
                    f"backward_passes_per_step={self._passes} times before step(): raise "
                    "backward_passes_per_step to accumulate gradients locally")
            self._passes_left[p] -= 1
            if self._passes_left[p] == 0:
                self._requests[p] = self._start(p)

        return hook

    @staticmethod
    def _no_rows(p):
        return troupe.kv.RowSparseArray(tuple(p.shape), p.detach().numpy().dtype.name)

    def _pull_every_row(self, p):
        """The key's whole value (row_sparse_pull of every row), as a tensor of p's shape."""
        out = self._no_rows(p)
        self._kv.row_sparse_pull(self._keys[p], out=out, row_ids=np.arange(p.shape[0]),
                                 priority=self._priority[p])
        return torch.from_numpy(out.asnumpy())

    def _push_rows(self, p):
        """Pushes the rows of p's sparse gradient (none when this step did not use p: every
        worker pushes every key in a round); row_sparse pushes are not asynchronous."""
        grad = p.grad
        if grad is None:
            rows = self._no_rows(p)
        elif not grad.is_sparse:
            raise RuntimeError(f"the gradient of {self._keys[p]!r} is dense, and sparse_names "
                               "names it: drop it from sparse_names, or make the module's "
                               "gradient sparse (torch.nn.Embedding(sparse=True))")
        else:
            grad = grad.coalesce()  # sorted unique rows, repeats summed
            if grad.sparse_dim() != 1:
                raise RuntimeError(f"the sparse gradient of {self._keys[p]!r} has "
                                   f"{grad.sparse_dim()} sparse dimensions; troupe pushes rows "
                                   "(sparse_dim 1, as torch.nn.Embedding(sparse=True) makes)")
            rows = troupe.kv.row_sparse_array(
                (grad.values().detach().contiguous().numpy(), grad.indices()[0].numpy()),
                shape=tuple(p.shape))
        self._kv.push(self._keys[p], rows, priority=self._priority[p])
        return None

    def _start(self, p):
        if p in self._sparse:
            return self._push_rows(p)
        grad = p.grad
        if grad is None:  # a parameter this step did not use: its share of the sum is zero
            grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        elif grad.is_sparse:
            raise RuntimeError(f"the gradient of {self._keys[p]!r} is sparse; name the "
                               "parameter in DistributedOptimizer's sparse_names= to push its rows")
        elif not grad.is_contiguous():
            grad = grad.contiguous()  # the Request holds the copy (through its NumPy view)
        return self._kv.pushpull_async(self._keys[p], grad.detach().numpy(),
                                       out=self._received_views[p], priority=self._priority[p])

    def synchronize(self):
        """Pushes what the hooks have not (parameters this step did not use), waits for every
        pull, and writes the results: the gradients (the sums, divided by the number of workers
        with average=True) into each parameter's .grad, or with update_on_kvstore the weights
        into the parameters. step() calls it."""
        for p in self._ordered:
            if p not in self._requests:
                self._requests[p] = self._start(p)
        workers = self._kv.num_workers
        try:
            with torch.no_grad():
                for p in self._ordered:
                    if p in self._sparse:
                        summed = self._pull_every_row(p)
                        if self._update_on_kvstore:
                            p.copy_(summed)
                            continue
                        if self._average:
                            summed = torch.div(summed, workers)
                        p.grad = summed.to_sparse(1)  # its non-zero rows
                        continue
                    self._requests[p].wait()
                    received = self._received[p]
                    if self._update_on_kvstore:
                        p.copy_(received)
                        continue
                    if p.grad is None:
                        p.grad = torch.empty_like(p)
                    if self._average:
                        torch.div(received, workers, out=p.grad)
                    else:
                        p.grad.copy_(received)
        finally:
            self._requests.clear()
            self._passes_left = {p: self._passes for p in self._ordered}

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("troupe.torch's DistributedOptimizer.step() takes no closure: the "
                             "gradients come from the backward before it")
        self.synchronize()
        if self._update_on_kvstore:
            return None  # the servers ran the optimizer
        return super(self.__class__, self).step()

    def zero_grad(self, *args, **kwargs):
        if self._requests:
            raise RuntimeError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(): the gradients being pushed would "
                "change under troupe")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, kvstore=None, update_on_kvstore=False,
                         average=True, backward_passes_per_step=1, key_prefix="",
                         server_optimizer=None, sparse_names=None):
    """An optimizer of the class of `optimizer`, over its parameter groups and hyper-parameters
    (its state is not carried over: broadcast_optimizer_state after loading a checkpoint), that
    sums every gradient over the job's workers through `kvstore` (default: init()'s store).

    named_parameters: (name, parameter) pairs of every parameter `optimizer` updates, in the
    model's order (model.named_parameters()); names make the keys, the order the priorities.
    Every worker must give the same names. Without it the keys are "param.<i>" in the order of
    the parameter groups.
    update_on_kvstore: the servers run the optimizer (torch.optim.SGD is translated to troupe's
    sgd, or server_optimizer=(name, params) with MXNet's names); the local optimizer's step and
    learning-rate changes then have no effect on the weights.
    average: divide the sums by the number of workers (BytePS, DDP); False keeps the sums (MXNet).
    backward_passes_per_step: backward passes accumulated locally before a gradient is pushed.
    sparse_names: names (of named_parameters) of parameters whose gradients are sparse rows
    (torch.nn.Embedding(sparse=True)): [n + ".weight" for n, m in model.named_modules() if
    isinstance(m, torch.nn.Embedding) and m.sparse]. Their keys are row_sparse: only the rows a
    batch used are pushed (see the module's docstring for what comes back).

    The store must not run an optimizer of its own unless update_on_kvstore (its keys would be
    updated instead of summed), and every worker of a dist_sync job must step together.
    """
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, kvstore, update_on_kvstore, average,
               backward_passes_per_step, key_prefix, server_optimizer, sparse_names)


# ---------------------------------------------------------------------------------------------
# Broadcasts


def _broadcast(kv, tensors, root_rank, label):
    """Every tensor (contiguous CPU, written in place) takes root_rank's value; a collective: each
    worker calls it with tensors of the same shapes in the same order. Keys
    "troupe.torch.broadcast.<n>.<label>.<i>", new for every call, hold the values on the servers."""
    workers = kv.num_workers
    if not 0 <= root_rank < workers:
        raise ValueError(f"root_rank {root_rank} is not a worker of this job: 0..{workers - 1}")
    if not tensors:
        return
    number = _broadcasts.get(kv, 0)
    _broadcasts[kv] = number + 1
    keys = [f"troupe.torch.broadcast.{number}.{label}.{i}" for i in range(len(tensors))]
    if root_rank == 0:
        kv.broadcast(keys, tensors, out=tensors)  # init keeps rank 0's values
        return
    # Another root: every worker pushes, the root its values and the others -0.0, which adds
    # nothing to any value (x + -0.0 is x, -0.0 included), and a sync round's sum replaces the
    # stored value. This needs the sum: no optimizer, and a round of every worker.
    if kv in _server_optimizer_stores:
        raise ValueError(f"root_rank {root_rank}: the store runs an optimizer on the servers "
                         "(update_on_kvstore), which would update the broadcast values; "
                         "broadcast from root_rank=0, or before DistributedOptimizer")
    if "sync" not in kv.type:
        raise ValueError(f"root_rank {root_rank} needs a sync store (a {kv.type!r} store "
                         "applies each push alone); broadcast from root_rank=0")
    kv.init(keys, tensors)
    mine = tensors if kv.rank == root_rank else [torch.full_like(t, -0.0) for t in tensors]
    kv.pushpull(keys, mine, out=tensors)


def broadcast_parameters(params, root_rank=0, kvstore=None):
    """Writes root_rank's values into every worker's tensors, in place: `params` is a state_dict
    (model.state_dict(): parameters and buffers) or (name, tensor) pairs
    (model.named_parameters()). Every worker calls it with the same names and shapes."""
    kv = _resolve(kvstore)
    items = sorted(params.items()) if isinstance(params, dict) else list(params)
    targets = []
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {name!r} is a {type(tensor).__name__}, "
                            "not a tensor")
        if not tensor.is_contiguous():
            raise ValueError(f"broadcast_parameters: {name!r} is not contiguous: troupe writes "
                             "into it in place")
        targets.append(tensor.detach())
    with torch.no_grad():
        _broadcast(kv, targets, root_rank, "params")


def _encode(value, tensors, path):
    """A JSON-able description of an optimizer's state_dict with its tensors numbered into
    `tensors`; every node is tagged so that decoding restores ints, tuples and dict keys."""
    if isinstance(value, torch.Tensor):
        tensors.append(value.detach().contiguous())
        return {"tensor": len(tensors) - 1, "dtype": str(value.dtype).replace("torch.", ""),
                "shape": list(value.shape)}
    if isinstance(value, dict):
        return {"dict": [[_encode(k, tensors, path), _encode(v, tensors, f"{path}[{k!r}]")]
                         for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_encode(v, tensors, f"{path}[{i}]")
                                       for i, v in enumerate(value)]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(f"broadcast_optimizer_state: {path} is a {type(value).__name__}, which it "
                    "cannot send (tensors, numbers, strings, lists, tuples and dicts)")


def _decode(node, tensors):
    if "tensor" in node:
        return tensors[node["tensor"]]
    if "dict" in node:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in node["dict"]}
    if "list" in node:
        return [_decode(v, tensors) for v in node["list"]]
    if "tuple" in node:
        return tuple(_decode(v, tensors) for v in node["tuple"])
    return node["value"]


# The dtypes troupe carries (the description names them; anything else is refused).
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
           "int32": torch.int32, "int64": torch.int64}


def _tensor_specs(node, specs):
    """(index, dtype, shape) of every tensor in an encoded description."""
    if "tensor" in node:
        if node["dtype"] not in _DTYPES:
            raise ValueError(f"broadcast_optimizer_state: a state tensor of dtype "
                             f"{node['dtype']!r}, which troupe does not carry "
                             f"({', '.join(_DTYPES)})")
        specs.append((node["tensor"], _DTYPES[node["dtype"]], node["shape"]))
    for key in ("dict", "list", "tuple"):
        for child in node.get(key, []):
            for item in (child if key == "dict" else [child]):
                _tensor_specs(item, specs)
    return specs


def broadcast_optimizer_state(optimizer, root_rank=0, kvstore=None):
    """Gives every worker's optimizer root_rank's state (optimizer.state_dict(): the momentum
    buffers, Adam's moments and steps, the groups' hyper-parameters), e.g. after root_rank alone
    loaded a checkpoint. The other workers' optimizers load it with load_state_dict, so they must
    have the same parameter groups. A collective: every worker calls it."""
    kv = _resolve(kvstore)
    root = kv.rank == root_rank
    tensors = []
    if root:
        description = json.dumps(_encode(optimizer.state_dict(), tensors, "state_dict"))
        raw = description.encode()
        words = np.frombuffer(raw + b"\0" * (-len(raw) % 8), dtype=np.int64).copy()
        length = np.array([len(raw)], np.int64)
    else:
        length = np.zeros(1, np.int64)
    # First the description's length, then the description, then the tensors it names.
    _broadcast(kv, [torch.from_numpy(length)], root_rank, "state_length")
    if not root:
        words = np.zeros((int(length[0]) + 7) // 8, np.int64)
    _broadcast(kv, [torch.from_numpy(words)], root_rank, "state_description")
    if root:
        return _broadcast(kv, tensors, root_rank, "state_tensors")
    description = json.loads(words.tobytes()[:int(length[0])].decode())
    specs = sorted(_tensor_specs(description, []))
    tensors = [torch.empty(shape, dtype=dtype) for _, dtype, shape in specs]
    _broadcast(kv, tensors, root_rank, "state_tensors")
    optimizer.load_state_dict(_decode(description, tensors))

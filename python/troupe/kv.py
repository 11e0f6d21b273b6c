"""troupe.kv: the KVStore (MXNet's mx.kv), on NumPy arrays and PyTorch CPU tensors in place.

create(type) returns a KVStore; its calls take a key (int or str) or a list of keys, and an
array, a list of arrays (one key's values, summed) or a list of those (one per key). Arrays are
never copied: push reads them where they lie, pull writes into them. Every failure raises
troupe.Error, whose .code names its kind ("unknown_key", "shape_mismatch", ...).

push_async, pull_async and pushpull_async start the same work without waiting and return a
Request: request.wait() blocks (without the GIL) until it is done and raises its troupe.Error, if
any; request.done() says whether it is. The arrays given belong to the request until wait()
returns: a push's values must not change, a pull's outputs must not be read or written.

row_sparse_array(dense) or row_sparse_array((data, indices), shape=(rows, ...)) makes a
RowSparseArray (MXNet's RowSparseNDArray); a key initialised with one takes pushes of them and is
read with row_sparse_pull(key, out=RowSparseArray(shape), row_ids=ids).
"""

from troupe._troupe import Error, KVStore, Request, RowSparseArray, create, row_sparse_array

__all__ = ["Error", "KVStore", "Request", "RowSparseArray", "create", "row_sparse_array"]

"""troupe.kv: the KVStore (MXNet's mx.kv), on NumPy arrays and PyTorch CPU tensors in place.

create(type) returns a KVStore; its calls take a key (int or str) or a list of keys, and an
array, a list of arrays (one key's values, summed) or a list of those (one per key). Arrays are
never copied: push reads them where they lie, pull writes into them. Every failure raises
troupe.Error, whose .code names its kind ("unknown_key", "shape_mismatch", ...).
"""

from troupe._troupe import Error, KVStore, create

__all__ = ["Error", "KVStore", "create"]

"""troupe: MXNet's KVStore parameter server on actors, for NumPy arrays and PyTorch CPU tensors.

    import troupe
    kv = troupe.kv.create("dist_sync")   # in a worker started by troupe-launch

troupe.torch (imported on its own: it needs PyTorch) adds BytePS's DistributedOptimizer and
broadcasts on top of it. See docs/python.md.
"""

from troupe._troupe import Error
from troupe import kv

__all__ = ["Error", "kv"]

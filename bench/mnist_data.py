"""Fashion-MNIST from its IDX files, for the PyTorch baselines (bench/pytorch_*mnist.py).

Reads the gzip-compressed IDX files with numpy alone, so the baselines need no torchvision and
see exactly the bytes troupe's engine/data/idx reader sees.
"""

import ctypes
import gzip
import os
import sys

import numpy as np

DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"


def rerun_with_a_better_blas_core():
    """Debian's PyTorch computes its GEMMs with the system BLAS, OpenBLAS 0.3.21, which does not
    recognise some current Xeons and falls back to its Prescott (SSE3) kernels, about 4x slower.
    apps/train_mnist does the same as this: when OPENBLAS_CORETYPE is unset and OpenBLAS chose
    Prescott on a CPU with AVX2, set it and start the script again (OpenBLAS reads it when it is
    loaded). Call before importing torch; does nothing on machines OpenBLAS recognises."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return
    try:
        blas = ctypes.CDLL("libblas.so.3")
        blas.openblas_get_corename.restype = ctypes.c_char_p
        core = blas.openblas_get_corename()
    except (OSError, AttributeError):
        return  # not OpenBLAS
    if core != b"Prescott":
        return
    flags = set()
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    better = "SkylakeX" if "avx512f" in flags else "Haswell" if "avx2" in flags else None
    if better:
        os.environ["OPENBLAS_CORETYPE"] = better
        os.execv(sys.executable, [sys.executable] + sys.argv)


def read_idx(path):
    """The array an IDX file holds (plain or gzip): magic 0x0000TTDD, then DD big-endian int32
    extents, then the data. Only unsigned bytes (type 0x08) occur in (Fashion-)MNIST."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">i4", count=ndim, offset=4)
    offset = 4 + 4 * ndim
    count = int(np.prod(dims))
    if len(raw) - offset != count:
        raise ValueError(f"{path}: header says {count} bytes, file holds {len(raw) - offset}")
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(tuple(int(d) for d in dims))


def load(data_dir=DEFAULT_DATA_DIR):
    """(train_x, train_y, test_x, test_y): x float32 [n, 784] scaled to [0, 1], y int64 [n]."""

    def part(prefix):
        images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
        if images.shape[0] != labels.shape[0]:
            raise ValueError(f"{prefix}: {images.shape[0]} images but {labels.shape[0]} labels")
        x = images.reshape(images.shape[0], -1).astype(np.float32) / 255.0
        return x, labels.astype(np.int64)

    train_x, train_y = part("train")
    test_x, test_y = part("t10k")
    return train_x, train_y, test_x, test_y

"""A worker of a dist_sync job, run by troupe-launch from dist_kvstore_test.sh:

    troupe-launch -n 2 -s 1 -- python3 tests/python/dist_worker.py

Checks, on every worker, what only a distributed store shows and prints "dist_worker R of N: ok"
at the end (an AssertionError, or troupe.Error, fails the worker and so the job):
  - rank and num_workers come from troupe-launch's DMLC_* variables;
  - a dist_sync round sums the pushes of every worker: after worker r pushes r + 1 into a list
    of two arrays per worker, every worker pulls N (N + 1), the closed form;
  - barrier() releases the GIL: a Python thread keeps running while rank 0 waits in a barrier
    that rank 1 reaches only after 0.5 s;
  - a distributed store refuses a negative key with troupe.Error naming it.
"""

import threading
import time

import numpy as np

import troupe


def main():
    kv = troupe.kv.create("dist_sync")
    rank, workers = kv.rank, kv.num_workers
    assert kv.type == "dist_sync", kv.type
    assert workers == 2 and rank in (0, 1), (rank, workers)

    shape = (3, 1000)
    kv.init(7, np.zeros(shape, np.float32))
    pushed = np.full(shape, rank + 1, np.float32)
    kv.push(7, [pushed, pushed])  # summed on the worker, then across workers on the server
    out = np.empty(shape, np.float32)
    before = out.__array_interface__["data"][0]
    kv.pull(7, out=out)
    assert out.__array_interface__["data"][0] == before
    expected = workers * (workers + 1)  # sum over r of 2 (r + 1)
    assert (out == expected).all(), f"pulled {out[0, :3]}, expected {expected}"

    ticks = 0
    stop = threading.Event()

    def count():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.01)

    if rank == 1:
        time.sleep(0.5)
        kv.barrier()
    else:
        counter = threading.Thread(target=count)
        counter.start()
        start = time.monotonic()
        kv.barrier()
        waited = time.monotonic() - start
        stop.set()
        counter.join()
        assert waited >= 0.3, f"the barrier returned after {waited:.2f} s"
        # With the GIL held by barrier() the thread would not have run at all meanwhile.
        assert ticks >= 10, f"the thread ran {ticks} times during a {waited:.2f} s barrier"

    try:
        kv.init(-1, np.zeros(1, np.float32))
        raise AssertionError("init of key -1 did not raise")
    except troupe.Error as error:
        assert "-1" in str(error) and ">= 0" in str(error), str(error)

    kv.close()
    print(f"dist_worker {rank} of {workers}: ok", flush=True)


if __name__ == "__main__":
    main()

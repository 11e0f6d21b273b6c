"""A worker of a dist_sync job, run by troupe-launch from dist_kvstore_test.sh:

    troupe-launch -n 2 -s 2 -- python3 tests/python/dist_worker.py

Checks, on every worker, what only a distributed store shows and prints "dist_worker R of N: ok"
at the end (an AssertionError, or troupe.Error, fails the worker and so the job):
  - rank and num_workers come from troupe-launch's DMLC_* variables;
  - a dist_sync round sums the pushes of every worker: after worker r pushes r + 1 into a list
    of two arrays per worker, every worker pulls N (N + 1), the closed form;
  - barrier() releases the GIL: a Python thread keeps running while rank 0 waits in a barrier
    that rank 1 reaches only after 0.5 s;
  - a distributed store refuses a negative key with troupe.Error naming it;
  - a pushpull_async is not done() while the other worker has not pushed (rank 1 pushes only
    after a barrier that rank 0 enters after looking), and wait() returns the closed form;
  - Request.wait() releases the GIL: rank 1 pushes only once a Python thread of rank 0, which
    starts its work once rank 0's main thread is about to wait, has told it so (through a file);
    with the GIL held by wait() that thread could not run, rank 1 would never push and the wait
    would end in a timeout;
  - errors found by the store (an unknown key, a wrong shape) arrive at wait() as troupe.Error;
  - with set_gradient_compression({"type": "2bit", "threshold": 0.5}) pushes travel packed
    through the real codec: every pull equals what a NumPy model of MXNet's quantizer says each
    worker's packed pushes stand for, the residual carried over rounds, for a key of 35 elements
    (not whole words), one of 1,100,000 split over the 2 servers, and 64 keys of 50 elements
    pushpulled in one call (fused frames of packed pushes); a bad setting
    raises troupe.Error naming it;
  - a row_sparse key split by rows over the 2 servers: worker w pushes w + 1 into its own rows,
    and row_sparse_pull returns exactly the rows asked for, with the test optimizer's closed
    form (1 + 2 (w + 1) per round) in pushed rows, 1 in rows no worker pushed, 0 elsewhere;
  - kv.leave(): rank 0 leaves after one round of a key and rank 1's next round closes with its
    own push alone, its barrier waits for nobody; rank 0's calls after leaving raise troupe.Error.
"""

import os
import tempfile
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
        assert "-1" in str(error) and "from 0 to 4294967295" in str(error), str(error)

    check_async_requests(kv, rank, workers)
    check_gradient_compression(kv, rank, workers)
    check_row_sparse(kv, rank, workers)
    check_leave(kv, rank, workers)

    print(f"dist_worker {rank} of {workers}: ok", flush=True)


def check_leave(kv, rank, workers):
    """Rank 0 leaves after one round of key 31; rank 1 goes on alone: its next round closes
    with its push only, its barrier waits for nobody else, and rank 0's later calls raise."""
    shape = (4, 5)
    kv.init(31, np.ones(shape, np.float32))
    kv.push(31, np.full(shape, rank + 1, np.float32))
    out = np.empty(shape, np.float32)
    kv.pull(31, out=out)
    expected = 1 + 2 * workers * (workers + 1) / 2  # the test optimizer, rescale_grad 2
    assert (out == expected).all(), f"round 0 pulled {out[0, :3]}, expected {expected}"
    if rank == 0:
        kv.leave()
        try:
            kv.pull(31, out=out)
            raise AssertionError("a pull after leave() did not raise")
        except troupe.Error as error:
            assert "has left the job" in str(error), str(error)
        kv.close()
        return
    kv.push(31, np.full(shape, rank + 1, np.float32))
    kv.pull(31, out=out)
    expected += 2 * (rank + 1)
    assert (out == expected).all(), f"round 1 pulled {out[0, :3]}, expected {expected}"
    kv.barrier()
    kv.close()


def compression_gradient(rank, step, size):
    """Values in [-0.9, 0.9] that leave residuals behind, different per worker and round."""
    j = np.arange(size)
    return (np.float32(0.15) * ((j * 7 + rank * 5 + step * 3) % 13).astype(np.float32)
            - np.float32(0.9)).astype(np.float32)


def two_bit_stands_for(gradient, residual, threshold):
    """MXNet's 2bit rule, element by element in float32: what the packed push stands for."""
    residual += gradient
    sent = np.zeros_like(residual)
    up = residual >= threshold
    down = ~up & (residual <= -threshold)
    sent[up] = threshold
    sent[down] = -threshold
    residual -= sent
    return sent


def check_gradient_compression(kv, rank, workers):
    try:
        kv.set_gradient_compression({"type": "3bit"})
        raise AssertionError("set_gradient_compression of type 3bit did not raise")
    except troupe.Error as error:
        assert "3bit" in str(error), str(error)
    threshold = np.float32(0.5)
    kv.set_gradient_compression({"type": "2bit", "threshold": "0.5"})  # MXNet passes strings
    sizes = {20: 35, 21: 1_100_000}
    for key, size in sizes.items():
        kv.init(key, np.zeros(size, np.float32))
    residuals = {(r, key): np.zeros(size, np.float32)
                 for r in range(workers) for key, size in sizes.items()}
    expected = {key: np.zeros(size, np.float32) for key, size in sizes.items()}
    for step in range(3):
        for key, size in sizes.items():
            out = np.empty(size, np.float32)
            kv.pushpull(key, compression_gradient(rank, step, size), out=out)
            # No optimizer: the value is the round's sum of what the pushes stand for.
            expected[key] = sum(two_bit_stands_for(compression_gradient(r, step, size),
                                                   residuals[(r, key)], threshold)
                                for r in range(workers))
            assert (out == expected[key]).all(), (
                f"key {key} step {step}: pulled {out[:4]}, expected {expected[key][:4]}")
    # 64 small keys in one call leave fused, several packed pushes to a frame.
    small = list(range(100, 164))
    kv.init(small, [np.zeros(50, np.float32) for _ in small])
    residuals.update({(r, key): np.zeros(50, np.float32) for r in range(workers) for key in small})
    for step in range(2):
        outs = [np.empty(50, np.float32) for _ in small]
        kv.pushpull(small, [compression_gradient(rank, step + key, 50) for key in small], out=outs)
        for key, out in zip(small, outs):
            want = sum(two_bit_stands_for(compression_gradient(r, step + key, 50),
                                          residuals[(r, key)], threshold)
                       for r in range(workers))
            assert (out == want).all(), (
                f"key {key} step {step}: pulled {out[:4]}, expected {want[:4]}")
    # Compressed pulls (troupe's "pulls"): each pushpull's reply is the round's sum plus this
    # worker's residual on the server, packed; 4x the gradients so that sums pass 0.5.
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5, "pulls": True})
    kv.init(30, np.zeros(35, np.float32))
    push_residuals = [np.zeros(35, np.float32) for _ in range(workers)]
    pull_residual = np.zeros(35, np.float32)
    packed_somewhere = False
    for step in range(3):
        out = np.empty(35, np.float32)
        kv.pushpull(30, 4 * compression_gradient(rank, step, 35), out=out)
        summed = sum(two_bit_stands_for(4 * compression_gradient(r, step, 35), push_residuals[r],
                                        threshold) for r in range(workers))
        want = two_bit_stands_for(summed, pull_residual, threshold)
        assert (out == want).all(), f"compressed pull step {step}: {out[:4]}, expected {want[:4]}"
        packed_somewhere = packed_somewhere or bool((want != summed).any())
    assert packed_somewhere, "every packed reply equals its sum: the check checks nothing"
    kv.set_gradient_compression({"type": "none"})
    kv.barrier()


def wait_for_file(path, seconds=60.0):
    """Polls for `path` with a generous deadline (a loaded machine, AddressSanitizer)."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear within {seconds} s"
        time.sleep(0.005)


def check_async_requests(kv, rank, workers):
    shape = (4, 500)
    kv.init(8, np.zeros(shape, np.float32))
    value = np.full(shape, rank + 1, np.float32)
    out = np.empty(shape, np.float32)
    expected = workers * (workers + 1) / 2  # sum over r of (r + 1)
    if rank == 0:
        request = kv.pushpull_async(8, value, out=out, priority=3)
        # Rank 1 pushes key 8 only after the barrier below, which needs this worker.
        assert not request.done(), "a dist_sync round closed without rank 1's push"
        kv.barrier()
        request.wait()
        assert request.done()
    else:
        kv.barrier()
        kv.pushpull_async(8, value, out=out).wait()
    assert (out == expected).all(), f"pulled {out[0, :3]}, expected {expected}"

    # The GIL: the job's root port names this run's signal file on both workers.
    signal = os.path.join(tempfile.gettempdir(),
                          f"troupe-dist-worker-{os.environ['DMLC_PS_ROOT_PORT']}.go")
    if rank == 0:
        if os.path.exists(signal):
            os.remove(signal)  # left by a killed run on the same port
    kv.barrier()  # rank 1 looks for the file only after rank 0 removed a stale one
    out.fill(0)
    if rank == 0:
        request = kv.pushpull_async(8, value, out=out)
        about_to_wait = threading.Event()
        done_while_waiting = []

        def tell_rank_1():
            about_to_wait.wait()
            # Rank 1 has not pushed: done() is False, also while another thread is in wait().
            done_while_waiting.append(request.done())
            with open(signal, "w"):
                pass

        teller = threading.Thread(target=tell_rank_1)
        teller.start()
        about_to_wait.set()
        request.wait()  # returns only after rank 1 pushed, which it does after the file appeared
        teller.join()
        assert done_while_waiting == [False], done_while_waiting
    else:
        wait_for_file(signal)
        os.remove(signal)
        kv.pushpull(8, value, out=out)
    assert (out == expected).all(), f"pulled {out[0, :3]}, expected {expected}"  # no optimizer

    unknown = kv.pull_async(99, out=np.empty(3, np.float32))
    try:
        unknown.wait()
        raise AssertionError("a pull of unknown key 99 did not raise at wait()")
    except troupe.Error as error:
        assert error.code == "unknown_key" and "99" in str(error), str(error)
    wrong = kv.push_async(8, np.zeros((500, 4), np.float32))
    try:
        wrong.wait()
        raise AssertionError("a push of shape (500, 4) into key 8 of shape (4, 500) did not raise")
    except troupe.Error as error:
        assert error.code == "shape_mismatch", str(error)
    kv.barrier()



def check_row_sparse(kv, rank, workers):
    # Set to none: compressed row_sparse pushes are refused, as MXNet refuses them.
    kv.set_gradient_compression({"type": "none"})
    rows, width = 400_000, 4  # 1.6M elements: split by rows over both servers
    kv.init(50, troupe.kv.row_sparse_array((np.ones((1, width), np.float32), np.array([0])),
                                           shape=(rows, width)))
    kv.set_optimizer("test", rescale_grad=2)
    mine = np.arange(rank, rows, 1000 * workers)  # rows on both servers
    # A few rows, then many (a pull of 40 KiB of ids, which must survive in the server's frame
    # while the other worker's frames arrive).
    for step, asked in enumerate([np.array([rows - 1, 0, 1, 199_999, 200_000, 200_001, 1000, 1000]),
                                  np.arange(rows - 1, -1, -79)]):
        grad = troupe.kv.row_sparse_array(
            (np.full((len(mine), width), rank + 1, np.float32), mine), shape=(rows, width))
        kv.push(50, grad)
        out = troupe.kv.RowSparseArray((rows, width))
        kv.row_sparse_pull(50, out=out, row_ids=asked)
        np.testing.assert_array_equal(out.indices, np.unique(asked))
        for i, row in enumerate(out.indices):
            pusher = row % (1000 * workers)
            expected = 0.0
            if row == 0:
                expected = 1.0  # initialised to 1, row 0 pushed by worker 0
            if pusher < workers:
                expected += 2.0 * (pusher + 1) * (step + 1)
            assert (out.data[i] == expected).all(), (row, out.data[i], expected)


if __name__ == "__main__":
    main()


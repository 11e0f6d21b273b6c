"""The troupe Python module on a local store: MXNet's KVStore calls on NumPy arrays and PyTorch
CPU tensors, in place, and every mistake a troupe.Error naming what is wrong.

    PYTHONPATH=build/python /usr/bin/python3 -m unittest -v tests/python/kvstore_test.py

(CTest: python_kvstore). The distributed store is exercised by dist_worker.py, troupe.torch's
DistributedOptimizer in a job by torch_worker.py, and the example by train_fashion_mnist_test.sh.
"""

import os
import sys
import importlib
import tempfile
import unittest
from unittest import mock
import weakref

import numpy as np

import troupe

try:
    import torch
except ImportError:  # the NumPy tests still run
    torch = None


def address(array):
    return array.__array_interface__["data"][0]


class NumpyArrays(unittest.TestCase):
    def setUp(self):
        self.kv = troupe.kv.create("local")

    def tearDown(self):
        self.kv.close()

    def test_a_local_store_is_rank_0_of_1_and_knows_its_type(self):
        self.assertEqual((self.kv.type, self.kv.rank, self.kv.num_workers), ("local", 0, 1))
        self.kv.barrier()  # a no-op, as in MXNet's local stores
        self.assertTrue(self.kv.is_capable("optimizer"))

    def test_pull_writes_the_value_into_the_callers_array_in_place(self):
        self.kv.init(3, np.arange(6, dtype=np.float32).reshape(2, 3))
        out = np.zeros((2, 3), dtype=np.float32)
        before = address(out)
        self.kv.pull(3, out=out)
        self.assertEqual(address(out), before)
        np.testing.assert_array_equal(out, np.arange(6).reshape(2, 3))

    def test_a_pull_into_a_view_writes_the_rows_of_the_array_it_views(self):
        self.kv.init("w", np.full((2, 4), 7, dtype=np.float32))
        big = np.zeros((4, 4), dtype=np.float32)
        self.kv.pull("w", out=big[1:3])  # rows 1 and 2: contiguous, inside `big`
        np.testing.assert_array_equal(big, [[0] * 4, [7] * 4, [7] * 4, [0] * 4])

    def test_a_pushed_list_is_summed_and_replaces_the_value_without_an_optimizer(self):
        self.kv.init("w", np.zeros(5, dtype=np.float32))
        self.kv.push("w", [np.full(5, 1.5, dtype=np.float32), np.full(5, 2, dtype=np.float32)])
        out = np.empty(5, dtype=np.float32)
        self.kv.pull("w", out=out)
        np.testing.assert_array_equal(out, np.full(5, 3.5))

    def test_lists_of_keys_take_a_list_of_values_each_an_array_or_a_list(self):
        self.kv.init([1, 2], [np.zeros(2, np.float32), np.zeros(3, np.float32)])
        self.kv.push([1, 2], [np.ones(2, np.float32), [np.ones(3, np.float32)] * 3])
        outs = [np.empty(2, np.float32), [np.empty(3, np.float32), np.empty(3, np.float32)]]
        self.kv.pull([1, 2], out=outs)
        np.testing.assert_array_equal(outs[0], [1, 1])
        for out in outs[1]:
            np.testing.assert_array_equal(out, [3, 3, 3])

    def test_every_dtype_travels_unchanged(self):
        for key, dtype in enumerate([np.float32, np.float16, np.float64, np.int32, np.int64]):
            value = (np.arange(7) * 3 - 5).astype(dtype)
            self.kv.init(key, value)
            out = np.zeros_like(value)
            self.kv.pull(key, out=out)
            np.testing.assert_array_equal(out, value, err_msg=str(dtype))

    def test_sgd_on_the_store_updates_in_place_with_pushpull(self):
        self.kv.init(0, np.ones(4, np.float32))
        self.kv.set_optimizer("sgd", learning_rate=0.5, rescale_grad=0.25)
        grad = np.full(4, 2, np.float32)
        weight = np.zeros(4, np.float32)
        self.kv.pushpull(0, grad, out=weight)
        np.testing.assert_allclose(weight, np.full(4, 1 - 0.5 * 0.25 * 2))
        self.kv.pushpull(0, grad)  # without out: the new value is written into the pushed array
        np.testing.assert_allclose(grad, np.full(4, 0.75 - 0.25))

    def test_multi_precision_keeps_a_float32_master_of_a_float16_key(self):
        # Each push moves the weight by 2e-4, below float16's step at 1 (about 1e-3): without a
        # float32 master copy every update would round back to 1.
        self.kv.init(0, np.ones(4, np.float16))
        self.kv.set_optimizer("test", rescale_grad=2, multi_precision=True)
        grad = np.full(4, 1e-4, np.float16)
        master = np.ones(4, np.float32)
        for _ in range(10):
            self.kv.push(0, grad)
            master += np.float32(2) * grad.astype(np.float32)
        out = np.empty(4, np.float16)
        self.kv.pull(0, out=out)
        np.testing.assert_array_equal(out, master.astype(np.float16))
        self.assertGreater(out[0], 1)

    def test_gradient_compression_is_refused_by_local_and_taken_by_device(self):
        with self.assertRaisesRegex(troupe.Error, "local"):
            self.kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
        device = troupe.kv.create("device")
        try:
            with self.assertRaisesRegex(troupe.Error, "'4bit'"):
                device.set_gradient_compression({"type": "4bit"})
            with self.assertRaisesRegex(troupe.Error, "thresh"):
                device.set_gradient_compression({"type": "2bit", "thresh": 0.5})
            with self.assertRaisesRegex(troupe.Error, "-1"):
                device.set_gradient_compression({"type": "1bit", "threshold": -1})
            with self.assertRaisesRegex(troupe.Error, "compressed pulls are for dist_"):
                device.set_gradient_compression({"type": "2bit", "pulls": True})
            with self.assertRaisesRegex(troupe.Error, "'pulls' must be True or False"):
                device.set_gradient_compression({"type": "2bit", "pulls": "yes"})
            device.set_gradient_compression({"type": "2bit", "threshold": 0.5})
            device.init(0, np.zeros(3, np.float32))
            # 0.3 stays in the residual (below 0.5); the next push of 0.3 makes 0.6: +0.5 sent.
            out = np.empty(3, np.float32)
            device.push(0, np.full(3, 0.3, np.float32))
            device.pull(0, out=out)
            np.testing.assert_array_equal(out, [0, 0, 0])
            device.push(0, np.full(3, 0.3, np.float32))
            device.pull(0, out=out)
            np.testing.assert_array_equal(out, [0.5, 0.5, 0.5])
        finally:
            device.close()

    def test_row_sparse_keys_take_rows_and_row_sparse_pull_returns_the_rows_asked(self):
        table = np.ones((5, 3), np.float32)
        self.kv.init("embedding", troupe.kv.row_sparse_array(table))
        self.kv.set_optimizer("test", rescale_grad=2)
        grad = troupe.kv.row_sparse_array(
            (np.full((2, 3), 4, np.float32), np.array([1, 3])), shape=(5, 3))
        np.testing.assert_array_equal(grad.indices, [1, 3])
        with self.assertRaisesRegex(troupe.Error, "strictly increasing"):
            troupe.kv.row_sparse_array((np.ones((2, 3), np.float32), np.array([3, 1])), shape=(5, 3))
        self.kv.push("embedding", [grad, grad])  # summed: 8 in rows 1 and 3
        out = troupe.kv.RowSparseArray((5, 3))
        self.kv.row_sparse_pull("embedding", out=out, row_ids=np.array([[3.0, 0.0], [3.0, 3.0]]))
        np.testing.assert_array_equal(out.indices, [0, 3])
        np.testing.assert_array_equal(out.data, [[1, 1, 1], [17, 17, 17]])
        dense = out.asnumpy()
        self.assertEqual(dense.shape, (5, 3))
        np.testing.assert_array_equal(dense[1], [0, 0, 0])  # not asked for
        np.testing.assert_array_equal(out.tostype("default"), dense)
        # A plain pull of the key: skipped for a RowSparseArray (MXNet's ignore_sparse), an error
        # otherwise.
        self.kv.pull("embedding", out=out)
        with self.assertRaisesRegex(troupe.Error, "row_sparse_pull"):
            self.kv.pull("embedding", out=out, ignore_sparse=False)
        with self.assertRaisesRegex(troupe.Error, "row_sparse_pull"):
            self.kv.pull("embedding", out=np.empty((5, 3), np.float32))
        with self.assertRaisesRegex(troupe.Error, "row id 5 is outside"):
            self.kv.row_sparse_pull("embedding", out=out, row_ids=np.array([5]))
        with self.assertRaisesRegex(troupe.Error, "shape"):
            troupe.kv.row_sparse_array((np.ones((1, 2), np.float32), np.array([0])), shape=(5, 3))
        self.assertIn("2 rows stored", repr(out))

    def test_set_optimizer_takes_a_dict_as_mxnet_passes_params(self):
        self.kv.init(0, np.ones(2, np.float32))
        self.kv.set_optimizer("sgd", {"learning_rate": 1.0})
        out = np.empty(2, np.float32)
        self.kv.pushpull(0, np.ones(2, np.float32), out=out)
        np.testing.assert_array_equal(out, [0, 0])

    def test_broadcast_initialises_and_fills_every_output(self):
        outs = [np.zeros(3, np.float32), np.zeros(3, np.float32)]
        self.kv.broadcast("b", np.full(3, 4, np.float32), out=outs)
        for out in outs:
            np.testing.assert_array_equal(out, [4, 4, 4])

    def test_optimizer_states_are_saved_and_loaded(self):
        self.kv.init(0, np.ones(3, np.float32))
        self.kv.set_optimizer("sgd", learning_rate=0.1, momentum=0.9)
        self.kv.push(0, np.ones(3, np.float32))
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "states")
            self.kv.save_optimizer_states(path)
            self.assertGreater(os.path.getsize(path), 0)
            self.kv.load_optimizer_states(path)
            with self.assertRaises(troupe.Error) as raised:
                self.kv.load_optimizer_states(os.path.join(folder, "missing"))
            self.assertIn("missing", str(raised.exception))

    def test_an_array_dropped_by_python_stays_valid_while_troupe_holds_it(self):
        self.kv.init(9, np.zeros(1000, np.float32))
        for _ in range(20):
            self.kv.push(9, [np.full(1000, 1, np.float32) for _ in range(3)])
        out = np.empty(1000, np.float32)
        self.kv.pull(9, out=out)
        np.testing.assert_array_equal(out, np.full(1000, 3))

    def test_troupe_lets_go_of_the_arrays_after_the_call(self):
        value = np.ones(8, np.float32)
        out = np.empty(8, np.float32)
        baseline = sys.getrefcount(value), sys.getrefcount(out)
        self.kv.init(5, value)
        self.kv.push(5, [value, value])
        self.kv.pull(5, out=out)
        self.kv.barrier()  # releases what troupe dropped on other threads, if anything
        # A buffer view that troupe still held would hold a reference to its array.
        self.assertEqual((sys.getrefcount(value), sys.getrefcount(out)), baseline)

class AsyncRequests(unittest.TestCase):
    """push_async, pull_async and pushpull_async on a local store, which finishes the work before
    it returns the Request: what the Request promises (its errors at wait(), the arrays it holds)
    without the timing of a distributed one (dist_worker.py)."""

    def setUp(self):
        self.kv = troupe.kv.create("local")
        self.kv.init(3, np.zeros((2, 3), np.float32))

    def tearDown(self):
        self.kv.close()

    def test_a_pushpull_async_is_done_after_wait_and_wrote_the_sum(self):
        self.kv.set_optimizer("sgd", learning_rate=1.0)
        grads = [np.full((2, 3), 0.5, np.float32), np.full((2, 3), 1.5, np.float32)]
        out = np.empty((2, 3), np.float32)
        request = self.kv.pushpull_async(3, grads, out=out, priority=-2)
        self.assertIsInstance(request, troupe.kv.Request)
        request.wait()
        self.assertTrue(request.done())
        np.testing.assert_array_equal(out, np.full((2, 3), -2.0))
        request.wait()  # again: the same outcome, nothing redone
        self.kv.pull(3, out=out)
        np.testing.assert_array_equal(out, np.full((2, 3), -2.0))

    def test_push_async_then_pull_async_take_effect_in_order(self):
        self.kv.push_async(3, np.full((2, 3), 4, np.float32)).wait()
        out = np.empty((2, 3), np.float32)
        self.kv.pull_async(3, out=out).wait()
        np.testing.assert_array_equal(out, np.full((2, 3), 4))

    def test_an_unknown_key_raises_at_wait_not_at_the_call(self):
        request = self.kv.pull_async(4, out=np.zeros((2, 3), np.float32))
        self.assertTrue(request.done())
        for _ in range(2):  # a second wait() raises the same
            with self.assertRaises(troupe.Error) as raised:
                request.wait()
            self.assertEqual(raised.exception.code, "unknown_key", str(raised.exception))
            self.assertIn("4", str(raised.exception))

    def test_a_wrong_shape_raises_at_wait_naming_both_shapes(self):
        request = self.kv.push_async(3, np.zeros((3, 2), np.float32))
        with self.assertRaises(troupe.Error) as raised:
            request.wait()
        self.assertEqual(raised.exception.code, "shape_mismatch", str(raised.exception))
        self.assertIn("(3,2)", str(raised.exception).replace(" ", ""))

    def test_a_pushpull_async_whose_push_is_refused_starts_no_pull(self):
        # Two outputs for one value: a push, then a pull.
        out = [np.full((2, 3), 7, np.float32), np.full((2, 3), 7, np.float32)]
        request = self.kv.pushpull_async(3, np.zeros((3, 2), np.float32), out=out)
        with self.assertRaises(troupe.Error):
            request.wait()
        for array in out:
            np.testing.assert_array_equal(array, np.full((2, 3), 7))  # not pulled into

    def test_the_request_holds_its_arrays_until_wait_returns(self):
        value = np.ones((2, 3), np.float32)
        out = np.empty((2, 3), np.float32)
        value_ref, out_ref = weakref.ref(value), weakref.ref(out)
        request = self.kv.pushpull_async(3, value, out=out)
        del value, out
        self.assertIsNotNone(value_ref())
        self.assertIsNotNone(out_ref())
        request.wait()
        self.kv.barrier()  # releases what troupe dropped on other threads, if anything
        self.assertIsNone(value_ref())
        self.assertIsNone(out_ref())

    def test_a_mistake_in_the_arguments_raises_at_the_call(self):
        with self.assertRaises(troupe.Error) as raised:
            self.kv.pull_async(3, out=np.zeros((3, 2), np.float32).T)
        self.assertIn("not C-contiguous", str(raised.exception))
        with self.assertRaises(troupe.Error) as raised:
            self.kv.pull_async(3)
        self.assertIn("pull needs out=", str(raised.exception))


class Mistakes(unittest.TestCase):
    def setUp(self):
        self.kv = troupe.kv.create("local")
        self.kv.init(3, np.zeros((2, 3), np.float32))

    def tearDown(self):
        self.kv.close()

    def assert_error(self, code, fragment, call, *args, **kwargs):
        with self.assertRaises(troupe.Error) as raised:
            call(*args, **kwargs)
        self.assertIsInstance(raised.exception, RuntimeError)
        self.assertEqual(raised.exception.code, code, str(raised.exception))
        self.assertIn(fragment, str(raised.exception))

    def test_an_unknown_key_is_named(self):
        self.assert_error("unknown_key", "4", self.kv.pull, 4, out=np.zeros((2, 3), np.float32))

    def test_a_wrong_shape_names_both_shapes(self):
        self.assert_error("shape_mismatch", "(2,3)", self.kv.push, 3, np.zeros((3, 2), np.float32))

    def test_a_wrong_dtype_names_both_dtypes(self):
        self.assert_error("dtype_mismatch", "float64", self.kv.push, 3, np.zeros((2, 3)))

    def test_a_dtype_troupe_lacks_is_named(self):
        self.assert_error("dtype_mismatch", "the value of key 3 has element format '?'",
                          self.kv.push, 3, np.zeros((2, 3), np.bool_))

    def test_a_non_contiguous_array_is_refused_not_copied(self):
        self.assert_error("invalid_argument", "the value of key 3 is not C-contiguous",
                          self.kv.push, 3, np.zeros((3, 2), np.float32).T)
        self.assert_error("invalid_argument", "the output of key 3 is not C-contiguous",
                          self.kv.pull, 3, out=np.zeros((2, 6), np.float32)[:, ::2])

    def test_a_read_only_output_is_refused_and_a_read_only_value_accepted(self):
        frozen = np.zeros((2, 3), np.float32)
        frozen.flags.writeable = False
        self.kv.push(3, frozen)
        self.assert_error("invalid_argument", "the output of key 3 is read-only",
                          self.kv.pull, 3, out=frozen)

    def test_a_second_output_in_a_list_is_named_by_its_position(self):
        good = np.zeros((2, 3), np.float32)
        self.assert_error("invalid_argument", "output 1 of key 3 is a list",
                          self.kv.pull, 3, out=[good, [good]])

    def test_a_key_that_is_neither_int_nor_str_is_named(self):
        self.assert_error("invalid_argument", "a key is an int or a str, not a float (1.5)",
                          self.kv.push, 1.5, np.zeros((2, 3), np.float32))
        self.assert_error("invalid_argument", "not a bool", self.kv.push, True,
                          np.zeros((2, 3), np.float32))

    def test_mixed_key_types_are_refused(self):
        self.assert_error("key_type_mix", "'w'", self.kv.init, "w", np.zeros(1, np.float32))

    def test_keys_and_values_of_different_lengths_are_refused(self):
        self.assert_error("invalid_argument", "2 keys need a list of 2 values, one per key; got a "
                          "list of 1", self.kv.push, [3, 3], [np.zeros((2, 3), np.float32)])

    def test_pull_without_out_and_empty_lists_are_refused(self):
        self.assert_error("invalid_argument", "pull needs out=", self.kv.pull, 3)
        self.assert_error("empty_list", "the value list of key 3 is empty", self.kv.push, 3, [])

    def test_an_unknown_optimizer_or_a_non_number_parameter_is_refused(self):
        self.assert_error("invalid_argument", "optimizer parameter 'momentum' is a str",
                          self.kv.set_optimizer, "sgd", momentum="0.9")
        with self.assertRaises(troupe.Error):
            self.kv.set_optimizer("no-such-optimizer")

    def test_an_unknown_type_lists_the_types(self):
        with self.assertRaises(troupe.Error) as raised:
            troupe.kv.create("nonsense")
        self.assertIn("dist_sync", str(raised.exception))

    def test_a_closed_store_raises(self):
        self.kv.close()
        self.assert_error("invalid_argument", "the store is closed", lambda: self.kv.rank)
        with troupe.kv.create() as kv:
            self.assertEqual(kv.type, "local")
        self.assert_error("invalid_argument", "closed", kv.barrier)

    def test_an_object_without_a_buffer_is_named(self):
        self.assert_error("invalid_argument", "the value of key 3 is a str, not a NumPy array",
                          self.kv.push, 3, "abc")


@unittest.skipIf(torch is None, "PyTorch (python3-torch) is not installed")
class TorchTensors(unittest.TestCase):
    def setUp(self):
        self.kv = troupe.kv.create("local")

    def tearDown(self):
        self.kv.close()

    def test_pull_writes_into_a_parameter_tensor_in_place(self):
        weight = torch.nn.Parameter(torch.zeros(3, 4))  # requires_grad: pulled through detach()
        before = weight.data_ptr()
        self.kv.init("weight", torch.arange(12, dtype=torch.float32).reshape(3, 4))
        self.kv.pull("weight", out=weight)
        self.assertEqual(weight.data_ptr(), before)
        self.assertTrue(torch.equal(weight.detach(), torch.arange(12.0).reshape(3, 4)))

    def test_gradients_are_pushed_and_the_update_pulled_into_the_model(self):
        model = torch.nn.Linear(4, 2)
        names = [name for name, _ in model.named_parameters()]
        params = list(model.parameters())
        pointers = [p.data_ptr() for p in params]
        self.kv.init(names, params)
        self.kv.set_optimizer("sgd", learning_rate=0.1)
        expected = [p.detach().clone() for p in params]
        model(torch.ones(3, 4)).sum().backward()
        for e, p in zip(expected, params):
            e -= 0.1 * p.grad
        self.kv.pushpull(names, [p.grad for p in params], out=params)
        self.assertEqual([p.data_ptr() for p in params], pointers)
        for e, p in zip(expected, params):
            torch.testing.assert_close(p.detach(), e)

    def test_a_tensor_and_a_numpy_array_share_one_store(self):
        self.kv.init(0, np.ones(3, np.float64))
        self.kv.push(0, [torch.ones(3, dtype=torch.float64), np.ones(3, np.float64)])
        out = torch.zeros(3, dtype=torch.float64)
        self.kv.pull(0, out=out)
        self.assertEqual(out.tolist(), [2.0, 2.0, 2.0])

    def test_a_non_contiguous_tensor_and_a_dtype_numpy_lacks_are_named(self):
        self.kv.init(0, np.ones((2, 3), np.float32))
        with self.assertRaises(troupe.Error) as raised:
            self.kv.pull(0, out=torch.zeros(3, 2).t())
        self.assertIn("the output of key 0 is not C-contiguous", str(raised.exception))
        with self.assertRaises(troupe.Error) as raised:
            self.kv.push(0, torch.zeros(2, 3, dtype=torch.bfloat16))
        self.assertIn("the value of key 0 is a tensor NumPy cannot view", str(raised.exception))



class TroupeTorchImport(unittest.TestCase):
    def test_troupe_torch_without_pytorch_says_what_to_install(self):
        # None in sys.modules makes `import torch` fail as on a machine without PyTorch.
        with mock.patch.dict(sys.modules, {"torch": None, "troupe.torch": None}):
            del sys.modules["troupe.torch"]
            with self.assertRaises(ImportError) as raised:
                importlib.import_module("troupe.torch")
        self.assertIn("troupe.torch needs PyTorch", str(raised.exception))
        self.assertIn("python3-torch", str(raised.exception))


def mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


@unittest.skipIf(torch is None, "PyTorch (python3-torch) is not installed")
class TroupeTorchOnALocalStore(unittest.TestCase):
    """troupe.torch on a local store (one worker: the sums are the gradients themselves); the job
    of two workers is torch_worker.py's."""

    def setUp(self):
        import troupe.torch as tt
        self.tt = tt
        self.kv = troupe.kv.create("local")
        self.x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
        self.y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])

    def tearDown(self):
        self.kv.close()

    def backward(self, model):
        torch.nn.functional.cross_entropy(model(self.x), self.y).backward()

    def sgd_model(self, **options):
        """A model and its DistributedOptimizer (plain SGD) on the test's store."""
        model = mlp(0)
        optimizer = self.tt.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), kvstore=self.kv,
            **options)
        return model, optimizer

    def test_it_steps_as_the_optimizer_it_wraps_and_is_one(self):
        model, reference = mlp(0), mlp(0)
        optimizer = self.tt.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model.named_parameters(),
            kvstore=self.kv)
        self.assertIsInstance(optimizer, torch.optim.SGD)
        plain = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            for m, o in ((model, optimizer), (reference, plain)):
                o.zero_grad()
                self.backward(m)
                o.step()
        for a, b in zip(model.parameters(), reference.parameters()):
            self.assertTrue(torch.equal(a, b))
        self.assertFalse(torch.equal(next(model.parameters()), next(mlp(0).parameters())))

    def test_the_first_layers_get_the_highest_priority(self):
        model, optimizer = self.sgd_model()
        priorities = {optimizer._keys[p]: optimizer._priority[p] for p in model.parameters()}
        self.assertEqual(priorities, {"0.weight": 0, "0.bias": -1, "2.weight": -2, "2.bias": -3})

    def test_zero_grad_between_backward_and_step_raises(self):
        model, optimizer = self.sgd_model()
        self.backward(model)
        with self.assertRaises(RuntimeError) as raised:
            optimizer.zero_grad()
        self.assertIn("before optimizer.step()", str(raised.exception))
        optimizer.step()
        optimizer.zero_grad()

    def test_a_second_backward_before_step_raises_naming_the_option(self):
        model, optimizer = self.sgd_model()
        self.backward(model)
        with self.assertRaises(RuntimeError) as raised:
            self.backward(model)
        self.assertIn("backward_passes_per_step", str(raised.exception))

    def test_two_backward_passes_per_step_push_the_accumulated_gradient(self):
        model, optimizer = self.sgd_model(backward_passes_per_step=2)
        reference = mlp(0)
        plain = torch.optim.SGD(reference.parameters(), lr=0.1)
        for m in (model, reference):
            self.backward(m)
            self.backward(m)
        optimizer.step()
        plain.step()
        for a, b in zip(model.parameters(), reference.parameters()):
            self.assertTrue(torch.equal(a, b))

    def test_on_the_store_it_runs_sgd_there_and_refuses_what_it_cannot_translate(self):
        model, optimizer = self.sgd_model(update_on_kvstore=True)
        reference = mlp(0)
        self.backward(model)
        optimizer.step()
        self.backward(reference)
        with torch.no_grad():
            for p in reference.parameters():
                p -= 0.1 * p.grad
        for a, b in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(a, b)  # the store's SGD: w - lr * g, in its own rounding
        other = mlp(1)
        with self.assertRaises(ValueError) as raised:
            self.tt.DistributedOptimizer(
                torch.optim.Adam(other.parameters()), other.named_parameters(), kvstore=self.kv,
                update_on_kvstore=True, key_prefix="adam.")
        self.assertIn("server_optimizer=", str(raised.exception))

    def test_named_parameters_must_name_what_the_optimizer_updates(self):
        model = mlp(0)
        with self.assertRaises(ValueError) as raised:
            self.tt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         mlp(1).named_parameters(), kvstore=self.kv)
        self.assertIn("does not update", str(raised.exception))

    def test_a_root_outside_the_job_and_no_store_are_refused(self):
        with self.assertRaises(ValueError) as raised:
            self.tt.broadcast_parameters(mlp(0).state_dict(), root_rank=1, kvstore=self.kv)
        self.assertIn("root_rank 1 is not a worker of this job: 0..0", str(raised.exception))
        with self.assertRaises(ValueError) as raised:
            self.tt.broadcast_parameters(mlp(0).state_dict())
        self.assertIn("troupe.torch.init()", str(raised.exception))

    def test_the_optimizer_state_survives_its_own_broadcast(self):
        model = mlp(0)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9))
        self.backward(model)
        optimizer.step()
        before = optimizer.state_dict()
        self.tt.broadcast_optimizer_state(optimizer, kvstore=self.kv)
        after = optimizer.state_dict()
        self.assertEqual(after["param_groups"], before["param_groups"])
        for index, entry in before["state"].items():
            for name, value in entry.items():
                self.assertTrue(torch.equal(after["state"][index][name], value), (index, name))


if __name__ == "__main__":
    unittest.main()

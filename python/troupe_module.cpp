// troupe._troupe: the KVStore for Python (docs/python.md), on NumPy arrays and PyTorch CPU
// tensors without copying them.
//
// Every array a call is given is wrapped as a troupe::ndarray over the caller's own memory
// (ndarray::borrow): a push reads it where it lies, a pull writes into it in place. The wrapper
// holds a buffer view (PEP 3118) of the Python object, so the memory stays valid as long as any
// troupe handle refers to it, even after the call returned. A PyTorch tensor is reached through
// tensor.detach().numpy(), which shares the tensor's memory.
//
// Threads: the blocking calls (init, push, pull, pushpull, broadcast, barrier, set_optimizer, the
// optimizer's states, close) release the GIL while they wait, and the asynchronous ones
// (push_async, pull_async, pushpull_async) while they start the work and in their handle's
// wait(). The last troupe handle of a
// borrowed array may be dropped on an actor's thread, which does not hold the GIL; releasing a
// buffer view needs it, so such a release is queued and done at the next call from Python
// (release_or_defer, release_deferred). Taking the GIL on the actor's thread instead could
// deadlock with a Python thread that holds it and waits for that actor.

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <string>
#include <utility>
#include <vector>

#include "actors/kvstore/kvstore.hpp"
#include "engine/error.hpp"
#include "engine/ndarray.hpp"
#include "engine/row_sparse.hpp"

namespace py = pybind11;

namespace troupe::python {
namespace {

// ---------------------------------------------------------------------------------------------
// Borrowed buffers.

/// A buffer view of a Python object, held while troupe handles refer to its memory.
struct held_view {
  Py_buffer view{};
};

std::mutex deferred_mutex;
std::vector<held_view*> deferred_views; // released at the next call that holds the GIL

/// Releases the views queued by threads without the GIL. Caller holds the GIL.
void release_deferred() {
  std::vector<held_view*> views;
  {
    std::lock_guard lock{deferred_mutex};
    views.swap(deferred_views);
  }
  for (auto* held : views) {
    PyBuffer_Release(&held->view);
    delete held;
  }
}

/// The deleter of a borrowed array's keep-alive handle; runs on whichever thread drops the last
/// troupe handle.
void release_or_defer(const held_view* view) noexcept {
  auto* held = const_cast<held_view*>(view);
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyBuffer_Release(&held->view);
    delete held;
    return;
  }
  try {
    std::lock_guard lock{deferred_mutex};
    deferred_views.push_back(held);
  } catch (...) {
    // Out of memory for the queue: the view (and its object) leaks, which is safe.
  }
}

[[noreturn]] void fail(errc code, std::string message) {
  throw troupe::exception(code, std::move(message));
}

/// troupe's dtype for a buffer format (struct module syntax), or fails naming `what`.
dtype dtype_of_format(const Py_buffer& view, const std::string& what) {
  std::string format = view.format != nullptr ? view.format : "B";
  const std::string original = format;
  if (!format.empty() && (format[0] == '@' || format[0] == '=' || format[0] == '<'))
    format.erase(0, 1);
  if (format == "f" && view.itemsize == 4)
    return dtype::float32;
  if (format == "d" && view.itemsize == 8)
    return dtype::float64;
  if (format == "e" && view.itemsize == 2)
    return dtype::float16;
  if (format == "i" || format == "l" || format == "q") {
    if (view.itemsize == 4)
      return dtype::int32;
    if (view.itemsize == 8)
      return dtype::int64;
  }
  fail(errc::dtype_mismatch,
       what + " has element format '" + original + "' (" + std::to_string(view.itemsize) +
           " bytes), which troupe does not take: float32, float16, float64, int32 or int64");
}

/// The object whose buffer holds the values of `object`: itself when it exports a buffer (a
/// NumPy array), the NumPy view of a PyTorch CPU tensor, which shares the tensor's memory.
py::object buffer_owner(py::handle object, const std::string& what) {
  if (PyObject_CheckBuffer(object.ptr()))
    return py::reinterpret_borrow<py::object>(object);
  if (py::hasattr(object, "numpy") && py::hasattr(object, "detach") &&
      py::hasattr(object, "device")) {
    const auto device = py::str(object.attr("device")).cast<std::string>();
    if (device != "cpu")
      fail(errc::context_mismatch, what + " is a tensor on " + device +
                                       ": troupe's Python module takes CPU tensors (.cpu())");
    try {
      return object.attr("detach")().attr("numpy")();
    } catch (py::error_already_set& e) {
      fail(errc::invalid_argument,
           what + " is a tensor NumPy cannot view without copying: " + std::string{e.what()});
    }
  }
  fail(errc::invalid_argument,
       what + " is a " + std::string{py::type::of(object).attr("__name__").cast<std::string>()} +
           ", not a NumPy array or a PyTorch CPU tensor");
}

/// An ndarray over the memory of `object` (no copy). `writable`: troupe writes into it (the
/// output of a pull). Fails, naming `what`, for anything it cannot use in place.
ndarray borrow_array(py::handle object, bool writable, const std::string& what) {
  const py::object owner = buffer_owner(object, what);
  auto held = std::make_unique<held_view>();
  if (PyObject_GetBuffer(owner.ptr(), &held->view, PyBUF_RECORDS_RO) != 0) {
    const py::error_already_set cause;
    fail(errc::invalid_argument, what + " exports no usable buffer: " + std::string{cause.what()});
  }
  // From here `lender` owns the view: it is released on every path out.
  std::shared_ptr<const held_view> lender{held.release(), release_or_defer};
  const Py_buffer& view = lender->view;
  if (writable && view.readonly)
    fail(errc::invalid_argument,
         what + " is read-only, and troupe writes into it in place (make it writable, or pass a "
                "copy)");
  if (!PyBuffer_IsContiguous(&view, 'C'))
    fail(errc::invalid_argument, what + " is not C-contiguous: troupe reads and writes it in "
                                        "place (numpy.ascontiguousarray, tensor.contiguous())");
  const dtype type = dtype_of_format(view, what);
  shape_vector shape(view.shape, view.shape + view.ndim);
  try {
    return ndarray::borrow(view.buf, std::move(shape), type, lender);
  } catch (const troupe::exception& e) {
    fail(e.error().code(), what + ": " + e.error().message());
  }
}

// ---------------------------------------------------------------------------------------------
// Keys and the lists of a call.

/// An int (or any object with __index__, but not a bool) or a str.
kv_key key_of(py::handle key) {
  if (py::isinstance<py::str>(key))
    return key.cast<std::string>();
  if (!PyBool_Check(key.ptr()) && PyIndex_Check(key.ptr()))
    return py::reinterpret_steal<py::object>(PyNumber_Index(key.ptr())).cast<std::int64_t>();
  fail(errc::invalid_argument, "a key is an int or a str, not a " +
                                   py::type::of(key).attr("__name__").cast<std::string>() + " (" +
                                   py::repr(key).cast<std::string>() + ")");
}

bool is_list(py::handle object) {
  return py::isinstance<py::list>(object) || py::isinstance<py::tuple>(object);
}

/// Parallel lists of keys and arrays, as kvstore's batch calls take them.
struct key_arrays {
  std::vector<kv_key> keys;
  std::vector<ndarray> arrays;
};

/// Adds the arrays of one key: `value` is an array or a list of arrays (one per device, MXNet's
/// grouping), named "<role> of key K" or "<role> i of key K" in errors.
void add_key(key_arrays& into, const kv_key& key, py::handle value, bool writable,
             const char* role) {
  if (!is_list(value)) {
    into.keys.push_back(key);
    into.arrays.push_back(
        borrow_array(value, writable, std::string{"the "} + role + " of key " + to_string(key)));
    return;
  }
  const auto items = py::reinterpret_borrow<py::sequence>(value);
  if (items.size() == 0)
    fail(errc::empty_list,
         std::string{"the "} + role + " list of key " + to_string(key) + " is empty");
  for (std::size_t i = 0; i < items.size(); ++i) {
    into.keys.push_back(key);
    into.arrays.push_back(
        borrow_array(items[i], writable,
                     std::string{role} + " " + std::to_string(i) + " of key " + to_string(key)));
  }
}

/// MXNet's forms: one key with an array or a list of arrays, or a list of keys with a list of as
/// many values, each an array or a list of arrays.
key_arrays gather(py::handle key, py::handle values, bool writable, const char* role) {
  key_arrays out;
  if (!is_list(key)) {
    add_key(out, key_of(key), values, writable, role);
    return out;
  }
  const auto keys = py::reinterpret_borrow<py::sequence>(key);
  if (keys.size() == 0)
    fail(errc::empty_list, "the list of keys is empty");
  if (!is_list(values) || py::len(values) != keys.size())
    fail(errc::invalid_argument,
         std::to_string(keys.size()) + " keys need a list of " + std::to_string(keys.size()) + " " +
             role + "s, one per key; got " +
             (is_list(values) ? "a list of " + std::to_string(py::len(values))
                              : "a " + py::type::of(values).attr("__name__").cast<std::string>()));
  const auto items = py::reinterpret_borrow<py::sequence>(values);
  for (std::size_t i = 0; i < keys.size(); ++i)
    add_key(out, key_of(keys[i]), items[i], writable, role);
  return out;
}

void check(const status& outcome) {
  outcome.value();
}

// ---------------------------------------------------------------------------------------------
// row_sparse arrays.

/// A NumPy array holding a copy of `array` (on the host).
py::object to_numpy(const ndarray& array) {
  const auto np = py::module_::import("numpy");
  // troupe's dtype names are NumPy's.
  const std::string name{to_string(array.dtype())};
  py::tuple shape(array.shape().size());
  for (std::size_t i = 0; i < array.shape().size(); ++i)
    shape[i] = array.shape()[i];
  py::object out = np.attr("empty")(shape, np.attr(name.c_str()));
  auto target = borrow_array(out, true, "a new NumPy array");
  array.copy_to(target);
  target.wait_to_read();
  return out;
}

/// troupe.RowSparseArray: MXNet's RowSparseNDArray, values and row indices held by troupe (copied
/// from the arrays it was made from).
struct py_row_sparse {
  row_sparse_array array;
};

/// MXNet's row_sparse_array(arg, shape=None): from a dense array, or from (data, indices) with
/// the shape (rows, ...) of the whole array.
py_row_sparse make_row_sparse(py::handle source, py::handle shape) {
  if (py::isinstance<py::tuple>(source) && py::len(source) == 2) {
    const auto pair = py::reinterpret_borrow<py::tuple>(source);
    if (shape.is_none())
      fail(errc::invalid_argument,
           "row_sparse_array((data, indices), shape): the shape of the whole array is needed");
    shape_vector whole;
    for (auto extent : py::reinterpret_borrow<py::sequence>(shape))
      whole.push_back(extent.cast<std::int64_t>());
    auto data = borrow_array(pair[0], false, "row_sparse_array data").copy();
    auto ids = borrow_array(pair[1], false, "row_sparse_array indices");
    if (ids.shape().size() != 1)
      fail(errc::shape_mismatch, "row_sparse_array indices of shape " +
                                     shape_to_string(ids.shape()) + ": one axis of row indices");
    const auto as_int = ids.as_type(dtype::int64).to_vector<std::int64_t>();
    auto made = row_sparse_array::from_rows(data, as_int, whole);
    return {std::move(made).value()};
  }
  if (!shape.is_none())
    fail(errc::invalid_argument, "row_sparse_array(dense, shape): a dense array has its shape; "
                                 "pass shape with (data, indices) only");
  auto dense = borrow_array(source, false, "row_sparse_array's dense array").copy();
  return {row_sparse_array::from_dense(dense).value()};
}

/// Whether `object` is a RowSparseArray, or a non-empty list of them.
bool holds_row_sparse(py::handle object) {
  if (py::isinstance<py_row_sparse>(object))
    return true;
  if (!is_list(object) || py::len(object) == 0)
    return false;
  const auto items = py::reinterpret_borrow<py::sequence>(object);
  return py::isinstance<py_row_sparse>(items[0]);
}

/// holds_row_sparse of `object` or of its first item (a list of keys' values).
bool holds_row_sparse_anywhere(py::handle object) {
  return holds_row_sparse(object) ||
         (is_list(object) && py::len(object) > 0 &&
          holds_row_sparse(py::reinterpret_borrow<py::sequence>(object)[0]));
}

/// The (key, row_sparse value) pairs of a call, in MXNet's forms (as gather's).
struct key_rows {
  std::vector<kv_key> keys;
  std::vector<row_sparse_array> values;
};

void add_rows(key_rows& into, const kv_key& key, py::handle value, const char* role) {
  auto one = [&](py::handle item) {
    if (!py::isinstance<py_row_sparse>(item))
      fail(errc::invalid_argument,
           std::string{"the "} + role + " of key " + to_string(key) + " is a " +
               py::type::of(item).attr("__name__").cast<std::string>() + " among RowSparseArrays");
    into.keys.push_back(key);
    into.values.push_back(item.cast<const py_row_sparse&>().array);
  };
  if (!is_list(value)) {
    one(value);
    return;
  }
  for (auto item : py::reinterpret_borrow<py::sequence>(value))
    one(item);
}

key_rows gather_rows(py::handle key, py::handle values, const char* role) {
  key_rows out;
  if (!is_list(key)) {
    add_rows(out, key_of(key), values, role);
    return out;
  }
  const auto keys = py::reinterpret_borrow<py::sequence>(key);
  if (!is_list(values) || py::len(values) != keys.size())
    fail(errc::invalid_argument, std::to_string(keys.size()) + " keys need a list of " +
                                     std::to_string(keys.size()) + " " + role + "s, one per key");
  const auto items = py::reinterpret_borrow<py::sequence>(values);
  for (std::size_t i = 0; i < keys.size(); ++i)
    add_rows(out, key_of(keys[i]), items[i], role);
  return out;
}

/// A push, pull or pushpull under way (troupe.Request): the kv_requests it started, and the Python
/// objects whose memory they read or write, held until wait() has returned. The C++ side keeps
/// the memory valid by itself (each borrowed ndarray holds a buffer view); these references keep
/// the objects the caller passed, so that a caller who drops its own names cannot have the arrays
/// collected and reused while troupe still reads or writes them.
class py_request {
public:
  py_request(std::vector<kv_request> parts, std::vector<py::object> arrays)
      : parts_(std::move(parts)), arrays_(std::move(arrays)) {}

  /// Waits without the GIL for every part, then raises the first error; later calls return (or
  /// raise) the same. After it returns troupe no longer writes into the outputs (kv_request).
  /// Threads may wait at once: each on its own copies of the parts, the members changed only
  /// with the GIL held.
  void wait() {
    if (!outcome_) {
      const std::vector<kv_request> parts = parts_;
      status first;
      {
        py::gil_scoped_release unlocked;
        for (const auto& part : parts)
          if (auto finished = part.wait(); !finished && first)
            first = std::move(finished);
      }
      if (!outcome_) {
        outcome_ = std::move(first);
        parts_.clear();
        arrays_.clear();
      }
    }
    check(*outcome_);
  }

  /// Whether wait() would return (or raise) without blocking.
  bool done() const {
    if (outcome_)
      return true;
    for (const auto& part : parts_)
      if (!part.ready())
        return false;
    return true;
  }

private:
  std::vector<kv_request> parts_;
  std::vector<py::object> arrays_;
  std::optional<status> outcome_;
};

optimizer_params params_of(const py::dict& params) {
  optimizer_params out;
  for (const auto& [name, value] : params) {
    const auto text = py::str(name).cast<std::string>();
    if (!PyFloat_Check(value.ptr()) && !PyLong_Check(value.ptr()))
      fail(errc::invalid_argument, "optimizer parameter '" + text + "' is a " +
                                       py::type::of(value).attr("__name__").cast<std::string>() +
                                       ", not a number");
    out[text] = value.cast<double>();
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The store.

/// The Python object behind troupe.kv.create(): a kvstore, until close().
class py_kvstore {
public:
  explicit py_kvstore(std::unique_ptr<kvstore> store) : store_(std::move(store)) {}
  ~py_kvstore() {
    // A distributed store says goodbye to its job here, which waits for the actors.
    py::gil_scoped_release unlocked;
    store_.reset();
  }

  void close() {
    release_deferred();
    std::unique_ptr<kvstore> store = std::move(store_);
    py::gil_scoped_release unlocked;
    store.reset();
  }

  std::string type() { return open().type(); }
  int rank() { return open().rank(); }
  int num_workers() { return open().num_workers(); }

  void init(py::handle key, py::handle value) {
    if (holds_row_sparse_anywhere(value)) {
      auto rows = gather_rows(key, value, "value");
      run([&](kvstore& kv) { return kv.init(rows.keys, rows.values); });
      return;
    }
    auto batch = gather(key, value, false, "value");
    run([&](kvstore& kv) { return kv.init(batch.keys, batch.arrays); });
  }
  // The blocking push, pull and pushpull are the asynchronous ones waited for.
  void push(py::handle key, py::handle value, int priority) {
    if (holds_row_sparse_anywhere(value)) {
      auto rows = gather_rows(key, value, "value");
      run([&](kvstore& kv) { return kv.push(rows.keys, rows.values, priority); });
      return;
    }
    push_async(key, value, priority).wait();
  }
  /// MXNet's pull: a RowSparseArray output is skipped under ignore_sparse (its default), and an
  /// error otherwise (its rows come with row_sparse_pull).
  void pull(py::handle key, py::handle out, int priority, bool ignore_sparse) {
    if (holds_row_sparse_anywhere(out)) {
      if (ignore_sparse)
        return;
      fail(errc::invalid_argument,
           "pull into a RowSparseArray with ignore_sparse=False: pull its rows with "
           "row_sparse_pull(key, out=..., row_ids=...)");
    }
    pull_async(key, out, priority).wait();
  }
  /// MXNet's row_sparse_pull: out (a RowSparseArray, or a list of them, one per key) receives
  /// the rows row_ids names (any shape, any integer or integer-valued float type, repeats
  /// allowed), every other row zero.
  void row_sparse_pull(py::handle key, py::handle out, int priority, py::handle row_ids) {
    if (out.is_none() || row_ids.is_none())
      fail(errc::invalid_argument, "row_sparse_pull needs out= (RowSparseArray) and row_ids=");
    std::vector<kv_key> keys;
    std::vector<py_row_sparse*> outputs;
    std::vector<ndarray> ids;
    auto one = [&](const kv_key& k, py::handle o, py::handle r) {
      if (!py::isinstance<py_row_sparse>(o))
        fail(errc::invalid_argument, "row_sparse_pull of key " + to_string(k) + ": out is a " +
                                         py::type::of(o).attr("__name__").cast<std::string>() +
                                         ", not a RowSparseArray");
      keys.push_back(k);
      outputs.push_back(&o.cast<py_row_sparse&>());
      ids.push_back(borrow_array(r, false, "row_ids of key " + to_string(k)).copy());
    };
    if (is_list(key)) {
      const auto ks = py::reinterpret_borrow<py::sequence>(key);
      if (!is_list(out) || py::len(out) != ks.size() || !is_list(row_ids) ||
          py::len(row_ids) != ks.size())
        fail(errc::invalid_argument,
             std::to_string(ks.size()) + " keys need lists of as many outputs and row_ids");
      const auto os = py::reinterpret_borrow<py::sequence>(out);
      const auto rs = py::reinterpret_borrow<py::sequence>(row_ids);
      for (std::size_t i = 0; i < ks.size(); ++i)
        one(key_of(ks[i]), os[i], rs[i]);
    } else {
      one(key_of(key), out, row_ids);
    }
    std::vector<row_sparse_array> pulled(keys.size());
    run([&](kvstore& kv) { return kv.row_sparse_pull(keys, pulled, ids, priority); });
    for (std::size_t i = 0; i < keys.size(); ++i)
      outputs[i]->array = std::move(pulled[i]);
  }
  void pushpull(py::handle key, py::handle value, py::handle out, int priority) {
    pushpull_async(key, value, out, priority).wait();
  }

  py_request push_async(py::handle key, py::handle value, int priority) {
    auto batch = gather(key, value, false, "value");
    return start({value}, [&](kvstore& kv) {
      return std::vector{kv.push_async(batch.keys, batch.arrays, priority)};
    });
  }
  py_request pull_async(py::handle key, py::handle out, int priority) {
    if (out.is_none())
      fail(errc::invalid_argument, "pull needs out=: the arrays it writes the values into");
    auto batch = gather(key, out, true, "output");
    return start({out}, [&](kvstore& kv) {
      return std::vector{kv.pull_async(batch.keys, batch.arrays, priority)};
    });
  }
  /// MXNet's pushpull: without `out` the values are written back into `value`.
  py_request pushpull_async(py::handle key, py::handle value, py::handle out, int priority) {
    auto values = gather(key, value, out.is_none(), "value");
    if (out.is_none())
      return start({value}, [&](kvstore& kv) {
        return std::vector{kv.pushpull_async(values.keys, values.arrays, values.arrays, priority)};
      });
    auto outputs = gather(key, out, true, "output");
    return start({value, out}, [&](kvstore& kv) {
      if (values.keys == outputs.keys)
        return std::vector{kv.pushpull_async(values.keys, values.arrays, outputs.arrays, priority)};
      // Lists of another length per key than the values': a push, then a pull, which the store
      // orders after it. A push refused at once (its arguments) starts no pull.
      auto pushed = kv.push_async(values.keys, values.arrays, priority);
      if (pushed.ready() && !pushed.wait())
        return std::vector{pushed};
      return std::vector{pushed, kv.pull_async(outputs.keys, outputs.arrays, priority)};
    });
  }
  /// init then pull (the outputs of a key may be a list, as pull's).
  void broadcast(py::handle key, py::handle value, py::handle out, int priority) {
    auto values = gather(key, value, false, "value");
    auto outputs = gather(key, out, true, "output");
    run([&](kvstore& kv) {
      if (auto initialised = kv.init(values.keys, values.arrays); !initialised)
        return initialised;
      return kv.pull(outputs.keys, outputs.arrays, priority);
    });
  }
  void barrier() {
    run([](kvstore& kv) { return kv.barrier(); });
  }
  void leave() {
    run([](kvstore& kv) { return kv.leave(); });
  }
  void set_optimizer(const std::string& name, const py::dict& params) {
    const auto hyper = params_of(params);
    run([&](kvstore& kv) { return kv.set_optimizer(name, hyper); });
  }
  void set_gradient_compression(const py::dict& params) {
    std::optional<std::string> type;
    std::optional<double> threshold;
    bool pulls = false;
    for (const auto& [name, value] : params) {
      const auto key = py::str(name).cast<std::string>();
      if (key == "type") {
        if (!py::isinstance<py::str>(value))
          fail(errc::invalid_argument, "gradient compression 'type' must be a string");
        type = value.cast<std::string>();
      } else if (key == "threshold") {
        // MXNet passes its parameters as strings: "0.5" is taken as 0.5.
        try {
          threshold = py::float_(py::reinterpret_borrow<py::object>(value)).cast<double>();
        } catch (const py::error_already_set&) {
          fail(errc::invalid_argument, "gradient compression threshold " +
                                           py::repr(value).cast<std::string>() +
                                           " is not a number");
        }
      } else if (key == "pulls") {
        if (!py::isinstance<py::bool_>(value))
          fail(errc::invalid_argument, "gradient compression 'pulls' must be True or False");
        pulls = value.cast<bool>();
      } else {
        fail(errc::invalid_argument, "gradient compression has no parameter '" + key +
                                         "' (it takes type, threshold and pulls)");
      }
    }
    if (!type)
      fail(errc::invalid_argument,
           "gradient compression needs a 'type': {'type': '2bit', 'threshold': 0.5}");
    run([&](kvstore& kv) { return kv.set_gradient_compression(*type, threshold, pulls); });
  }
  bool is_capable(const std::string& capability) { return open().is_capable(capability); }
  void save_optimizer_states(const std::string& path, bool dump_optimizer) {
    run([&](kvstore& kv) { return kv.save_optimizer_states(path, dump_optimizer); });
  }
  void load_optimizer_states(const std::string& path) {
    run([&](kvstore& kv) { return kv.load_optimizer_states(path); });
  }

private:
  kvstore& open() {
    release_deferred();
    if (!store_)
      fail(errc::invalid_argument, "the store is closed");
    return *store_;
  }

  /// Starts the requests `call` returns without the GIL; the handle holds `arrays`.
  template <class Call>
  py_request start(std::initializer_list<py::handle> arrays, Call&& call) {
    kvstore& kv = open();
    std::vector<py::object> held;
    for (auto array : arrays)
      held.push_back(py::reinterpret_borrow<py::object>(array));
    std::vector<kv_request> parts;
    {
      py::gil_scoped_release unlocked;
      parts = call(kv);
    }
    return py_request{std::move(parts), std::move(held)};
  }

  /// Runs `call` on the store without the GIL and raises its error, if any.
  template <class Call>
  void run(Call&& call) {
    kvstore& kv = open();
    status outcome;
    {
      py::gil_scoped_release unlocked;
      outcome = call(kv);
    }
    check(outcome);
  }

  std::unique_ptr<kvstore> store_;
};

} // namespace
} // namespace troupe::python

PYBIND11_MODULE(_troupe, m) {
  using namespace troupe;
  using troupe::python::fail;
  using troupe::python::py_kvstore;
  using troupe::python::py_request;
  using troupe::python::py_row_sparse;
  using troupe::python::to_numpy;
  m.doc() = "troupe's KVStore for NumPy arrays and PyTorch CPU tensors (docs/python.md)";

  // troupe.Error: every failure of a call, with .code the error's kind ("unknown_key",
  // "shape_mismatch", ...) and the message naming the key and the values.
  // Held for the process's life (released, never destroyed after the interpreter).
  static const py::handle error_type =
      py::exception<troupe::exception>(m, "Error", PyExc_RuntimeError).release();
  py::register_exception_translator([](std::exception_ptr raised) {
    try {
      if (raised)
        std::rethrow_exception(raised);
    } catch (const troupe::exception& e) {
      py::object error = error_type(e.what());
      error.attr("code") = std::string{to_string(e.error().code())};
      PyErr_SetObject(error_type.ptr(), error.ptr());
    }
  });

  py::class_<py_kvstore>(m, "KVStore", "A KVStore: MXNet's mx.kv.KVStore calls on troupe")
      .def_property_readonly("type", &py_kvstore::type, "the type it was created with")
      .def_property_readonly("rank", &py_kvstore::rank, "this worker's rank (0 in local stores)")
      .def_property_readonly("num_workers", &py_kvstore::num_workers, "the job's workers")
      .def("init", &py_kvstore::init, py::arg("key"), py::arg("value"),
           "Declares keys and their initial values.")
      .def("push", &py_kvstore::push, py::arg("key"), py::arg("value"), py::arg("priority") = 0,
           "Pushes values; the values of one key are summed (then the optimizer runs, if set).")
      .def("pull", &py_kvstore::pull, py::arg("key"), py::arg("out") = py::none(),
           py::arg("priority") = 0, py::arg("ignore_sparse") = true,
           "Writes each key's value into out, in place. A RowSparseArray out is skipped "
           "(ignore_sparse=True, MXNet's default) or an error: its rows come with "
           "row_sparse_pull.")
      .def("row_sparse_pull", &py_kvstore::row_sparse_pull, py::arg("key"),
           py::arg("out") = py::none(), py::arg("priority") = 0, py::arg("row_ids") = py::none(),
           "Fills out (a RowSparseArray) with the rows row_ids names of a row_sparse key, every "
           "other row zero; row_ids may be unsorted, repeated, of any shape and of an integer "
           "or integer-valued float type.")
      .def("pushpull", &py_kvstore::pushpull, py::arg("key"), py::arg("value"),
           py::arg("out") = py::none(), py::arg("priority") = 0,
           "push then pull; without out the result is written into value.")
      .def("push_async", &py_kvstore::push_async, py::arg("key"), py::arg("value"),
           py::arg("priority") = 0,
           "push, started without waiting: returns a Request. The values must stay alive and "
           "unchanged until its wait() returns (the Request holds references to them).")
      .def("pull_async", &py_kvstore::pull_async, py::arg("key"), py::arg("out") = py::none(),
           py::arg("priority") = 0,
           "pull, started without waiting: returns a Request. out must not be read or written "
           "until its wait() returns.")
      .def("pushpull_async", &py_kvstore::pushpull_async, py::arg("key"), py::arg("value"),
           py::arg("out") = py::none(), py::arg("priority") = 0,
           "pushpull, started without waiting: returns a Request; value and out are the "
           "Request's until its wait() returns.")
      .def("broadcast", &py_kvstore::broadcast, py::arg("key"), py::arg("value"), py::arg("out"),
           py::arg("priority") = 0, "init then pull.")
      .def("barrier", &py_kvstore::barrier, "Waits until every worker of the job has called it.")
      .def(
          "set_optimizer",
          [](py_kvstore& self, const std::string& name, py::object params, py::kwargs kwargs) {
            py::dict all;
            if (!params.is_none())
              all = py::dict(params);
            for (const auto& [key, value] : kwargs)
              all[key] = value;
            self.set_optimizer(name, all);
          },
          py::arg("name"), py::arg("params") = py::none(),
          "Runs the optimizer `name` (sgd, nag, adam, rmsprop, adagrad, test) in the store on "
          "every push, with MXNet's parameter names: set_optimizer('sgd', learning_rate=0.1).")
      .def("set_gradient_compression", &py_kvstore::set_gradient_compression,
           py::arg("compression_params"),
           "Compresses pushes from now on, MXNet's way: {'type': '2bit', 'threshold': 0.5} "
           "sends +t, -t or 0 per element, {'type': '1bit', 'threshold': 0} +1 or -1, the rest "
           "kept in a residual for the next push. device and dist_* stores; 'none' turns it off.")
      .def("is_capable", &py_kvstore::is_capable, py::arg("capability"))
      .def("save_optimizer_states", &py_kvstore::save_optimizer_states, py::arg("fname"),
           py::arg("dump_optimizer") = false)
      .def("load_optimizer_states", &py_kvstore::load_optimizer_states, py::arg("fname"))
      .def("leave", &py_kvstore::leave,
           "This worker leaves the job while the others go on: once its requests are answered, "
           "the rounds after its last push close without it and barriers stop waiting for it. "
           "Later calls raise troupe.Error.")
      .def("close", &py_kvstore::close,
           "Leaves the job (distributed types) and frees the store; later calls raise.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py_kvstore& self, const py::args&) {
        self.close();
        return false;
      });

  py::class_<py_row_sparse>(m, "RowSparseArray",
                            "MXNet's RowSparseNDArray: some rows of a (rows, ...) array, every "
                            "other row zero. Made by row_sparse_array().")
      .def(py::init([](py::tuple shape, const std::string& dtype_name) {
             shape_vector whole;
             for (auto extent : shape)
               whole.push_back(extent.cast<std::int64_t>());
             auto type = parse_dtype(dtype_name);
             if (!type)
               fail(errc::invalid_argument, "RowSparseArray of dtype '" + dtype_name + "'");
             if (whole.empty())
               fail(errc::invalid_argument, "a RowSparseArray has at least one axis");
             return py_row_sparse{row_sparse_array::zeros(whole, *type)};
           }),
           py::arg("shape"), py::arg("dtype") = "float32",
           "All zeros of `shape` (no row stored): an output for row_sparse_pull.")
      .def_property_readonly("shape",
                             [](const py_row_sparse& self) {
                               py::tuple shape(self.array.shape().size());
                               for (std::size_t i = 0; i < self.array.shape().size(); ++i)
                                 shape[i] = self.array.shape()[i];
                               return shape;
                             })
      .def_property_readonly(
          "dtype",
          [](const py_row_sparse& self) { return std::string{to_string(self.array.dtype())}; })
      .def_property_readonly(
          "data", [](const py_row_sparse& self) { return to_numpy(self.array.data()); },
          "the stored rows' values, shape (stored rows, ...): a copy")
      .def_property_readonly(
          "indices",
          [](const py_row_sparse& self) {
            const auto& ids = self.array.indices();
            auto array = ndarray::empty({static_cast<std::int64_t>(ids.size())}, context::cpu(),
                                        dtype::int64);
            if (!ids.empty())
              std::memcpy(array.raw_data(), ids.data(), ids.size() * sizeof(std::int64_t));
            return to_numpy(array);
          },
          "the stored rows' indices, strictly increasing (int64): a copy")
      .def(
          "asnumpy", [](const py_row_sparse& self) { return to_numpy(self.array.to_dense()); },
          "the dense array, zero where no row is stored")
      .def(
          "tostype",
          [](const py_row_sparse& self, const std::string& stype) -> py::object {
            if (stype == "default")
              return to_numpy(self.array.to_dense());
            if (stype == "row_sparse")
              return py::cast(self);
            fail(errc::invalid_argument,
                 "tostype('" + stype + "'): 'default' (dense) or 'row_sparse'");
          },
          py::arg("stype"))
      .def("__repr__", [](const py_row_sparse& self) {
        return "<RowSparseArray " + shape_to_string(self.array.shape()) + " " +
               std::string{to_string(self.array.dtype())} + ", " +
               std::to_string(self.array.stored_rows()) + " rows stored>";
      });
  m.def("row_sparse_array", &troupe::python::make_row_sparse, py::arg("arg1"),
        py::arg("shape") = py::none(),
        "MXNet's row_sparse_array: from a dense array (the rows holding a non-zero), or from "
        "(data, indices) with the whole array's shape. The values are copied.");

  py::class_<py_request>(m, "Request",
                         "A push, pull or pushpull under way (push_async, pull_async, "
                         "pushpull_async). It holds the arrays it was given until wait() returns; "
                         "dropped unfinished, it is cancelled and never writes into them.")
      .def("wait", &py_request::wait,
           "Blocks without the GIL until the request is done; raises troupe.Error if it failed. "
           "Calling it again returns (or raises) the same.")
      .def("done", &py_request::done, "Whether wait() would return without blocking.");

  m.def(
      "create",
      [](const std::string& type) {
        troupe::python::release_deferred();
        result<std::unique_ptr<kvstore>> made{error{errc::internal, {}}};
        {
          py::gil_scoped_release unlocked;
          made = kvstore::create(type);
        }
        return std::make_unique<py_kvstore>(std::move(made).value());
      },
      py::arg("type") = "local",
      "A KVStore of MXNet's type name: local, device, or (in a process started by "
      "troupe-launch, or with the DMLC_* variables set) dist_sync, dist_async, "
      "dist_device_sync, dist_device_async.");
}

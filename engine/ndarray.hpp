#pragma once
// ndarray: MXNet's NDArray. A handle to a shape, an element type, a context and reference-counted
// storage; copying a handle shares the storage (as `b = a` does in MXNet), copy() duplicates it.
// reshape() and slice() are views on the same storage. Operations go through the dependency
// engine (engine/dispatch.hpp): without a device backend they run on the calling thread and are
// complete when the call returns; with one (the device actors) they are queued on the array's
// context and the call returns at once, and reading the values waits for them. Checks on shapes,
// dtypes and contexts run on the caller either way; an error inside queued work is thrown at the
// next wait on the array it writes.
//
// Storage of every size comes from storage_pool (engine/storage.hpp): freed blocks are kept and
// reused, because the first write to fresh memory runs at ~0.3 GB/s on these machines against
// 12+ GB/s for warm memory.
//
// Caller mistakes (shapes that do not match, a gpu context without a GPU, a dtype an operation
// does not take) throw troupe::exception with the values named.

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/context.hpp"
#include "engine/dtype.hpp"
#include "engine/error.hpp"

namespace troupe {

/// Extent of each axis; an empty shape is a scalar of one element.
using shape_vector = std::vector<std::int64_t>;

/// Product of the extents (1 for a scalar shape).
std::int64_t element_count(const shape_vector& shape) noexcept;
/// "(2,3)" as MXNet prints shapes; "(4,)" for one axis (Python's tuple), "()" for a scalar.
std::string shape_to_string(const shape_vector& shape);
/// "2x3" as MXNet's NDArray repr writes them; "" for a scalar.
std::string shape_to_repr(const shape_vector& shape);
/// The shortest text that reads back as the same double ("0.5", not "0.500000"), for messages
/// and attribute strings.
std::string number_text(double value);
/// `to` with its -1 (at most one) replaced by the extent that makes it hold as many elements as
/// `from`: what ndarray::reshape and the Reshape operator accept. Throws troupe::exception
/// starting "<operation>: ": invalid_argument for a second -1 or a negative extent,
/// shape_mismatch when the element counts cannot agree. `input` names the reshaped array in those
/// messages as operator errors do ("input 'data' of shape (2,3) (6 elements)"); empty, the array
/// is named by its shape ("(2,3) of 6 elements").
shape_vector infer_reshape(const shape_vector& from, shape_vector to, std::string_view operation,
                           std::string_view input = {});

class storage;
struct autograd_entry;

/// How a backward pass stores a variable's gradient (MXNet's grad_req): not at all, overwrite
/// it, or add to it.
enum class grad_req : std::uint8_t { null, write, add };

class ndarray {
public:
  /// The none handle: no storage, is_none() is true; any other use throws.
  ndarray() = default;
  /// Uninitialised storage (MXNet's nd.empty).
  ndarray(shape_vector shape, context ctx = context::cpu(), dtype type = dtype::float32);

  static ndarray empty(shape_vector shape, context ctx = context::cpu(),
                       dtype type = dtype::float32);
  static ndarray zeros(shape_vector shape, context ctx = context::cpu(),
                       dtype type = dtype::float32);
  static ndarray ones(shape_vector shape, context ctx = context::cpu(),
                      dtype type = dtype::float32);
  static ndarray full(shape_vector shape, double value, context ctx = context::cpu(),
                      dtype type = dtype::float32);
  /// Copies `values` (converted to `type`) into a new array; values.size() must equal the shape's
  /// element count.
  static ndarray from_values(std::span<const float> values, shape_vector shape,
                             context ctx = context::cpu(), dtype type = dtype::float32);
  static ndarray from_values(std::initializer_list<float> values, shape_vector shape,
                             context ctx = context::cpu(), dtype type = dtype::float32);
  /// An array over `shape` elements of `type` at `data`, memory that troupe does not own (a NumPy
  /// array's, a tensor's): no copy is made, and writes to the array write that memory. `lender`
  /// keeps the memory alive; it is dropped when the last handle sharing the storage goes, which
  /// may be on another thread (an actor's, after a request completes). Host memory only (a cpu
  /// context); `data` must be aligned to the element size, and null only for zero elements (an
  /// empty array then gets storage of its own). Throws troupe::exception (invalid_argument)
  /// naming what is wrong.
  static ndarray borrow(void* data, shape_vector shape, dtype type,
                        std::shared_ptr<const void> lender, context ctx = context::cpu());
  /// Seeded uniform samples in [low, high): the same seed gives the same array on any context.
  static ndarray random_uniform(double low, double high, shape_vector shape, std::uint64_t seed,
                                context ctx = context::cpu(), dtype type = dtype::float32);
  /// Seeded normal samples with the given mean and standard deviation.
  static ndarray random_normal(double mean, double stddev, shape_vector shape, std::uint64_t seed,
                               context ctx = context::cpu(), dtype type = dtype::float32);

  bool is_none() const noexcept { return storage_ == nullptr; }
  const shape_vector& shape() const noexcept { return shape_; }
  std::size_t ndim() const noexcept { return shape_.size(); }
  /// Number of elements.
  std::int64_t size() const noexcept { return element_count(shape_); }
  /// size() * size_of(dtype()); 0 for the none handle.
  std::size_t nbytes() const noexcept;
  troupe::dtype dtype() const noexcept { return dtype_; }
  context ctx() const noexcept { return ctx_; }

  /// Address of the first element (device memory for gpu contexts).
  void* raw_data();
  const void* raw_data() const;
  /// Typed host access; throws when T does not match dtype() (std::uint16_t for float16) or the
  /// array is not on a cpu context. T is one of float, double, std::int32_t, std::int64_t,
  /// std::uint16_t.
  template <class T>
  T* data();
  template <class T>
  const T* data() const;

  /// True when both handles view the same storage block.
  bool shares_storage_with(const ndarray& other) const noexcept;
  /// True when another handle (or a keepalive()) holds this array's storage too: a writer that
  /// must not disturb readers replaces the storage instead of overwriting it.
  bool storage_is_shared() const noexcept {
    return storage_ != nullptr && storage_.use_count() > 1;
  }
  /// Shared ownership of the storage block, for code outside the engine that must keep the bytes
  /// alive while it reads them (a frame being written to a socket).
  std::shared_ptr<const void> keepalive() const noexcept { return storage_; }
  /// The storage block itself (the dependency engine names arrays by their blocks).
  const std::shared_ptr<storage>& block() const noexcept { return storage_; }

  /// Waits until the work queued on this array (engine/dispatch.hpp) is done and throws the error
  /// it failed with, naming the operation and the context (MXNet's wait_to_read). Reading the
  /// values (to_vector, data<T>(), raw_data()) waits in the same way.
  void wait_to_read() const;
  /// Waits also for the queued work that reads this array: after it, nothing queued uses the
  /// array (MXNet's wait_to_write), and code outside the engine may write it.
  void wait_to_write() const;

  /// A new array on `target` holding the same values (a copy even when target == ctx()).
  ndarray copy_to(context target) const;
  /// Copies values into `destination`, which must have the same shape; converts dtype and moves
  /// across contexts as needed (MXNet's copyto). Float -> integer truncates toward zero and
  /// saturates (NaN gives 0); to float16 rounds to nearest even.
  void copy_to(ndarray& destination) const;
  ndarray copy() const { return copy_to(ctx_); }
  ndarray as_type(troupe::dtype type) const;

  /// A view with another shape of the same element count; -1 in one axis is inferred.
  ndarray reshape(shape_vector shape) const;
  /// A view of rows [begin, end) along the first axis; 0 <= begin <= end <= shape()[0].
  ndarray slice(std::int64_t begin, std::int64_t end) const;
  /// A view of row `index` along the first axis, with that axis dropped; 0 <= index < shape()[0].
  ndarray at(std::int64_t index) const;

  ndarray& fill(double value);
  /// Values converted to T (host copy from any context and dtype); T is one of float, double,
  /// std::int32_t, std::int64_t.
  template <class T>
  std::vector<T> to_vector() const;
  /// The only element of a one-element array, as double.
  double as_scalar() const;

  // Element-wise arithmetic; shapes must be equal (no broadcasting), or one side a scalar (an
  // array of one element, any shape). Results live on the left operand's context; operands must
  // share context and dtype. A double operand is first converted to the dtype (as MXNet's scalar
  // operators do: int32 * 0.5 multiplies by 0); integers divide truncating, and an integer
  // division by zero throws. float16 computes in float32 and rounds each result once. On gpu
  // contexts float32 add/sub/mul/scale run on the CUDA kernels; division and other dtypes are
  // computed on the host and copied back (correct, not fast).
  ndarray operator-() const;
  ndarray& operator+=(const ndarray& rhs);
  ndarray& operator-=(const ndarray& rhs);
  ndarray& operator*=(const ndarray& rhs);
  ndarray& operator/=(const ndarray& rhs);
  ndarray& operator+=(double rhs);
  ndarray& operator-=(double rhs);
  ndarray& operator*=(double rhs);
  ndarray& operator/=(double rhs);
  friend ndarray operator+(const ndarray& lhs, const ndarray& rhs);
  friend ndarray operator-(const ndarray& lhs, const ndarray& rhs);
  friend ndarray operator*(const ndarray& lhs, const ndarray& rhs);
  friend ndarray operator/(const ndarray& lhs, const ndarray& rhs);
  friend ndarray operator+(const ndarray& lhs, double rhs);
  friend ndarray operator-(const ndarray& lhs, double rhs);
  friend ndarray operator*(const ndarray& lhs, double rhs);
  friend ndarray operator/(const ndarray& lhs, double rhs);
  friend ndarray operator+(double lhs, const ndarray& rhs);
  friend ndarray operator*(double lhs, const ndarray& rhs);

  /// Σ of all elements and sqrt(Σ x²), accumulated in double.
  double sum() const;
  double l2_norm() const;

  // Autograd (engine/autograd.hpp). Copies of a handle share its autograd state; views made by
  // reshape/slice/at and copies made by copy/copy_to/as_type start without history.

  /// MXNet's attach_grad: gives this array a gradient buffer (zeros, same shape, dtype and
  /// context) that backward() fills as `req` says, and makes it a leaf of recorded graphs.
  /// Handles copied from this one afterwards share the gradient.
  void attach_grad(troupe::grad_req req = troupe::grad_req::write);
  /// The gradient buffer of attach_grad; the none handle when there is none.
  ndarray grad() const;
  /// grad_req::null when no gradient is attached.
  troupe::grad_req gradient_request() const noexcept;
  /// The same values without recorded history or gradient (MXNet's detach).
  ndarray detach() const;
  /// autograd::backward(*this, head_grad, retain_graph); the none handle as head_grad means
  /// ones.
  void backward() const;
  void backward(const ndarray& head_grad, bool retain_graph = false) const;
  /// The autograd and tracing state (engine internals: autograd.cpp and trace.cpp).
  const std::shared_ptr<autograd_entry>& autograd_state() const noexcept { return autograd_; }
  void set_autograd_state(std::shared_ptr<autograd_entry> state) noexcept {
    autograd_ = std::move(state);
  }

  /// MXNet's print form: the values as numpy 1.x's str() prints them, then a line
  /// "<NDArray 2x3 @cpu(0)>"; "<NDArray none>" for the none handle.
  std::string to_string() const;

private:
  /// copy_to(ndarray&) and fill() as they run on the array's lane.
  void copy_values_to(ndarray& destination) const;
  void fill_values(double value);
  void require_some(const char* operation) const;

  std::shared_ptr<storage> storage_;
  std::size_t byte_offset_ = 0; // start of this view inside storage_
  shape_vector shape_;
  troupe::dtype dtype_ = troupe::dtype::float32;
  context ctx_;
  std::shared_ptr<autograd_entry> autograd_;
};

std::ostream& operator<<(std::ostream& out, const ndarray& array);

/// out = Σ inputs (all of one shape, dtype and context as `out`, or any cpu context when `out` is
/// on one: they are all host memory); used by the KVStore's
/// reduction for cpu and gpu contexts alike. An empty list zero-fills. One pass of the kernels'
/// sum_n, summing in input order (reproducible); `out` may be inputs[0] itself, and is computed
/// through a pooled temporary when it overlaps any other input. float16 accumulates in float32
/// and rounds once; on gpu contexts only float32 runs on the device, other dtypes on the host.
void sum_into(std::span<const ndarray> inputs, ndarray& out);
/// y += alpha * x (same shape, dtype, context); alpha is converted to the dtype for integers,
/// to float32 for float16.
void axpy(double alpha, const ndarray& x, ndarray& y);

} // namespace troupe

#pragma once
// Autograd: MXNet's imperative differentiation (python/mxnet/autograd.py).
//
//   auto w = ndarray::random_normal(0, 1, {3, 4}, 7);
//   w.attach_grad();                                  // grad_req write
//   {
//     autograd::record_scope record;                   // with autograd.record():
//     auto loss = nd::sum(nd::relu(nd::fully_connected(x, w, {}, 3, true)));
//     loss.backward();                                  // w.grad() now holds d loss / d w
//   }
//
// Inside a record scope every operator call (engine/nd.hpp, and ndarray's + - * / between
// arrays) whose inputs carry history or an attached gradient is put on the graph: the output
// remembers the call that made it. backward() walks that graph from the head in reverse order of
// the calls, and writes (grad_req write) or adds (grad_req add) each attached gradient; arrays
// with grad_req null get nothing. In-place operators (+=, fill, copy_to into an array) are not
// recorded, and views made by ndarray::reshape/slice carry no history: inside a record scope use
// nd::reshape / nd::flatten.
//
// Row-sparse gradients (MXNet's attach_grad(stype='row_sparse')): an array given one by
// attach_row_sparse_grad receives from an operator that can make one (nd::embedding with
// sparse_grad, for its weight) only the rows the call touched; a dense contribution from any other
// operator is converted (its non-zero rows). With grad_req add the rows are summed into what is
// there (sum_rows). Such a gradient is computed on the calling thread when backward() reaches it.
//
// The graph is held by the arrays that carry history; backward() without retain_graph releases
// it (a second backward through it is an error naming the head). Scopes are per thread.

#include <functional>
#include <span>
#include <vector>

#include "engine/ndarray.hpp"
#include "engine/row_sparse.hpp"

namespace troupe::autograd {

/// autograd.record(train_mode): records operator calls on this thread while alive; nests.
class record_scope {
public:
  explicit record_scope(bool train_mode = true);
  ~record_scope();
  record_scope(const record_scope&) = delete;
  record_scope& operator=(const record_scope&) = delete;

private:
  bool previous_recording_;
  bool previous_training_;
};

/// autograd.pause(train_mode): stops recording on this thread while alive.
class pause_scope {
public:
  explicit pause_scope(bool train_mode = false);
  ~pause_scope();
  pause_scope(const pause_scope&) = delete;
  pause_scope& operator=(const pause_scope&) = delete;

private:
  bool previous_recording_;
  bool previous_training_;
};

/// autograd.train_mode() / predict_mode(): sets the training flag without touching recording.
class training_scope {
public:
  explicit training_scope(bool training);
  ~training_scope();
  training_scope(const training_scope&) = delete;
  training_scope& operator=(const training_scope&) = delete;

private:
  bool previous_training_;
};

bool is_recording() noexcept;
/// Training mode: set by record_scope(true) and training_scope(true); Dropout drops only then.
bool is_training() noexcept;

/// Gradients of `heads` with respect to every array with an attached gradient that they were
/// computed from. head_grads[i] is the gradient of heads[i] (ones when the list is empty or the
/// entry is the none handle, as MXNet's head gradient defaults). A head without recorded history
/// is an error (errc::invalid_argument) naming its shape.
void backward(std::span<const ndarray> heads, std::span<const ndarray> head_grads = {},
              bool retain_graph = false);
void backward(const ndarray& head, const ndarray& head_grad = {}, bool retain_graph = false);

/// Gives `array` a row_sparse gradient (no rows: all zeros) that backward() fills instead of a
/// dense one; array.grad() is then the none handle. `array` must have at least one axis.
void attach_row_sparse_grad(ndarray& array, grad_req req = grad_req::write);
/// True when `array` has a gradient from attach_row_sparse_grad.
bool has_row_sparse_grad(const ndarray& array) noexcept;
/// That gradient; errc::invalid_argument when `array` has none.
row_sparse_array row_sparse_grad(const ndarray& array);
/// Replaces it (a trainer writing back reduced gradients, zero_grad); errc::invalid_argument when
/// `array` has none, errc::shape_mismatch when `value` is not of its shape.
void set_row_sparse_grad(const ndarray& array, row_sparse_array value);

/// Computes a custom step's input gradients from its outputs' gradients. input_grads[i] is the
/// none handle when input i needs no gradient; otherwise an array of input i's shape to
/// overwrite (for a parameter's first contribution, its attached gradient itself, so nothing is
/// copied afterwards).
using custom_backward =
    std::function<void(std::span<const ndarray> output_grads, std::span<ndarray> input_grads)>;

/// Records a computation made outside the operator registry (a hybridized block's executor) as
/// one step of the graph when recording is on and some input carries history or a gradient:
/// `outputs` get that step as their history, and backward() calls `backward` with their
/// gradients and passes the gradients it writes on to `inputs`. Does nothing otherwise.
void record_custom(std::span<const ndarray> inputs, std::span<ndarray> outputs,
                   custom_backward backward);

} // namespace troupe::autograd

#pragma once
// nn::parameter: a named weight of a block with one copy per context (gluon.Parameter).
//
// A parameter is declared with a shape whose unknown extents are 0 (a dense layer's input size
// before it has seen data); initialize() records the contexts and the initializer, and the
// arrays are created as soon as the shape is complete — at once, or at the block's first forward
// (MXNet's deferred initialisation). Every context holds the same initial values. With a
// grad_req other than null each copy has a gradient attached (ndarray::attach_grad), which
// backward() fills.
//
// Storage (gluon's stype and grad_stype). A parameter with a row_sparse gradient (an embedding
// with sparse_grad) gets, per context, a gradient that backward fills with only the rows a batch
// touched (autograd::attach_row_sparse_grad): read it with row_sparse_grad(), not grad(). A
// row_sparse weight (stype row_sparse, which implies a row_sparse gradient) lives in a kvstore:
// its forward reads it through row_sparse_data(row_ids), which asks the trainer the parameter
// belongs to (actors/gluon/trainer.hpp) to pull those rows into the context's copy. That copy is a
// dense array on the worker, current only in the rows pulled last; data() returns it.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/context.hpp"
#include "engine/error.hpp"
#include "engine/ndarray.hpp"
#include "engine/row_sparse.hpp"

namespace troupe::nn {

class initializer;

class parameter {
public:
  /// An error (errc::invalid_argument) names the parameter for a negative extent, and for a
  /// row_sparse weight or gradient of a scalar shape or a row_sparse weight with a dense gradient.
  parameter(std::string name, shape_vector shape, grad_req req = grad_req::write,
            std::shared_ptr<const initializer> init = nullptr,
            storage_type stype = storage_type::dense,
            storage_type grad_stype = storage_type::dense);

  const std::string& name() const noexcept { return name_; }
  const shape_vector& shape() const noexcept { return shape_; }
  grad_req req() const noexcept { return req_; }
  storage_type stype() const noexcept { return stype_; }
  storage_type grad_stype() const noexcept { return grad_stype_; }
  /// Scale of the learning rate and weight decay for this parameter (gluon's lr_mult/wd_mult).
  double lr_mult = 1.0;
  double wd_mult = 1.0;

  /// Chooses the contexts and the initializer (this parameter's own one when it has one, else
  /// `default_init`); `seed` makes the values reproducible. Creates the arrays when the shape is
  /// complete. Initialising twice is an error naming the parameter unless force_reinit.
  void initialize(std::shared_ptr<const initializer> default_init,
                  std::span<const context> contexts, std::uint64_t seed, bool force_reinit = false);
  /// Completes a shape declared with 0 extents (an error naming the parameter when it conflicts
  /// with the known extents) and, if initialize() was called, creates the arrays.
  void finish_shape(const shape_vector& shape);
  bool is_initialized() const noexcept { return !data_.empty(); }

  /// The copy on `ctx`; an error naming the parameter and the context when there is none (not
  /// initialised, deferred, or another context).
  ndarray& data(context ctx = context::cpu());
  /// The dense gradient on `ctx`; an error naming the parameter when its gradient is row_sparse.
  ndarray& grad(context ctx = context::cpu());
  std::vector<ndarray>& list_data();
  std::vector<ndarray>& list_grad();
  /// The row_sparse gradient on `ctx` (grad_stype row_sparse; an error naming the parameter
  /// otherwise), and every context's; set_row_sparse_grad replaces one (a trainer writing back
  /// the reduced gradient).
  row_sparse_array row_sparse_grad(context ctx = context::cpu());
  std::vector<row_sparse_array> list_row_sparse_grad();
  void set_row_sparse_grad(context ctx, row_sparse_array value);

  /// A row_sparse weight's copy on `ctx` with rows `row_ids` (any shape, integer or
  /// integer-valued float: MXNet's row_sparse_pull ids) pulled from the kvstore, for a forward to
  /// read (gluon's Parameter.row_sparse_data). Errors name the parameter: a dense weight, no
  /// trainer to pull through, or what the pull says.
  ndarray& row_sparse_data(const ndarray& row_ids, context ctx = context::cpu());
  /// How row_sparse_data pulls rows into the copy of context index `copy`: set by the trainer the
  /// parameter belongs to (null: none).
  using row_puller = std::function<status(parameter& param, std::size_t copy, const ndarray& ids)>;
  void set_row_puller(row_puller puller) { row_puller_ = std::move(puller); }
  bool has_row_puller() const noexcept { return static_cast<bool>(row_puller_); }
  const std::vector<context>& list_ctx() const noexcept { return contexts_; }
  /// Copies `value` into every context's copy (shapes must match).
  void set_data(const ndarray& value);
  /// Zeroes every gradient.
  void zero_grad();

private:
  void create_arrays();

  std::string name_;
  shape_vector shape_;
  grad_req req_;
  storage_type stype_;
  storage_type grad_stype_;
  row_puller row_puller_;
  std::shared_ptr<const initializer> init_;
  std::shared_ptr<const initializer> chosen_init_;
  std::vector<context> contexts_;
  std::uint64_t seed_ = 0;
  std::vector<ndarray> data_;
  std::vector<ndarray> grad_;
};

/// The parameters of a block and its children, in registration order (gluon's ParameterDict).
using parameter_list = std::vector<std::shared_ptr<parameter>>;

} // namespace troupe::nn

#pragma once
// nn::parameter: a named weight of a block with one copy per context (gluon.Parameter).
//
// A parameter is declared with a shape whose unknown extents are 0 (a dense layer's input size
// before it has seen data); initialize() records the contexts and the initializer, and the
// arrays are created as soon as the shape is complete — at once, or at the block's first forward
// (MXNet's deferred initialisation). Every context holds the same initial values. With a
// grad_req other than null each copy has a gradient attached (ndarray::attach_grad), which
// backward() fills.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/context.hpp"
#include "engine/ndarray.hpp"

namespace troupe::nn {

class initializer;

class parameter {
public:
  parameter(std::string name, shape_vector shape, grad_req req = grad_req::write,
            std::shared_ptr<const initializer> init = nullptr);

  const std::string& name() const noexcept { return name_; }
  const shape_vector& shape() const noexcept { return shape_; }
  grad_req req() const noexcept { return req_; }
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
  ndarray& grad(context ctx = context::cpu());
  std::vector<ndarray>& list_data();
  std::vector<ndarray>& list_grad();
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

#include "engine/nn/parameter.hpp"

#include <algorithm>
#include <utility>

#include "engine/autograd.hpp"
#include "engine/error.hpp"
#include "engine/nn/initializer.hpp"

namespace troupe::nn {

namespace {

bool shape_is_complete(const shape_vector& shape) {
  return std::none_of(shape.begin(), shape.end(), [](std::int64_t extent) { return extent == 0; });
}

std::string context_list(const std::vector<context>& contexts) {
  std::string text;
  for (auto& ctx : contexts) {
    if (!text.empty())
      text += ", ";
    text += ctx.to_string();
  }
  return text.empty() ? "no context" : text;
}

} // namespace

parameter::parameter(std::string name, shape_vector shape, grad_req req,
                     std::shared_ptr<const initializer> init, storage_type stype,
                     storage_type grad_stype)
    : name_(std::move(name)), shape_(std::move(shape)), req_(req), stype_(stype),
      grad_stype_(grad_stype), init_(std::move(init)) {
  for (auto extent : shape_)
    if (extent < 0)
      throw exception(errc::invalid_argument, "parameter " + name_ + " declared with shape " +
                                                  shape_to_string(shape_) +
                                                  ": extents must be >= 0 (0 = unknown)");
  if ((stype_ == storage_type::row_sparse || grad_stype_ == storage_type::row_sparse) &&
      shape_.empty())
    throw exception(errc::invalid_argument,
                    "parameter " + name_ +
                        ": a row_sparse weight or gradient needs rows, and the "
                        "shape is a scalar's");
  if (stype_ == storage_type::row_sparse && grad_stype_ != storage_type::row_sparse)
    throw exception(errc::invalid_argument,
                    "parameter " + name_ +
                        ": a row_sparse weight takes a row_sparse gradient (grad_stype "
                        "row_sparse), not a dense one");
}

void parameter::initialize(std::shared_ptr<const initializer> default_init,
                           std::span<const context> contexts, std::uint64_t seed,
                           bool force_reinit) {
  if (!contexts_.empty() && !force_reinit)
    throw exception(errc::already_initialized,
                    "parameter " + name_ + " is already initialized on " + context_list(contexts_) +
                        " (pass force_reinit to initialize it again)");
  if (contexts.empty())
    throw exception(errc::empty_list, "parameter " + name_ + " initialized on no context");
  for (std::size_t i = 0; i < contexts.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (contexts[i] == contexts[j])
        throw exception(errc::invalid_argument, "parameter " + name_ + " initialized on " +
                                                    contexts[i].to_string() + " twice");
  std::shared_ptr<const initializer> chosen = init_ ? init_ : std::move(default_init);
  if (!chosen)
    chosen = std::make_shared<uniform>();

  std::vector<context> chosen_contexts(contexts.begin(), contexts.end());
  // Re-initialising on the same contexts overwrites the arrays in place: executors of hybridized
  // blocks and optimizers hold these very arrays and must see the new values.
  bool in_place = is_initialized() && chosen_contexts == contexts_;
  chosen_init_ = std::move(chosen);
  seed_ = seed;
  if (in_place) {
    ndarray values = ndarray::empty(shape_, context::cpu());
    chosen_init_->fill(name_, values, seed_);
    for (auto& copy : data_)
      values.copy_to(copy);
    return;
  }
  contexts_ = std::move(chosen_contexts);
  data_.clear();
  grad_.clear();
  if (shape_is_complete(shape_))
    create_arrays();
}

void parameter::finish_shape(const shape_vector& shape) {
  bool compatible = shape.size() == shape_.size();
  for (std::size_t axis = 0; compatible && axis < shape.size(); ++axis)
    compatible = shape[axis] > 0 && (shape_[axis] == 0 || shape_[axis] == shape[axis]);
  if (!compatible)
    throw exception(errc::shape_mismatch,
                    "parameter " + name_ + ": shape " + shape_to_string(shape) +
                        " does not match the declared shape " + shape_to_string(shape_));
  if (shape == shape_)
    return;
  shape_ = shape;
  if (!contexts_.empty() && data_.empty())
    create_arrays();
}

void parameter::create_arrays() {
  // The values are made once, on the host, and copied: every context starts from the same ones.
  ndarray values = ndarray::empty(shape_, context::cpu());
  chosen_init_->fill(name_, values, seed_);
  std::vector<ndarray> data;
  std::vector<ndarray> grads;
  for (auto& ctx : contexts_) {
    ndarray copy = values.copy_to(ctx);
    if (req_ != grad_req::null && grad_stype_ == storage_type::row_sparse) {
      autograd::attach_row_sparse_grad(copy, req_);
    } else if (req_ != grad_req::null) {
      copy.attach_grad(req_);
      grads.push_back(copy.grad());
    }
    data.push_back(std::move(copy));
  }
  data_ = std::move(data);
  grad_ = std::move(grads);
}

ndarray& parameter::data(context ctx) {
  if (data_.empty()) {
    if (contexts_.empty())
      throw exception(errc::invalid_argument, "parameter " + name_ + " has not been initialized");
    throw exception(errc::invalid_argument,
                    "parameter " + name_ + " has not been created yet: its shape " +
                        shape_to_string(shape_) +
                        " is completed by the block's first forward (deferred initialization)");
  }
  for (std::size_t i = 0; i < contexts_.size(); ++i)
    if (contexts_[i] == ctx)
      return data_[i];
  throw exception(errc::context_mismatch, "parameter " + name_ + " has no copy on " +
                                              ctx.to_string() + " (it lives on " +
                                              context_list(contexts_) + ")");
}

namespace {

[[noreturn]] void fail_storage(const std::string& name, std::string_view call,
                               std::string_view reason) {
  throw exception(errc::invalid_argument,
                  "parameter " + name + ": " + std::string{call} + ": " + std::string{reason});
}

} // namespace

ndarray& parameter::grad(context ctx) {
  if (req_ == grad_req::null)
    throw exception(errc::invalid_argument,
                    "parameter " + name_ + " has grad_req null: it has no gradient");
  if (grad_stype_ == storage_type::row_sparse)
    fail_storage(name_, "grad()", "its gradient is row_sparse; read it with row_sparse_grad()");
  ndarray& array = data(ctx);
  auto index = static_cast<std::size_t>(&array - data_.data());
  // Refreshed from the array: the gradient attached to it is the one backward() fills.
  grad_[index] = array.grad();
  return grad_[index];
}

std::vector<ndarray>& parameter::list_data() {
  if (!contexts_.empty() && !data_.empty())
    return data_;
  data(contexts_.empty() ? context::cpu() : contexts_.front()); // throws the reason
  return data_;
}

std::vector<ndarray>& parameter::list_grad() {
  if (req_ == grad_req::null)
    throw exception(errc::invalid_argument,
                    "parameter " + name_ + " has grad_req null: it has no gradient");
  if (grad_stype_ == storage_type::row_sparse)
    fail_storage(name_, "list_grad()",
                 "its gradient is row_sparse; read it with list_row_sparse_grad()");
  list_data();
  for (std::size_t i = 0; i < data_.size(); ++i)
    grad_[i] = data_[i].grad();
  return grad_;
}

void parameter::set_data(const ndarray& value) {
  if (value.shape() != shape_)
    throw exception(errc::shape_mismatch, "parameter " + name_ + ": set_data with shape " +
                                              shape_to_string(value.shape()) +
                                              " for a parameter of shape " +
                                              shape_to_string(shape_));
  for (auto& copy : list_data())
    value.copy_to(copy);
}

row_sparse_array parameter::row_sparse_grad(context ctx) {
  if (grad_stype_ != storage_type::row_sparse || req_ == grad_req::null)
    fail_storage(name_, "row_sparse_grad()",
                 req_ == grad_req::null ? "it has grad_req null: it has no gradient"
                                        : "its gradient is dense; read it with grad()");
  return autograd::row_sparse_grad(data(ctx));
}

std::vector<row_sparse_array> parameter::list_row_sparse_grad() {
  std::vector<row_sparse_array> grads;
  for (const auto& ctx : contexts_)
    grads.push_back(row_sparse_grad(ctx));
  return grads;
}

void parameter::set_row_sparse_grad(context ctx, row_sparse_array value) {
  row_sparse_grad(ctx); // the checks
  autograd::set_row_sparse_grad(data(ctx), std::move(value));
}

ndarray& parameter::row_sparse_data(const ndarray& row_ids, context ctx) {
  if (stype_ != storage_type::row_sparse)
    fail_storage(name_, "row_sparse_data()",
                 "its storage type is default (dense); read it with data()");
  ndarray& copy = data(ctx);
  if (!row_puller_)
    fail_storage(name_, "row_sparse_data()",
                 "it has no trainer to pull rows through (create a trainer with this parameter "
                 "first: its rows live in the trainer's kvstore)");
  auto index = static_cast<std::size_t>(&copy - data_.data());
  if (auto pulled = row_puller_(*this, index, row_ids); !pulled)
    throw exception(pulled.error().code(),
                    "parameter " + name_ + ": row_sparse_data(): " + pulled.error().message());
  return copy;
}

void parameter::zero_grad() {
  if (req_ == grad_req::null || data_.empty())
    return;
  if (grad_stype_ == storage_type::row_sparse) {
    for (auto& copy : data_)
      autograd::set_row_sparse_grad(copy, row_sparse_array::zeros(shape_));
    return;
  }
  for (auto& grad : list_grad())
    grad.fill(0.0);
}

} // namespace troupe::nn

#pragma once
// nn::block: gluon's HybridBlock, and the layers built on it (gluon.nn.Dense, Conv2D, ...).
//
//   auto net = std::make_shared<nn::sequential>();
//   net->add(std::make_shared<nn::dense>(256, "relu"));
//   net->add(std::make_shared<nn::dense>(10));
//   net->initialize(std::make_shared<nn::xavier>());   // shapes finish at the first forward
//   net->hybridize();
//   { autograd::record_scope record; auto loss = nd::sum(nd::softmax_cross_entropy((*net)(x), y));
//     loss.backward(); }                                // parameters' gradients are filled
//
// Naming follows gluon: a block's prefix is its kind and a per-kind counter ("dense0_",
// "conv1_"), unless given; its parameters are prefix + name ("dense0_weight", "dense0_bias").
// (gluon also nests children's prefixes under a parent's name_scope; troupe does not: children
// keep their own prefixes, so "dense0_weight" names one parameter however it is nested.)
//
// Hybridization (hybridize()): the first forward of an active block for an input shape, context
// and training mode runs the imperative forward inside a trace_scope (engine/trace.hpp) with the
// input as the variable "data" and each parameter as a variable of its full name, and returns
// that imperative result; the traced symbol is bound to an executor whose arguments are the
// parameters' own arrays, so in-place updates (an optimizer, set_data, load_parameters) are what
// it computes with. Later calls copy the input into the executor, run it, and return a copy of
// its output; under autograd::record_scope the call is one recorded step
// (autograd::record_custom) whose backward runs the executor's backward, so loss.backward()
// fills the parameters' gradients exactly as in imperative mode. Both modes run the same
// operators in the same order, Dropout's masks included (next_operator_seed), so outputs and
// gradients are bit-identical.
//
// A block is used from one thread at a time; creating blocks (the naming counters) is safe from
// any thread.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/context.hpp"
#include "engine/error.hpp"
#include "engine/ndarray.hpp"
#include "engine/nn/parameter.hpp"
#include "engine/op.hpp"

namespace troupe::nn {

class initializer;

/// The default context list of initialize(): cpu(0).
inline constexpr std::array<context, 1> default_contexts{context::cpu()};

class block {
public:
  virtual ~block();
  block(const block&) = delete;
  block& operator=(const block&) = delete;

  /// The output for the batch `x`: the imperative hybrid_forward, or the cached executor when
  /// hybridize() made this block active (see the file comment).
  ndarray forward(const ndarray& x);
  ndarray operator()(const ndarray& x) { return forward(x); }

  /// "dense0_": what this block's parameter names start with.
  const std::string& prefix() const noexcept { return prefix_; }
  /// The prefix without its trailing '_' ("dense0").
  std::string name() const;

  /// Makes `child` part of this block: its parameters are collected, initialised, saved and
  /// hybridized with this block's. Returns `child`.
  std::shared_ptr<block> register_child(std::shared_ptr<block> child);
  const std::vector<std::shared_ptr<block>>& children() const noexcept { return children_; }
  /// This block's own parameters, in registration order.
  const parameter_list& params() const noexcept { return params_; }
  /// Own parameters, then each child's collect_params(), in registration order; a parameter
  /// reached twice (a shared child) is listed once. Two different parameters of one name are an
  /// error naming it.
  parameter_list collect_params() const;

  /// Initialises every parameter of collect_params(): on `contexts`, with its own initializer or
  /// else `init` (nullptr: uniform(0.07)), the values reproducible from `seed`. Parameters whose
  /// shape is not complete get their arrays at the first forward. A parameter already
  /// initialised is an error naming it (nothing is changed) unless force_reinit, which writes the
  /// new values into the existing arrays when the contexts are the same.
  void initialize(std::shared_ptr<const initializer> init = nullptr,
                  std::span<const context> contexts = default_contexts, std::uint64_t seed = 0,
                  bool force_reinit = false);

  /// Turns cached execution on or off for this block and all its children (gluon's hybridize),
  /// and drops the graphs cached so far. A block that holds a parameter with a row_sparse
  /// gradient (its own or a child's: an embedding with sparse_grad) stays imperative, so that
  /// backward gives that parameter its rows (an executor computes dense gradients); its other
  /// children are hybridized.
  virtual void hybridize(bool active = true);
  bool is_hybridized() const noexcept { return active_; }
  /// How many times this block has traced its forward into a graph: once per input shape,
  /// context and training mode while hybridized.
  std::size_t trace_count() const noexcept { return trace_count_; }

  /// Writes every parameter of collect_params() to `path`: a header (magic, format version),
  /// then per parameter its name, shape and float32 values. An uninitialised parameter is an
  /// error naming it.
  status save_parameters(const std::string& path) const;
  /// Reads a file of save_parameters into collect_params(). The file must hold exactly these
  /// parameters, with shapes that fit the declared ones (which completes deferred shapes); an
  /// error names the parameter and the file, and changes nothing. Values go into the existing
  /// arrays when the parameter lives on `contexts` already (empty: where it lives, else cpu(0));
  /// otherwise the parameter is (re)created on them.
  status load_parameters(const std::string& path, std::span<const context> contexts = {});

protected:
  /// `alias` is the kind ("dense"); the prefix is `prefix` when given, else alias + a per-alias
  /// counter + '_'.
  block(std::string_view alias, std::string prefix);

  /// The imperative computation. Implementations read parameters through param_data() and call
  /// children through their forward().
  virtual ndarray hybrid_forward(const ndarray& x) = 0;

  /// Declares the parameter prefix() + `name` (0 extents: known at the first forward).
  std::shared_ptr<parameter> register_param(const std::string& name, shape_vector shape,
                                            grad_req req = grad_req::write,
                                            std::shared_ptr<const initializer> init = nullptr,
                                            storage_type stype = storage_type::dense,
                                            storage_type grad_stype = storage_type::dense);
  /// param.data(ctx), which a trace in progress on this thread takes as a variable.
  static ndarray& param_data(parameter& param, context ctx);
  /// Completes the shapes of `params` (the parameter inputs of operator `op_name` after the
  /// data, as op_def::input_names orders them) from the data's shape, by the operator's own
  /// fill_input_shapes: deferred initialisation.
  static void finish_shapes(std::string_view op_name, const op_attrs& attrs, const ndarray& x,
                            std::span<parameter* const> params);

private:
  struct executor_slot;
  struct cached_graph;

  ndarray cached_forward(const ndarray& x);
  ndarray trace(const ndarray& x, bool training);
  void drop_cached_graphs();

  std::string prefix_;
  parameter_list params_;
  std::vector<std::shared_ptr<block>> children_;
  bool active_ = false;
  std::size_t trace_count_ = 0;
  std::vector<std::shared_ptr<cached_graph>> cache_;
};

/// gluon.nn.Dense: y = activation(x·weightᵀ + bias); weight [units, in_units], bias [units].
/// in_units 0 is learnt at the first forward; with flatten, x [n, ...] is used as [n, rest],
/// without, the last axis is the input.
class dense final : public block {
public:
  explicit dense(std::int64_t units, std::string activation = {}, bool use_bias = true,
                 std::int64_t in_units = 0, bool flatten = true,
                 std::shared_ptr<const initializer> weight_init = nullptr, std::string prefix = {});
  std::int64_t units() const noexcept { return units_; }
  const std::shared_ptr<parameter>& weight() const noexcept { return weight_; }
  /// nullptr without a bias.
  const std::shared_ptr<parameter>& bias() const noexcept { return bias_; }

protected:
  ndarray hybrid_forward(const ndarray& x) override;

private:
  std::int64_t units_;
  std::string activation_;
  bool flatten_;
  std::shared_ptr<parameter> weight_;
  std::shared_ptr<parameter> bias_;
};

/// gluon.nn.Activation: relu, sigmoid, tanh or softrelu (its prefix is the type: "relu0_").
class activation final : public block {
public:
  explicit activation(std::string act_type, std::string prefix = {});
  const std::string& act_type() const noexcept { return act_type_; }

protected:
  ndarray hybrid_forward(const ndarray& x) override;

private:
  std::string act_type_;
};

/// gluon.nn.Conv2D over NCHW data: weight [channels, in_channels, kh, kw], bias [channels];
/// in_channels 0 is learnt at the first forward.
class conv2d final : public block {
public:
  conv2d(std::int64_t channels, std::array<std::int64_t, 2> kernel_size,
         std::array<std::int64_t, 2> strides = {1, 1}, std::array<std::int64_t, 2> padding = {0, 0},
         std::string activation = {}, bool use_bias = true, std::int64_t in_channels = 0,
         std::shared_ptr<const initializer> weight_init = nullptr, std::string prefix = {});
  const std::shared_ptr<parameter>& weight() const noexcept { return weight_; }
  const std::shared_ptr<parameter>& bias() const noexcept { return bias_; }

protected:
  ndarray hybrid_forward(const ndarray& x) override;

private:
  op_attrs attrs_;
  std::string activation_;
  std::shared_ptr<parameter> weight_;
  std::shared_ptr<parameter> bias_;
};

/// What gluon.nn.MaxPool2D and AvgPool2D share: the window and the pool type, checked when
/// built; strides default to the pool size.
class pool2d : public block {
protected:
  pool2d(std::string_view pool_type, std::array<std::int64_t, 2> pool_size,
         std::optional<std::array<std::int64_t, 2>> strides, std::array<std::int64_t, 2> padding,
         std::string prefix);
  ndarray hybrid_forward(const ndarray& x) override;

private:
  op_attrs attrs_;
};

/// gluon.nn.MaxPool2D.
class max_pool2d final : public pool2d {
public:
  explicit max_pool2d(std::array<std::int64_t, 2> pool_size = {2, 2},
                      std::optional<std::array<std::int64_t, 2>> strides = std::nullopt,
                      std::array<std::int64_t, 2> padding = {0, 0}, std::string prefix = {});
};

/// gluon.nn.AvgPool2D: an average counts padding (count_include_pad).
class avg_pool2d final : public pool2d {
public:
  explicit avg_pool2d(std::array<std::int64_t, 2> pool_size = {2, 2},
                      std::optional<std::array<std::int64_t, 2>> strides = std::nullopt,
                      std::array<std::int64_t, 2> padding = {0, 0}, std::string prefix = {});
};

/// gluon.nn.Flatten: [n, d1, d2, ...] -> [n, d1·d2·...].
class flatten final : public block {
public:
  explicit flatten(std::string prefix = {});

protected:
  ndarray hybrid_forward(const ndarray& x) override;
};

/// gluon.nn.Dropout: drops with probability `rate` in training mode (autograd::is_training),
/// the identity otherwise.
class dropout final : public block {
public:
  explicit dropout(double rate, std::string prefix = {});
  double rate() const noexcept { return rate_; }

protected:
  ndarray hybrid_forward(const ndarray& x) override;

private:
  double rate_;
};

/// gluon.nn.Embedding: out[..., :] = weight[x[...], :] for x of row indices (float32, any
/// shape); weight [input_dim, output_dim]. With sparse_grad the weight's gradient is row_sparse:
/// backward gives it only the rows the batch used (read it with parameter::row_sparse_grad; a
/// trainer pushes just those rows). Indices outside [0, input_dim) are an error naming the
/// position (MXNet clips them).
class embedding : public block {
public:
  embedding(std::int64_t input_dim, std::int64_t output_dim, bool sparse_grad = false,
            std::shared_ptr<const initializer> weight_init = nullptr, std::string prefix = {});
  std::int64_t input_dim() const noexcept { return input_dim_; }
  std::int64_t output_dim() const noexcept { return output_dim_; }
  const std::shared_ptr<parameter>& weight() const noexcept { return weight_; }

protected:
  embedding(std::string_view alias, std::int64_t input_dim, std::int64_t output_dim,
            storage_type stype, storage_type grad_stype,
            std::shared_ptr<const initializer> weight_init, std::string prefix);
  ndarray hybrid_forward(const ndarray& x) override;

private:
  std::int64_t input_dim_;
  std::int64_t output_dim_;
  std::shared_ptr<parameter> weight_;
};

/// gluon.contrib.nn.SparseEmbedding: an embedding whose weight is row_sparse (stype and
/// grad_stype row_sparse) and lives in the trainer's kvstore: each forward pulls only the rows its
/// batch uses (parameter::row_sparse_data), and the trainer pushes only their gradients, updated
/// on the store (update_on_kvstore). For tables larger than a worker wants to move each step.
/// Needs a trainer before its first forward.
class sparse_embedding final : public embedding {
public:
  sparse_embedding(std::int64_t input_dim, std::int64_t output_dim,
                   std::shared_ptr<const initializer> weight_init = nullptr,
                   std::string prefix = {});
};

/// gluon.nn.(Hybrid)Sequential: the children in the order added, each fed the previous output.
class sequential final : public block {
public:
  explicit sequential(std::string prefix = {});
  /// Appends `child`; returns *this so that adds chain.
  sequential& add(std::shared_ptr<block> child);
  std::size_t size() const noexcept { return children().size(); }
  /// The child at `index`; an error naming index and size when out of range.
  const std::shared_ptr<block>& at(std::size_t index) const;

protected:
  ndarray hybrid_forward(const ndarray& x) override;
};

} // namespace troupe::nn

#pragma once
// Model parallelism: a network cut into stages, each on a context of its own (GPipe's pipeline).
//
//   auto stages = nn::pipeline::split(*net, {context::cpu(0), context::cpu(1)});
//   stages->initialize_stages(std::make_shared<nn::xavier>());
//   autograd::record_scope record;
//   auto outputs = stages->forward_micro_batches(batch, 4);   // 4 parts, pipelined
//
// forward(x) runs stage s on context s and moves the activations from one stage's context to the
// next with nd::copy_to, which autograd records, so the gradients flow back along the same way.
// Every operation is queued on its context (engine/dispatch.hpp): with device actors each stage
// computes on its own actor, and when a batch is cut into micro-batches the caller queues them
// all at once, so stage 0 computes part k+1 while stage 1 computes part k, forward and backward
// (GPipe's schedule; the parameter gradients of the parts add up, as one batch's would). Without
// device actors the same code runs one stage after the other.
//
// Each parameter lives on its stage's context only; a Trainer updates it there, and a dist_*
// store pushes it from there, so model parallelism combines with data parallelism over workers.
// hybridize() hybridizes each stage (a stage is one graph on one context), never the pipeline.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/nn/block.hpp"

namespace troupe::nn {

class pipeline final : public block {
public:
  explicit pipeline(std::string prefix = {});

  /// Appends a stage that runs on `ctx`; returns *this so that adds chain.
  pipeline& add(std::shared_ptr<block> stage, context ctx);
  /// `net`'s children cut into one stage per context, consecutive children per stage, as even in
  /// count as they divide (the first stages take one more). An error names the counts when there
  /// are more contexts than children.
  static std::shared_ptr<pipeline> split(const sequential& net, std::span<const context> contexts);

  std::size_t size() const noexcept { return contexts_.size(); }
  const std::vector<context>& contexts() const noexcept { return contexts_; }

  /// Initialises each stage's parameters on its own context (block::initialize per stage).
  void initialize_stages(std::shared_ptr<const initializer> init = nullptr, std::uint64_t seed = 0,
                         bool force_reinit = false);

  /// The outputs for `x` cut into `parts` micro-batches along its first axis (the first parts
  /// take one more row), each on the last stage's context. `parts` must be in [1, rows].
  std::vector<ndarray> forward_micro_batches(const ndarray& x, std::int64_t parts);

  void hybridize(bool active = true) override;

protected:
  ndarray hybrid_forward(const ndarray& x) override;

private:
  std::vector<context> contexts_;
};

} // namespace troupe::nn

#include "engine/nn/pipeline.hpp"

#include <string>
#include <utility>

#include "engine/error.hpp"
#include "engine/nd.hpp"

namespace troupe::nn {

pipeline::pipeline(std::string prefix) : block("pipeline", std::move(prefix)) {}

pipeline& pipeline::add(std::shared_ptr<block> stage, context ctx) {
  register_child(std::move(stage));
  contexts_.push_back(ctx);
  return *this;
}

std::shared_ptr<pipeline> pipeline::split(const sequential& net,
                                          std::span<const context> contexts) {
  const std::size_t blocks = net.size();
  const std::size_t stages = contexts.size();
  if (stages == 0 || stages > blocks)
    throw exception(errc::invalid_argument,
                    "pipeline: " + std::to_string(stages) + " contexts for a network of " +
                        std::to_string(blocks) + " blocks; each stage needs at least one block");
  auto made = std::make_shared<pipeline>();
  std::size_t next = 0;
  for (std::size_t s = 0; s < stages; ++s) {
    const std::size_t count = blocks / stages + (s < blocks % stages ? 1 : 0);
    auto stage = std::make_shared<sequential>();
    for (std::size_t i = 0; i < count; ++i)
      stage->add(net.at(next++));
    made->add(std::move(stage), contexts[s]);
  }
  return made;
}

void pipeline::initialize_stages(std::shared_ptr<const initializer> init, std::uint64_t seed,
                                 bool force_reinit) {
  for (std::size_t s = 0; s < contexts_.size(); ++s)
    children()[s]->initialize(init, std::span<const context>(&contexts_[s], 1), seed, force_reinit);
}

std::vector<ndarray> pipeline::forward_micro_batches(const ndarray& x, std::int64_t parts) {
  const std::int64_t rows = x.ndim() == 0 ? 0 : x.shape()[0];
  if (parts < 1 || parts > rows)
    throw exception(errc::invalid_argument,
                    "pipeline: " + std::to_string(parts) + " micro-batches of a batch of " +
                        std::to_string(rows) + " rows; give 1 to " + std::to_string(rows));
  std::vector<ndarray> outputs;
  outputs.reserve(static_cast<std::size_t>(parts));
  std::int64_t begin = 0;
  for (std::int64_t p = 0; p < parts; ++p) {
    const std::int64_t end = begin + rows / parts + (p < rows % parts ? 1 : 0);
    outputs.push_back(forward(x.slice(begin, end)));
    begin = end;
  }
  return outputs;
}

void pipeline::hybridize(bool active) {
  for (const auto& stage : children())
    stage->hybridize(active);
}

ndarray pipeline::hybrid_forward(const ndarray& x) {
  ndarray y = x;
  for (std::size_t s = 0; s < contexts_.size(); ++s) {
    if (y.ctx() != contexts_[s])
      y = nd::copy_to(y, contexts_[s]);
    y = children()[s]->forward(y);
  }
  return y;
}

} // namespace troupe::nn

#include "engine/comm.hpp"

namespace troupe {
namespace {

/// A buffer of `like`'s shape and dtype on `where`, reused when it already fits and nobody else
/// holds it (a send still reading last round's sum must not see this round's).
ndarray& fit(ndarray& buffer, const ndarray& like, context where) {
  if (buffer.is_none() || buffer.shape() != like.shape() || buffer.dtype() != like.dtype() ||
      buffer.ctx() != where || buffer.storage_is_shared())
    buffer = ndarray::empty(like.shape(), where, like.dtype());
  return buffer;
}

void require_uniform(std::span<const ndarray> values) {
  if (values.empty())
    throw exception(errc::empty_list, "reduce of an empty list");
  for (const auto& value : values.subspan(1)) {
    if (value.shape() != values[0].shape())
      throw exception(errc::shape_mismatch, "reduce: shape " + shape_to_string(value.shape()) +
                                                " does not match " +
                                                shape_to_string(values[0].shape()));
    if (value.dtype() != values[0].dtype())
      throw exception(errc::dtype_mismatch,
                      "reduce: dtype " + std::string{to_string(value.dtype())} +
                          " does not match " + std::string{to_string(values[0].dtype())});
  }
}

/// Sums `values` into `merged` on merged's context, staging inputs from other devices. Every
/// cpu(i) is host memory: a host sum reads them where they are (the dependency engine orders the
/// read after their writers).
void sum_on(ndarray& merged, std::vector<ndarray>& staging, std::span<const ndarray> values) {
  std::vector<ndarray> operands;
  operands.reserve(values.size());
  staging.resize(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (values[i].ctx() == merged.ctx() || (values[i].ctx().is_cpu() && merged.ctx().is_cpu())) {
      operands.push_back(values[i]);
    } else {
      values[i].copy_to(fit(staging[i], values[i], merged.ctx()));
      operands.push_back(staging[i]);
    }
  }
  sum_into(operands, merged);
}

} // namespace

void comm::broadcast(const ndarray& source, std::span<ndarray> outputs) const {
  for (auto& output : outputs)
    source.copy_to(output);
}

const ndarray& comm_host::reduce(std::int64_t key, std::span<const ndarray> values) {
  require_uniform(values);
  auto& entry = buffers_[key];
  sum_on(fit(entry.merged, values[0], context::cpu()), entry.staging, values);
  return entry.merged;
}

context comm_device::pick_merge_context(std::span<const ndarray> values) {
  context best = values[0].ctx();
  std::int64_t best_load = -1;
  for (const auto& value : values) {
    auto load = assigned_bytes_[value.ctx()];
    if (best_load < 0 || load < best_load) {
      best = value.ctx();
      best_load = load;
    }
  }
  assigned_bytes_[best] += static_cast<std::int64_t>(values[0].nbytes());
  return best;
}

const ndarray& comm_device::reduce(std::int64_t key, std::span<const ndarray> values) {
  require_uniform(values);
  auto& entry = buffers_[key];
  if (entry.merged.is_none() || entry.merged.shape() != values[0].shape() ||
      entry.merged.dtype() != values[0].dtype())
    entry.merged = ndarray::empty(values[0].shape(), pick_merge_context(values), values[0].dtype());
  else if (entry.merged.storage_is_shared()) // a send still reads last round's sum
    entry.merged = ndarray::empty(values[0].shape(), entry.merged.ctx(), values[0].dtype());
  // More than two inputs: a tree. Each level sums pairs on the first one's device, and the sums
  // of a level run concurrently on their device actors; the last two meet in the merge buffer.
  std::vector<ndarray> level(values.begin(), values.end());
  entry.partials.resize(values.size());
  entry.partial_staging.resize(values.size());
  std::size_t slot = 0;
  while (level.size() > 2) {
    std::vector<ndarray> next;
    for (std::size_t j = 0; j + 1 < level.size(); j += 2, ++slot) {
      auto& partial = fit(entry.partials[slot], level[j], level[j].ctx());
      sum_on(partial, entry.partial_staging[slot], std::span(level).subspan(j, 2));
      next.push_back(partial);
    }
    if (level.size() % 2 == 1)
      next.push_back(level.back());
    level = std::move(next);
  }
  sum_on(entry.merged, entry.staging, level);
  return entry.merged;
}

context comm_device::merge_context(std::int64_t key) const {
  auto slot = buffers_.find(key);
  if (slot == buffers_.end())
    throw exception(errc::unknown_key, "key " + std::to_string(key) + " was never reduced");
  return slot->second.merged.ctx();
}

} // namespace troupe

#include "actors/logic/async_pushes.hpp"

#include <algorithm>
#include <limits>

namespace troupe {

async_pushes::async_pushes(std::uint64_t key, const ndarray& like, std::uint32_t num_workers)
    : key_(key), layout_(like), workers_(num_workers) {}

void async_pushes::resume(const std::vector<std::uint64_t>& applied_per_worker) noexcept {
  applied_ = 0;
  for (std::size_t w = 0; w < workers_.size(); ++w) {
    workers_[w].applied = w < applied_per_worker.size() ? applied_per_worker[w] : 0;
    applied_ += workers_[w].applied;
  }
}

chunk_outcome async_pushes::add(const push_chunk& chunk) {
  auto& worker = workers_[chunk.sender];
  if (auto checked = check_order(key_, chunk, worker.bytes, layout_.bytes); checked.refused())
    return checked;
  stage_chunk(worker.staging, chunk, layout_);
  worker.bytes += chunk.data.size();
  if (worker.bytes < layout_.bytes)
    return {chunk_fate::taken};
  worker.bytes = 0;
  return {chunk_fate::completed};
}

void async_pushes::count_applied(std::uint32_t sender) noexcept {
  ++workers_[sender].applied;
  ++applied_;
}

std::uint64_t async_pushes::slowest(const std::vector<bool>& live) const noexcept {
  std::uint64_t fewest = std::numeric_limits<std::uint64_t>::max();
  for (std::size_t w = 0; w < workers_.size() && w < live.size(); ++w)
    if (live[w])
      fewest = std::min(fewest, workers_[w].applied);
  return fewest;
}

} // namespace troupe

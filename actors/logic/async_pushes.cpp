#include "actors/logic/async_pushes.hpp"

#include <algorithm>
#include <limits>

namespace troupe {

async_pushes::async_pushes(std::uint64_t key, const ndarray& like, std::uint32_t num_workers)
    : key_(key), layout_(like), workers_(num_workers) {}

void async_pushes::resume(const std::vector<std::uint64_t>& next_per_worker,
                          std::uint64_t applied) noexcept {
  applied_ = applied;
  for (std::size_t w = 0; w < workers_.size(); ++w)
    workers_[w].next_sequence = w < next_per_worker.size() ? next_per_worker[w] : 0;
}

chunk_outcome async_pushes::add(const push_chunk& chunk) {
  auto& worker = workers_[chunk.sender];
  if (auto checked = check_order(key_, chunk, worker.bytes, layout_.bytes); checked.refused())
    return checked;
  if (worker.bytes == 0 && chunk.round < worker.next_sequence)
    return refuse_chunk(key_, wire::error_code::stale_round, chunk,
                        "the worker's push " + std::to_string(chunk.round) +
                            " of the key was had already (its next is " +
                            std::to_string(worker.next_sequence) + ") and this one is not marked " +
                            "as sent again after a server restart");
  if (worker.bytes > 0 && chunk.round != worker.receiving)
    return refuse_chunk(key_, wire::error_code::invalid_argument, chunk,
                        "a chunk in the middle of the worker's push " +
                            std::to_string(worker.receiving));
  if (chunk.round == std::numeric_limits<std::uint64_t>::max())
    return refuse_chunk(key_, wire::error_code::invalid_argument, chunk,
                        "the largest sequence number has no successor");
  stage_chunk(worker.staging, chunk, layout_);
  worker.receiving = chunk.round;
  worker.bytes += chunk.data.size();
  if (worker.bytes < layout_.bytes)
    return {chunk_fate::taken};
  worker.bytes = 0;
  worker.next_sequence = worker.receiving + 1;
  return {chunk_fate::completed};
}

chunk_outcome async_pushes::take_whole(const push_chunk& chunk) {
  auto& worker = workers_[chunk.sender];
  if (chunk.round < worker.next_sequence)
    return refuse_chunk(key_, wire::error_code::stale_round, chunk,
                        "the worker's push " + std::to_string(chunk.round) +
                            " of the key was had already (its next is " +
                            std::to_string(worker.next_sequence) + ") and this one is not marked " +
                            "as sent again after a server restart");
  if (chunk.round == std::numeric_limits<std::uint64_t>::max())
    return refuse_chunk(key_, wire::error_code::invalid_argument, chunk,
                        "the largest sequence number has no successor");
  worker.next_sequence = chunk.round + 1;
  return {chunk_fate::completed};
}

void async_pushes::forget_unfinished(std::uint32_t sender) noexcept {
  auto& worker = workers_[sender];
  worker.bytes = 0;
  worker.staging = ndarray{};
}

std::uint64_t async_pushes::slowest(const std::vector<bool>& live) const noexcept {
  std::uint64_t fewest = std::numeric_limits<std::uint64_t>::max();
  for (std::size_t w = 0; w < workers_.size() && w < live.size(); ++w)
    if (live[w])
      fewest = std::min(fewest, workers_[w].joined_at + workers_[w].next_sequence);
  return fewest;
}

} // namespace troupe

#include "actors/logic/push_chunk.hpp"

#include <cstring>

namespace troupe {

chunk_outcome refuse_chunk(std::uint64_t key, wire::error_code code, const push_chunk& chunk,
                           const std::string& why) {
  return {chunk_fate::refused, code,
          "push of key " + std::to_string(key) + " for round " + std::to_string(chunk.round) +
              " from worker " + std::to_string(chunk.sender) + ": " + why};
}

chunk_outcome check_order(std::uint64_t key, const push_chunk& chunk, std::uint64_t received,
                          std::uint64_t total) {
  if (chunk.offset != received)
    return refuse_chunk(key, wire::error_code::invalid_argument, chunk,
                        "chunk at byte " + std::to_string(chunk.offset) + ", expected byte " +
                            std::to_string(received) + " (a push's chunks come in order, once)");
  if (chunk.data.size() > total - received)
    return refuse_chunk(key, wire::error_code::invalid_argument, chunk,
                        "more bytes than the value's " + std::to_string(total));
  return {};
}

void make_writable(ndarray& buffer, const value_layout& layout) {
  if (buffer.is_none() || buffer.storage_is_shared() || buffer.shape() != layout.shape ||
      buffer.dtype() != layout.type)
    buffer = ndarray::empty(layout.shape, context::cpu(), layout.type);
}

void stage_chunk(ndarray& buffer, const push_chunk& chunk, const value_layout& layout) {
  if (chunk.offset == 0)
    make_writable(buffer, layout);
  if (!chunk.data.empty())
    std::memcpy(bytes_of(buffer) + chunk.offset, chunk.data.data(), chunk.data.size());
}

} // namespace troupe

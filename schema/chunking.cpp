#include "schema/chunking.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>

namespace troupe::wire {

namespace {

// Tensors built or received locally are bounded by the caller's memory, not by a peer's frame.
decode_limits local_limits() {
  decode_limits limits;
  limits.max_tensor_bytes = std::numeric_limits<std::uint64_t>::max();
  return limits;
}

} // namespace

chunker::chunker(message whole, std::size_t chunk_bytes)
    : whole_(std::move(whole)), chunk_bytes_(chunk_bytes), count_(1) {
  if (!valid_chunk_bytes(chunk_bytes_))
    throw std::invalid_argument("chunker: chunk size " + std::to_string(chunk_bytes_) +
                                " is not a multiple of 8 in [8, max_chunk_bytes]");
  const tensor_chunk* tensor = tensor_of(whole_);
  if (tensor == nullptr)
    return;
  if (tensor->offset != 0 || tensor->dense_bytes() != tensor->total_bytes)
    throw std::invalid_argument("chunker: the " + std::string(kind_name(whole_)) +
                                " tensor is not whole (offset " + std::to_string(tensor->offset) +
                                ", " + std::to_string(tensor->dense_bytes()) + " of " +
                                std::to_string(tensor->total_bytes) + " bytes)");
  if (auto error = validate_tensor(*tensor, local_limits()))
    throw std::invalid_argument("chunker: " + error->message);
  // A row-sparse tensor travels whole: its rows and their ids together (troupe.capnp).
  if (!tensor->data.empty() && !tensor->row_sparse)
    count_ = (tensor->data.size() - 1) / chunk_bytes_ + 1;
}

namespace {

/// Elements one packed word holds.
std::uint64_t elements_per_word(compression_type type) {
  return type == compression_type::two_bit ? 16 : 32;
}

} // namespace

message chunker::chunk(std::size_t index) const {
  if (index >= count_)
    throw std::out_of_range("chunker: chunk " + std::to_string(index) + " of " +
                            std::to_string(count_));
  message part = whole_;
  if (tensor_chunk* tensor = tensor_of(part); tensor != nullptr && !tensor->row_sparse) {
    const std::size_t offset = index * chunk_bytes_;
    const std::size_t size = std::min(chunk_bytes_, tensor->data.size() - offset);
    tensor->data = tensor->data.subspan(offset, size);
    if (tensor->compression.type == compression_type::none) {
      tensor->offset = offset;
    } else {
      // Packed: chunks of whole words (chunk_bytes_ is a multiple of 8), each covering the
      // elements its words hold.
      const auto per_byte = elements_per_word(tensor->compression.type) / 4;
      const std::uint64_t first = offset * per_byte;
      tensor->offset = first * size_of(tensor->type);
      tensor->compression.elements =
          std::min<std::uint64_t>(size * per_byte, tensor->compression.elements - first);
    }
  }
  return part;
}

encoded_frame chunker::encode_chunk(std::size_t index) const {
  return encode(chunk(index));
}

reassembler::reassembler(std::span<std::byte> destination, std::size_t max_ranges)
    : destination_(destination), max_ranges_(max_ranges) {
  if (max_ranges_ == 0)
    throw std::invalid_argument("reassembler: max_ranges must be at least 1");
}

reassembler::reassembler(std::span<std::byte> destination, dtype type, tensor_shape shape,
                         std::size_t max_ranges)
    : reassembler(destination, max_ranges) {
  tensor_chunk whole{type, std::move(shape), destination.size(), 0, destination};
  if (auto error = validate_tensor(whole, local_limits()))
    throw std::invalid_argument("reassembler: destination of " +
                                std::to_string(destination.size()) +
                                " bytes for the declared tensor: " + error->message);
  type_ = type;
  shape_ = std::move(whole.shape);
}

bool reassembler::complete() const noexcept {
  return any_chunk_ && received_ == destination_.size();
}

void reassembler::write(const tensor_chunk& chunk, std::byte* out) const {
  if (chunk.compression.type != compression_type::none)
    unpack_(chunk, out);
  else
    std::memcpy(out, chunk.data.data(), chunk.data.size());
}

result<bool> reassembler::add(const tensor_chunk& chunk) {
  using c = decode_error::code;
  const std::uint64_t total = destination_.size();
  const bool packed = chunk.compression.type != compression_type::none;
  // A packed chunk covers its elements' dense bytes (validate_tensor checks they fit).
  const std::uint64_t size =
      packed ? chunk.compression.elements * size_of(chunk.type) : chunk.data.size();
  if (chunk.total_bytes != total)
    return decode_error{c::chunk_mismatch,
                        "chunk of a tensor of " + std::to_string(chunk.total_bytes) +
                            " bytes for a destination of " + std::to_string(total)};
  if (chunk.offset > total || size > total - chunk.offset)
    return decode_error{c::chunk_out_of_range,
                        "chunk [" + std::to_string(chunk.offset) + ", +" + std::to_string(size) +
                            ") outside the tensor of " + std::to_string(total) + " bytes"};
  if (auto error = validate_tensor(chunk, local_limits()))
    return std::move(*error);
  if (packed && !unpack_)
    return decode_error{c::invalid_tensor,
                        std::string{to_string(chunk.compression.type)} +
                            " compressed chunk where a dense value is expected (only pushes, and "
                            "the replies of pulls that ask for it, are compressed)"};
  if (type_ && (*type_ != chunk.type || shape_ != chunk.shape))
    return decode_error{c::chunk_mismatch,
                        "chunk of " + std::string(to_string(chunk.type)) +
                            " differs in dtype or shape from the tensor being reassembled (" +
                            std::string(to_string(*type_)) + ")"};
  if (complete())
    return decode_error{c::chunk_overlap, "chunk at offset " + std::to_string(chunk.offset) +
                                              " after the tensor was complete"};

  if (size != 0 && size == total && received_ == 0) {
    // The whole tensor in one chunk (every small reply): no range to keep, and no map node to
    // allocate for it.
    write(chunk, destination_.data());
    received_ = size;
  } else if (size != 0) {
    const std::uint64_t begin = chunk.offset;
    const std::uint64_t end = begin + size;
    auto next = ranges_.upper_bound(begin);
    auto prev = next == ranges_.begin() ? ranges_.end() : std::prev(next);
    const bool overlaps_prev = prev != ranges_.end() && prev->second > begin;
    const bool overlaps_next = next != ranges_.end() && next->first < end;
    if (overlaps_prev || overlaps_next)
      return decode_error{c::chunk_overlap, "chunk [" + std::to_string(begin) + ", " +
                                                std::to_string(end) +
                                                ") overlaps bytes already received"};
    const bool join_prev = prev != ranges_.end() && prev->second == begin;
    const bool join_next = next != ranges_.end() && next->first == end;
    if (!join_prev && !join_next && ranges_.size() >= max_ranges_)
      return decode_error{c::limit_exceeded,
                          "chunk [" + std::to_string(begin) + ", " + std::to_string(end) +
                              ") would make " + std::to_string(ranges_.size() + 1) +
                              " disjoint ranges, limit " + std::to_string(max_ranges_)};

    write(chunk, destination_.data() + begin);

    std::uint64_t merged_end = end;
    if (join_next) {
      merged_end = next->second;
      ranges_.erase(next);
    }
    if (join_prev)
      prev->second = merged_end;
    else
      ranges_.emplace(begin, merged_end);
    received_ += size;
  }
  if (!type_) {
    type_ = chunk.type;
    shape_ = chunk.shape;
  }
  any_chunk_ = true;
  return complete();
}

} // namespace troupe::wire

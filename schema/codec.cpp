// Conversion between troupe::wire structs and Cap'n Proto frames (format in troupe.capnp).
//
// Decoding distrusts every byte: sizes and the segment table are checked before Cap'n Proto sees
// the buffer, the reader's traversal limit is twice the frame's own word count (so a frame cannot
// make the reader walk much more than it sent, and a large tensor chunk is not cut off by the
// 64 MiB default), every pointer is followed once (a second read would count twice against it),
// and all failures, Cap'n Proto's kj::Exception included, end as a decode_error value.

#include "schema/codec.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include "schema/troupe.capnp.h"

namespace troupe::wire {

namespace ws = troupe::wire_schema;

namespace {

// Payloads smaller than this are copied into the frame: a separate segment (and its far
// pointer) costs more than copying a few KiB, and small messages then stay one piece.
constexpr std::size_t reference_threshold = 4096;

// Cap'n Proto's nesting limit for our frames. The deepest path is Message -> Membership ->
// List(NodeInfo) -> Text, so 16 leaves room for growth while refusing deep garbage.
constexpr int nesting_limit = 16;

// --- little-endian helpers (the prefix and Cap'n Proto's segment table) -------------------------

void store_le32(std::byte* out, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i)
    out[i] = static_cast<std::byte>(v >> (8 * i));
}

void store_le64(std::byte* out, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<std::byte>(v >> (8 * i));
}

std::uint32_t load_le32(const std::byte* in) noexcept {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<std::uint32_t>(in[i]) << (8 * i);
  return v;
}

std::uint64_t load_le64(const std::byte* in) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<std::uint64_t>(in[i]) << (8 * i);
  return v;
}

// --- enums: the schema's enums start with `unspecified @0`, ours at 0, hence the offset of one --

template <class Wire, class Plain>
Wire to_wire(Plain value) noexcept {
  return static_cast<Wire>(static_cast<std::uint16_t>(static_cast<std::uint16_t>(value) + 1));
}

// --- decode failures travel as an exception inside this file only, caught in decode_body -------

struct rejection {
  decode_error error;
};

[[noreturn]] void fail(decode_error::code kind, std::string message) {
  throw rejection{decode_error{kind, std::move(message)}};
}

template <class Plain, class Wire>
Plain from_wire(Wire value, std::uint16_t count, const char* field) {
  auto raw = static_cast<std::uint16_t>(value);
  if (raw == 0 || raw > count)
    fail(decode_error::code::invalid_enum,
         std::string(field) + ": value " + std::to_string(raw) +
             (raw == 0 ? " (unspecified)" : " is not in the enumeration"));
  return static_cast<Plain>(raw - 1);
}

constexpr std::uint16_t role_count = 3;
constexpr std::uint16_t dtype_count = 5;
constexpr std::uint16_t reject_reason_count = 7;
constexpr std::uint16_t error_code_count = 15;
constexpr std::uint16_t consistency_count = 2;

std::string shape_string(const tensor_shape& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i)
      s += ',';
    s += std::to_string(shape[i]);
  }
  return s + ")";
}

} // namespace

std::string_view to_string(decode_error::code kind) noexcept {
  using c = decode_error::code;
  switch (kind) {
  case c::frame_too_large:
    return "frame_too_large";
  case c::truncated:
    return "truncated";
  case c::malformed_frame:
    return "malformed_frame";
  case c::malformed_message:
    return "malformed_message";
  case c::unknown_message:
    return "unknown_message";
  case c::missing_field:
    return "missing_field";
  case c::invalid_enum:
    return "invalid_enum";
  case c::invalid_tensor:
    return "invalid_tensor";
  case c::limit_exceeded:
    return "limit_exceeded";
  case c::invalid_value:
    return "invalid_value";
  case c::chunk_mismatch:
    return "chunk_mismatch";
  case c::chunk_out_of_range:
    return "chunk_out_of_range";
  case c::chunk_overlap:
    return "chunk_overlap";
  }
  return "unknown decode_error code";
}

namespace {

/// Why `threshold` is not allowed for a packing of `type` (not none), or nothing.
std::optional<std::string> threshold_problem(compression_type type, float threshold) {
  if (!std::isfinite(threshold) || threshold < 0 ||
      (type == compression_type::two_bit && threshold == 0))
    return std::string{type == compression_type::two_bit ? "(must be finite and > 0)"
                                                         : "(must be finite and >= 0)"};
  return std::nullopt;
}

/// validate_tensor's rules for a packed chunk (troupe.capnp Tensor.compression), once the dense
/// tensor's declaration has passed.
std::optional<decode_error> validate_packed(const tensor_chunk& chunk, std::size_t element) {
  using c = decode_error::code;
  auto error = [](c kind, std::string msg) { return decode_error{kind, std::move(msg)}; };
  const auto& packing = chunk.compression;
  const std::string what = std::string{to_string(packing.type)} + " compressed chunk";
  if (chunk.type != dtype::float32 && chunk.type != dtype::float16)
    return error(c::invalid_tensor, what + " of a " + std::string{to_string(chunk.type)} +
                                        " tensor: only float32 and float16 tensors are compressed");
  if (auto problem = threshold_problem(packing.type, packing.threshold))
    return error(c::invalid_value,
                 what + " with threshold " + std::to_string(packing.threshold) + " " + *problem);
  if (chunk.offset % element != 0)
    return error(c::invalid_tensor, what + " at offset " + std::to_string(chunk.offset) +
                                        " splits an element of " + std::to_string(element) +
                                        " bytes");
  const std::uint64_t room =
      chunk.offset > chunk.total_bytes ? 0 : (chunk.total_bytes - chunk.offset) / element;
  if (chunk.offset > chunk.total_bytes || packing.elements > room)
    return error(c::invalid_tensor, what + " of " + std::to_string(packing.elements) +
                                        " elements at offset " + std::to_string(chunk.offset) +
                                        " lies outside the tensor of " +
                                        std::to_string(chunk.total_bytes) + " bytes");
  if (packing.elements == 0 && chunk.total_bytes != 0)
    return error(c::invalid_tensor, what + " of no elements of a non-empty tensor");
  const auto expected = packed_bytes(packing.type, packing.elements);
  if (chunk.data.size() != expected)
    return error(c::invalid_tensor, what + " of " + std::to_string(packing.elements) +
                                        " elements has " + std::to_string(chunk.data.size()) +
                                        " bytes; packed they are " + std::to_string(expected));
  return std::nullopt;
}

} // namespace

std::optional<decode_error> validate_tensor(const tensor_chunk& chunk,
                                            const decode_limits& limits) {
  using c = decode_error::code;
  auto error = [](c kind, std::string msg) { return decode_error{kind, std::move(msg)}; };
  const std::size_t element = size_of(chunk.type);
  if (element == 0)
    return error(c::invalid_enum, "tensor dtype " +
                                      std::to_string(static_cast<unsigned>(chunk.type)) +
                                      " is not in the enumeration");
  if (chunk.shape.size() > limits.max_rank)
    return error(c::limit_exceeded, "tensor has " + std::to_string(chunk.shape.size()) +
                                        " axes, limit " + std::to_string(limits.max_rank));
  std::uint64_t count = 1;
  for (std::int64_t extent : chunk.shape) {
    if (extent < 0)
      return error(c::invalid_tensor,
                   "tensor shape " + shape_string(chunk.shape) + " has a negative extent");
    auto e = static_cast<std::uint64_t>(extent);
    if (e != 0 && count > std::numeric_limits<std::uint64_t>::max() / e)
      return error(c::invalid_tensor,
                   "tensor shape " + shape_string(chunk.shape) + " overflows 64 bits");
    count *= e;
  }
  if (count > std::numeric_limits<std::uint64_t>::max() / element)
    return error(c::invalid_tensor,
                 "tensor shape " + shape_string(chunk.shape) + " overflows 64 bits in bytes");
  const std::uint64_t bytes = count * element;
  if (bytes != chunk.total_bytes)
    return error(c::invalid_tensor, "tensor shape " + shape_string(chunk.shape) + " of " +
                                        std::string(to_string(chunk.type)) + " is " +
                                        std::to_string(bytes) + " bytes but total_bytes is " +
                                        std::to_string(chunk.total_bytes));
  if (chunk.total_bytes > limits.max_tensor_bytes)
    return error(c::limit_exceeded, "tensor of " + std::to_string(chunk.total_bytes) +
                                        " bytes, limit " + std::to_string(limits.max_tensor_bytes));
  if (!chunk.row_sparse && !chunk.row_ids.empty())
    return error(c::invalid_tensor, "tensor with row ids that is not row-sparse");
  if (chunk.row_sparse) {
    if (chunk.compression.type != compression_type::none)
      return error(c::invalid_tensor, "row-sparse tensor that is compressed");
    if (chunk.shape.empty())
      return error(c::invalid_tensor, "row-sparse tensor of no axis (it holds rows)");
    if (chunk.offset != 0 || chunk.dense_bytes() != chunk.total_bytes)
      return error(c::invalid_tensor, "row-sparse chunk [" + std::to_string(chunk.offset) + ", +" +
                                          std::to_string(chunk.dense_bytes()) + ") of " +
                                          std::to_string(chunk.total_bytes) +
                                          " bytes: a row-sparse tensor travels whole");
    if (chunk.row_ids.size() / 8 != static_cast<std::uint64_t>(chunk.shape[0]) ||
        chunk.row_ids.size() % 8 != 0)
      return error(c::invalid_tensor, "row-sparse tensor of " + std::to_string(chunk.shape[0]) +
                                          " rows with " + std::to_string(chunk.row_ids.size()) +
                                          " bytes of row ids (8 per row)");
  }
  if (chunk.compression.type != compression_type::none)
    return validate_packed(chunk, element);
  const std::uint64_t size = chunk.data.size();
  if (chunk.offset % element != 0 || size % element != 0)
    return error(c::invalid_tensor, "chunk at offset " + std::to_string(chunk.offset) + " of " +
                                        std::to_string(size) + " bytes splits an element of " +
                                        std::to_string(element) + " bytes");
  if (chunk.offset > chunk.total_bytes || size > chunk.total_bytes - chunk.offset)
    return error(c::invalid_tensor, "chunk [" + std::to_string(chunk.offset) + ", +" +
                                        std::to_string(size) + ") lies outside the tensor of " +
                                        std::to_string(chunk.total_bytes) + " bytes");
  if (size == 0 && chunk.total_bytes != 0)
    return error(c::invalid_tensor, "empty chunk of a non-empty tensor");
  return std::nullopt;
}

// ================================================================================================
// Encoding

namespace {

/// First segments of large frames (a batch of small tensors, hundreds of kilobytes), kept for the
/// next frame of the same size class instead of being freed: Cap'n Proto zeroes a fresh segment
/// (calloc), and fresh pages of that size cost a page fault each, which took a sixth of a server's
/// time at 10,000 keys fused. A builder zeroes what it used of a given segment when it goes, so
/// a kept segment is ready as it is. Frames are encoded on one thread and may be dropped on
/// another (a worker's caller encodes, its link writes): one lock, taken twice per large frame.
class segment_pool {
public:
  /// Segments of fewer words are calloc'ed by Cap'n Proto as before.
  static constexpr std::size_t smallest_words = std::size_t{8} << 10; // 64 KiB
  static constexpr std::size_t largest_words = std::size_t{1} << 20;  // 8 MiB
  /// Kept per size class.
  static constexpr std::size_t kept_per_class = 8;

  struct lease {
    capnp::word* words = nullptr;
    std::size_t size = 0;
    lease() = default;
    lease(capnp::word* w, std::size_t n) : words(w), size(n) {}
    lease(lease&& other) noexcept : words(std::exchange(other.words, nullptr)), size(other.size) {}
    lease& operator=(lease&&) = delete;
    ~lease() {
      if (words != nullptr)
        instance().give_back(words, size);
    }
  };

  static segment_pool& instance() {
    static segment_pool* pool = new segment_pool; // never destroyed: frames may outlive statics
    return *pool;
  }

  /// A zeroed segment of at least `words` words, or none (Cap'n Proto allocates) when `words` is
  /// outside the pooled sizes.
  lease take(std::size_t words) {
    if (words < smallest_words || words > largest_words)
      return {};
    const std::size_t size = std::bit_ceil(words);
    auto& kept = classes_[class_of(size)];
    {
      std::lock_guard hold{mutex_};
      if (!kept.empty()) {
        auto* segment = kept.back();
        kept.pop_back();
        return {segment, size};
      }
    }
    return {static_cast<capnp::word*>(std::calloc(size, sizeof(capnp::word))), size};
  }

private:
  static std::size_t class_of(std::size_t size) {
    return static_cast<std::size_t>(std::countr_zero(size) - std::countr_zero(smallest_words));
  }
  void give_back(capnp::word* segment, std::size_t size) {
    auto& kept = classes_[class_of(size)];
    {
      std::lock_guard hold{mutex_};
      if (kept.size() < kept_per_class) {
        kept.push_back(segment);
        return;
      }
    }
    std::free(segment);
  }

  std::mutex mutex_;
  std::array<std::vector<capnp::word*>, 8> classes_;
};

} // namespace

struct encoded_frame::state {
  explicit state(unsigned first_segment_words)
      : segment(segment_pool::instance().take(first_segment_words)),
        builder(segment.words != nullptr
                    ? capnp::MallocMessageBuilder(kj::arrayPtr(segment.words, segment.size))
                    : capnp::MallocMessageBuilder(first_segment_words)) {}

  /// Declared before the builder, so that the builder zeroes it before it goes back.
  segment_pool::lease segment;
  capnp::MallocMessageBuilder builder;
  // Length prefix and segment table, little-endian.
  std::vector<std::byte> header;
  // A referenced payload (at most one per message: one tensor) and its last partial word.
  const std::byte* external = nullptr;
  std::size_t external_size = 0;
  alignas(8) std::byte tail[8] = {};
  std::vector<std::span<const std::byte>> pieces;
  std::size_t size = 0;
};

encoded_frame::encoded_frame(std::unique_ptr<state> s) noexcept : state_(std::move(s)) {}
encoded_frame::encoded_frame(encoded_frame&&) noexcept = default;
encoded_frame& encoded_frame::operator=(encoded_frame&&) noexcept = default;
encoded_frame::~encoded_frame() = default;

std::span<const std::span<const std::byte>> encoded_frame::pieces() const noexcept {
  return state_->pieces;
}

std::size_t encoded_frame::size() const noexcept {
  return state_->size;
}

void encoded_frame::flatten_into(std::span<std::byte> out) const {
  if (out.size() != state_->size)
    throw std::invalid_argument("encoded_frame::flatten_into: buffer of " +
                                std::to_string(out.size()) + " bytes for a frame of " +
                                std::to_string(state_->size));
  std::byte* at = out.data();
  for (auto piece : state_->pieces) {
    if (!piece.empty())
      std::memcpy(at, piece.data(), piece.size());
    at += piece.size();
  }
}

std::vector<std::byte> encoded_frame::flatten() const {
  std::vector<std::byte> out(state_->size);
  flatten_into(out);
  return out;
}

namespace {

// Words the first segment should have so that the whole message fits in it (one segment, one
// piece); an underestimate only costs an extra segment.
struct size_estimate {
  std::size_t words = 16;
  /// A batch's tensors are copied into the frame whatever their size.
  bool all_inline = false;
  void text(const std::string& s) { words += s.size() / 8 + 2; }
  void tensor(const tensor_chunk& t) {
    words += 11 + t.shape.size() + t.row_ids.size() / 8;
    if (!t.shm && (all_inline || t.data.size() < reference_threshold))
      words += t.data.size() / 8 + 1;
  }
  void operator()(const batch& m) {
    for (const auto& one : m.messages) {
      // A list element is a Message struct (its union tag and one pointer), and the request or
      // answer it points to: its fields and the pointer to its tensor. Fewer words than that put
      // a batch of small values referenced in the arena in two segments.
      size_estimate item{8, true};
      std::visit(item, one);
      words += item.words;
    }
  }
  void operator()(const registration& m) {
    text(m.job_id);
    text(m.host);
  }
  void operator()(const admission& m) {
    if (auto* r = std::get_if<rejected>(&m.outcome))
      text(r->detail);
    else if (auto* a = std::get_if<admitted>(&m.outcome))
      words += 10 + a->first_barrier.size(); // the sealed secret, the flag, the list
  }
  void operator()(const membership& m) {
    words += 5 + 4 * m.key_ranges.size();
    for (const auto& n : m.nodes) {
      words += 5;
      text(n.host);
    }
  }
  void operator()(const init& m) { tensor(m.tensor); }
  void operator()(const push& m) { tensor(m.tensor); }
  void operator()(const pull_reply& m) { tensor(m.tensor); }
  void operator()(const pushpull& m) { tensor(m.tensor); }
  void operator()(const set_optimizer& m) {
    text(m.name);
    for (const auto& p : m.params) {
      words += 3;
      text(p.name);
    }
  }
  void operator()(const set_gradient_compression& m) { text(m.type); }
  void operator()(const command& m) { text(m.path); }
  void operator()(const error_reply& m) { text(m.message); }
  void operator()(const pull_request& m) { words += 1 + m.row_ids.size() / 8; }
  void operator()(const ack&) {}
  void operator()(const barrier& m) { words += 1 + m.values.size(); }
  void operator()(const barrier_release& m) {
    for (const auto& g : m.gathered)
      words += 4 + g.values.size();
  }
  void operator()(const heartbeat&) {}
  void operator()(const link_hello& m) {
    text(m.host_id);
    words += 16; // nonce, proof, key share and node proof, 32 bytes each
  }
  void operator()(const arena_offer& m) { text(m.name); }
  void operator()(const arena_accept& m) { text(m.detail); }
  void operator()(const arena_release& m) { words += 2 + m.offsets.size(); }
  void operator()(const sync_settings&) {}
  void operator()(const link_credit&) {}
  void operator()(const link_auth&) { words += 12; }
  void operator()(const hand_over& m) { words += 4 + m.ranges.size() / 2; }
  void operator()(const range_data& m) { tensor(m.tensor); }
};

capnp::Text::Reader text_of(const std::string& s) {
  // std::string's data() is NUL-terminated, as Text::Reader requires.
  return capnp::Text::Reader(s.data(), s.size());
}

capnp::Data::Reader digest_of(const link_digest& digest) {
  return capnp::Data::Reader(digest.data(), digest.size());
}

class writer {
public:
  /// `all_inline`: tensors are copied into the frame whatever their size (a batch's).
  writer(ws::Message::Builder root, encoded_frame::state& st, bool all_inline = false)
      : root_(root), st_(st), all_inline_(all_inline) {}

  void operator()(const batch& m) {
    if (m.messages.size() > max_batch_messages)
      throw std::invalid_argument("encode: a batch of " + std::to_string(m.messages.size()) +
                                  " messages exceeds " + std::to_string(max_batch_messages));
    auto list = root_.initBatch(list_size(m.messages.size()));
    for (unsigned i = 0; i < m.messages.size(); ++i)
      std::visit(writer{list[i], st_, true}, m.messages[i]);
  }

  void operator()(const registration& m) {
    auto b = root_.initRegistration();
    b.setRequestId(m.request_id);
    b.setProtocolVersion(m.protocol_version);
    b.setRole(to_wire<ws::Role>(m.node_role));
    b.setJobId(text_of(m.job_id));
    b.setHost(text_of(m.host));
    b.setPort(m.port);
    b.setRankHint(m.rank_hint);
    b.setRecovering(m.recovering);
    b.setJoinAtBarrier(m.join_at_barrier);
  }
  void operator()(const admission& m) {
    auto b = root_.initAdmission();
    b.setRequestId(m.request_id);
    if (auto* a = std::get_if<admitted>(&m.outcome)) {
      auto g = b.initAdmitted();
      g.setRank(a->rank);
      g.setNodeId(a->node_id);
      if (a->secret)
        g.setSealedSecret(capnp::Data::Reader(a->secret->data(), a->secret->size()));
      g.setJoined(a->joined);
      if (!a->first_barrier.empty()) {
        auto first = g.initFirstBarrier(list_size(a->first_barrier.size()));
        for (unsigned i = 0; i < a->first_barrier.size(); ++i)
          first.set(i, a->first_barrier[i]);
      }
    } else {
      const auto& r = std::get<rejected>(m.outcome);
      auto g = b.initRejected();
      g.setReason(to_wire<ws::RejectReason>(r.reason));
      g.setDetail(text_of(r.detail));
    }
  }
  void operator()(const membership& m) {
    auto b = root_.initMembership();
    b.setEpoch(m.epoch);
    b.setNumWorkers(m.num_workers);
    b.setNumServers(m.num_servers);
    b.setRequestId(m.request_id);
    auto nodes = b.initNodes(list_size(m.nodes.size()));
    for (unsigned i = 0; i < m.nodes.size(); ++i) {
      const auto& n = m.nodes[i];
      auto nb = nodes[i];
      nb.setNodeId(n.node_id);
      nb.setRole(to_wire<ws::Role>(n.node_role));
      nb.setRank(n.rank);
      nb.setHost(text_of(n.host));
      nb.setDataPort(n.data_port);
      nb.setAlive(n.alive);
      nb.setLeft(n.left);
    }
    auto ranges = b.initKeyRanges(list_size(m.key_ranges.size()));
    for (unsigned i = 0; i < m.key_ranges.size(); ++i) {
      const auto& r = m.key_ranges[i];
      auto rb = ranges[i];
      rb.setBegin(r.begin);
      rb.setEnd(r.end);
      rb.setServerRank(r.server_rank);
      rb.setShardIndex(r.shard_index);
    }
  }
  void operator()(const init& m) {
    auto b = root_.initInit();
    b.setRequestId(m.request_id);
    b.setKey(m.key);
    b.setRowSparse(m.row_sparse);
    write_tensor(b.initTensor(), m.tensor);
  }
  void operator()(const push& m) {
    auto b = root_.initPush();
    b.setRequestId(m.request_id);
    b.setKey(m.key);
    b.setSenderRank(m.sender_rank);
    b.setRound(m.round);
    b.setResent(m.resent);
    write_tensor(b.initTensor(), m.tensor);
  }
  void operator()(const pull_request& m) {
    auto b = root_.initPullRequest();
    b.setRequestId(m.request_id);
    b.setKey(m.key);
    b.setSenderRank(m.sender_rank);
    b.setRound(m.round);
    b.setTimeoutMs(m.timeout_ms);
    // Written as they are, so that a receiver's checks see what a sender sent.
    b.setRowSparse(m.row_sparse);
    if (!m.row_ids.empty())
      b.setRowIds(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(m.row_ids.data()),
                                      m.row_ids.size()));
    if (m.reply_compression.type != compression_type::none) {
      b.setReplyCompression(static_cast<ws::Compression>(m.reply_compression.type));
      b.setReplyThreshold(m.reply_compression.threshold);
    }
  }
  void operator()(const pull_reply& m) {
    auto b = root_.initPullReply();
    b.setRequestId(m.request_id);
    b.setKey(m.key);
    b.setRound(m.round);
    b.setDurable(m.durable);
    write_tensor(b.initTensor(), m.tensor);
  }
  void operator()(const pushpull& m) {
    auto b = root_.initPushPull();
    b.setRequestId(m.request_id);
    b.setKey(m.key);
    b.setSenderRank(m.sender_rank);
    b.setRound(m.round);
    b.setTimeoutMs(m.timeout_ms);
    b.setResent(m.resent);
    if (m.reply_compression.type != compression_type::none) {
      b.setReplyCompression(static_cast<ws::Compression>(m.reply_compression.type));
      b.setReplyThreshold(m.reply_compression.threshold);
    }
    write_tensor(b.initTensor(), m.tensor);
  }
  void operator()(const ack& m) {
    auto b = root_.initAck();
    b.setRequestId(m.request_id);
    b.setRound(m.round);
    b.setDropped(m.dropped);
    b.setDurable(m.durable);
  }
  void operator()(const barrier& m) {
    auto b = root_.initBarrier();
    b.setRequestId(m.request_id);
    b.setBarrierId(m.barrier_id);
    b.setGroup(m.group);
    b.setSenderNodeId(m.sender_node_id);
    b.setStart(m.start);
    if (!m.values.empty()) {
      auto values = b.initValues(list_size(m.values.size()));
      for (unsigned i = 0; i < values.size(); ++i)
        values.set(i, m.values[i]);
    }
  }
  void operator()(const barrier_release& m) {
    auto b = root_.initBarrierRelease();
    b.setRequestId(m.request_id);
    b.setBarrierId(m.barrier_id);
    b.setGroup(m.group);
    if (!m.gathered.empty()) {
      auto gathered = b.initGathered(list_size(m.gathered.size()));
      for (unsigned i = 0; i < gathered.size(); ++i) {
        const auto& member = m.gathered[i];
        auto g = gathered[i];
        g.setRole(to_wire<ws::Role>(member.member_role));
        g.setRank(member.rank);
        auto values = g.initValues(list_size(member.values.size()));
        for (unsigned v = 0; v < values.size(); ++v)
          values.set(v, member.values[v]);
      }
    }
  }
  void operator()(const set_optimizer& m) {
    auto b = root_.initSetOptimizer();
    b.setRequestId(m.request_id);
    b.setName(text_of(m.name));
    auto params = b.initParams(list_size(m.params.size()));
    for (unsigned i = 0; i < m.params.size(); ++i) {
      params[i].setName(text_of(m.params[i].name));
      params[i].setValue(m.params[i].value);
    }
  }
  void operator()(const set_gradient_compression& m) {
    auto b = root_.initSetGradientCompression();
    b.setRequestId(m.request_id);
    b.setType(text_of(m.type));
    b.setThreshold(m.threshold);
  }
  void operator()(const command& m) {
    auto b = root_.initCommand();
    b.setRequestId(m.request_id);
    b.setDumpOptimizer(m.dump_optimizer);
    b.setRounds(m.rounds);
    switch (m.kind) {
    case command_kind::stop:
      b.setStop();
      return;
    case command_kind::save_checkpoint:
      b.setSaveCheckpoint(text_of(m.path));
      return;
    case command_kind::load_checkpoint:
      b.setLoadCheckpoint(text_of(m.path));
      return;
    case command_kind::sync_mode:
      b.setSyncMode();
      return;
    case command_kind::async_mode:
      b.setAsyncMode();
      return;
    }
    throw std::invalid_argument("encode: command_kind " +
                                std::to_string(static_cast<unsigned>(m.kind)) +
                                " is not in the enumeration");
  }
  void operator()(const heartbeat& m) {
    auto b = root_.initHeartbeat();
    b.setSenderNodeId(m.sender_node_id);
    b.setSequence(m.sequence);
    b.setTimestampNs(m.timestamp_ns);
  }
  void operator()(const error_reply& m) {
    auto b = root_.initError();
    b.setRequestId(m.request_id);
    if (m.key)
      b.setKey(*m.key);
    else
      b.setNoKey();
    b.setCode(to_wire<ws::ErrorCode>(m.code));
    b.setMessage(text_of(m.message));
  }
  void operator()(const link_hello& m) {
    auto b = root_.initLinkHello();
    b.setHostId(text_of(m.host_id));
    b.setArenaBytes(m.arena_bytes);
    b.setWindowBytes(m.window_bytes);
    b.setNonce(digest_of(m.nonce));
    if (m.proof)
      b.setProof(digest_of(*m.proof));
    if (m.key_share)
      b.setKeyShare(digest_of(*m.key_share));
    if (m.identity) {
      b.setNodeRole(to_wire<ws::Role>(m.identity->node_role));
      b.setNodeRank(m.identity->rank);
    }
    if (m.node_proof)
      b.setNodeProof(digest_of(*m.node_proof));
  }
  void operator()(const link_auth& m) {
    auto b = root_.initLinkAuth();
    b.setProof(digest_of(m.proof));
    if (m.key_share)
      b.setKeyShare(digest_of(*m.key_share));
    if (m.node_proof)
      b.setNodeProof(digest_of(*m.node_proof));
  }
  void operator()(const arena_offer& m) {
    auto b = root_.initArenaOffer();
    b.setName(text_of(m.name));
    b.setBytes(m.bytes);
  }
  void operator()(const arena_accept& m) {
    auto b = root_.initArenaAccept();
    b.setOk(m.ok);
    b.setDetail(text_of(m.detail));
  }
  void operator()(const arena_release& m) {
    auto b = root_.initArenaRelease();
    auto offsets = b.initOffsets(list_size(m.offsets.size()));
    for (unsigned i = 0; i < m.offsets.size(); ++i)
      offsets.set(i, m.offsets[i]);
  }
  void operator()(const sync_settings& m) {
    auto b = root_.initSyncSettings();
    b.setRequestId(m.request_id);
    b.setMode(to_wire<ws::Consistency>(m.mode));
    b.setQuorum(m.quorum);
    b.setRescaleQuorum(m.rescale_quorum);
    b.setMaxStaleness(m.max_staleness);
    b.setMaxRoundsAhead(m.max_rounds_ahead);
  }
  void operator()(const link_credit& m) { root_.initLinkCredit().setBytes(m.bytes); }
  void operator()(const hand_over& m) {
    auto b = root_.initHandOver();
    b.setRequestId(m.request_id);
    auto ranges = b.initRanges(list_size(m.ranges.size()));
    for (unsigned i = 0; i < m.ranges.size(); ++i)
      ranges.set(i, m.ranges[i]);
    b.setToServer(m.to_server);
  }
  void operator()(const range_data& m) {
    auto b = root_.initRangeData();
    b.setRequestId(m.request_id);
    b.setShard(m.shard);
    b.setBytes(m.bytes);
    write_tensor(b.initTensor(), m.tensor);
  }

private:
  static unsigned list_size(std::size_t n) {
    // Cap'n Proto lists hold fewer than 2^29 elements.
    if (n >= (std::size_t{1} << 29))
      throw std::invalid_argument("encode: list of " + std::to_string(n) +
                                  " elements exceeds Cap'n Proto's 2^29-1");
    return static_cast<unsigned>(n);
  }

  void write_tensor(ws::Tensor::Builder b, const tensor_chunk& t) {
    if (t.data.size() > max_chunk_bytes)
      throw std::invalid_argument("encode: tensor payload of " + std::to_string(t.data.size()) +
                                  " bytes exceeds max_chunk_bytes; split it with chunker");
    b.setDtype(to_wire<ws::DType>(t.type));
    auto shape = b.initShape(list_size(t.shape.size()));
    for (unsigned i = 0; i < t.shape.size(); ++i)
      shape.set(i, t.shape[i]);
    b.setTotalBytes(t.total_bytes);
    b.setOffset(t.offset);
    if (t.compression.type != compression_type::none) {
      auto packing = b.initCompression();
      packing.setType(static_cast<ws::Compression>(t.compression.type));
      packing.setThreshold(t.compression.threshold);
      packing.setElements(t.compression.elements);
    }
    b.setRowSparse(t.row_sparse);
    if (!t.row_ids.empty())
      b.setRowIds(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(t.row_ids.data()),
                                      t.row_ids.size()));
    if (t.shm) {
      // The bytes are in the sender's shared-memory arena already; the frame only says where.
      if (t.shm->bytes == 0)
        throw std::invalid_argument("encode: an empty shared-memory reference");
      auto shm = b.initShm();
      shm.setOffset(t.shm->offset);
      shm.setBytes(t.shm->bytes);
      return;
    }
    const auto* bytes = reinterpret_cast<const kj::byte*>(t.data.data());
    const bool aligned = reinterpret_cast<std::uintptr_t>(bytes) % 8 == 0;
    if (t.data.size() >= reference_threshold && aligned && !all_inline_) {
      // The payload becomes a segment of its own that views the caller's memory (Cap'n Proto's
      // referenceExternalData: no copy; docs/data-path.md, "Framing").
      b.adoptData(st_.builder.getOrphanage().referenceExternalData(
          capnp::Data::Reader(bytes, t.data.size())));
      st_.external = t.data.data();
      st_.external_size = t.data.size();
    } else {
      auto data = b.initData(static_cast<unsigned>(t.data.size()));
      if (!t.data.empty())
        std::memcpy(data.begin(), bytes, t.data.size());
    }
  }

  ws::Message::Builder root_;
  encoded_frame::state& st_;
  bool all_inline_ = false;
};

// Lays out prefix, segment table and segments as pieces. A referenced payload's segment is
// ceil(size / 8) words long while the caller's buffer may end up to 7 bytes earlier: emit the
// buffer's whole words as one piece and its last partial word, zero-padded, from our own copy, so
// nothing past the caller's buffer is read or sent.
void lay_out(encoded_frame::state& st) {
  auto segments = st.builder.getSegmentsForOutput();
  const std::size_t count = segments.size();
  // Segment count and sizes are 4 bytes each, padded to a whole word.
  const std::size_t table_bytes = ((count + 2) / 2) * 8;
  std::size_t body = table_bytes;
  for (auto segment : segments)
    body += segment.size() * sizeof(capnp::word);

  st.header.assign(frame_prefix_bytes + table_bytes, std::byte{0});
  std::byte* h = st.header.data();
  store_le64(h, body);
  store_le32(h + 8, static_cast<std::uint32_t>(count - 1));
  for (std::size_t i = 0; i < count; ++i)
    store_le32(h + 12 + 4 * i, static_cast<std::uint32_t>(segments[i].size()));

  st.pieces.clear();
  st.pieces.reserve(count + 2);
  st.pieces.emplace_back(st.header);
  for (auto segment : segments) {
    const auto* begin = reinterpret_cast<const std::byte*>(segment.begin());
    if (st.external != nullptr && begin == st.external) {
      const std::size_t whole = st.external_size / 8 * 8;
      const std::size_t rest = st.external_size - whole;
      st.pieces.emplace_back(begin, whole);
      if (rest != 0) {
        std::memcpy(st.tail, begin + whole, rest);
        st.pieces.emplace_back(st.tail, sizeof st.tail);
      }
    } else {
      st.pieces.emplace_back(begin, segment.size() * sizeof(capnp::word));
    }
  }
  st.size = frame_prefix_bytes + body;
}

} // namespace

encoded_frame encode(const message& msg) {
  size_estimate estimate;
  std::visit(estimate, msg);
  auto st = std::make_unique<encoded_frame::state>(
      static_cast<unsigned>(std::min<std::size_t>(estimate.words, std::size_t{1} << 20)));
  try {
    auto root = st->builder.initRoot<ws::Message>();
    std::visit(writer{root, *st}, msg);
  } catch (const kj::Exception& e) {
    throw std::invalid_argument(std::string("encode: Cap'n Proto refused the message: ") +
                                e.getDescription().cStr());
  }
  lay_out(*st);
  return encoded_frame(std::move(st));
}

// ================================================================================================
// Decoding

namespace {

class reader {
public:
  reader(const decode_limits& limits, std::span<const std::byte> arena)
      : limits_(limits), arena_(arena) {}

  message read(ws::Message::Reader root) {
    switch (root.which()) {
    case ws::Message::UNSET:
      fail(decode_error::code::unknown_message, "message union is unset");
    case ws::Message::REGISTRATION:
      return read(root.getRegistration());
    case ws::Message::ADMISSION:
      return read(root.getAdmission());
    case ws::Message::MEMBERSHIP:
      return read(root.getMembership());
    case ws::Message::INIT:
      return read(root.getInit());
    case ws::Message::PUSH:
      return read(root.getPush());
    case ws::Message::PULL_REQUEST:
      return read(root.getPullRequest());
    case ws::Message::PULL_REPLY:
      return read(root.getPullReply());
    case ws::Message::PUSH_PULL:
      return read(root.getPushPull());
    case ws::Message::ACK: {
      auto r = root.getAck();
      return ack{r.getRequestId(), r.getRound(), r.getDropped(), r.getDurable()};
    }
    case ws::Message::BARRIER:
      return read(root.getBarrier());
    case ws::Message::BARRIER_RELEASE:
      return read(root.getBarrierRelease());
    case ws::Message::SET_OPTIMIZER:
      return read(root.getSetOptimizer());
    case ws::Message::SET_GRADIENT_COMPRESSION:
      return read(root.getSetGradientCompression());
    case ws::Message::COMMAND:
      return read(root.getCommand());
    case ws::Message::HEARTBEAT:
      return read(root.getHeartbeat());
    case ws::Message::ERROR:
      return read(root.getError());
    case ws::Message::LINK_HELLO:
      return read(root.getLinkHello());
    case ws::Message::ARENA_OFFER:
      return read(root.getArenaOffer());
    case ws::Message::ARENA_ACCEPT: {
      auto r = root.getArenaAccept();
      return arena_accept{r.getOk(), bounded_text(r.getDetail(), "arena accept detail")};
    }
    case ws::Message::ARENA_RELEASE: {
      auto offsets = root.getArenaRelease().getOffsets();
      check_list(offsets.size(), "arena release offsets");
      arena_release m;
      m.offsets.reserve(offsets.size());
      for (std::uint64_t offset : offsets)
        m.offsets.push_back(offset);
      return m;
    }
    case ws::Message::SYNC_SETTINGS:
      return read(root.getSyncSettings());
    case ws::Message::LINK_CREDIT: {
      const std::uint64_t bytes = root.getLinkCredit().getBytes();
      if (bytes == 0)
        fail(decode_error::code::invalid_value, "link credit of 0 bytes");
      return link_credit{bytes};
    }
    case ws::Message::LINK_AUTH: {
      auto r = root.getLinkAuth();
      return link_auth{digest(r.hasProof(), r.getProof(), "link auth proof"),
                       optional_digest(r.hasKeyShare(), r.getKeyShare(), "link auth key share"),
                       optional_digest(r.hasNodeProof(), r.getNodeProof(), "link auth node proof")};
    }
    case ws::Message::BATCH:
      return read_batch(root.getBatch());
    case ws::Message::HAND_OVER: {
      auto r = root.getHandOver();
      auto ranges = r.getRanges();
      check_list(ranges.size(), "hand-over ranges");
      if (ranges.size() == 0)
        fail(decode_error::code::invalid_value, "hand-over of no key range");
      hand_over m{r.getRequestId(), {}, r.getToServer()};
      m.ranges.reserve(ranges.size());
      for (std::uint32_t range : ranges)
        m.ranges.push_back(range);
      return m;
    }
    case ws::Message::RANGE_DATA: {
      auto r = root.getRangeData();
      range_data m{r.getRequestId(), r.getShard(), r.getBytes(), {}};
      m.tensor = read_tensor(r.hasTensor(), r.getTensor(), "range data tensor");
      if (m.tensor.type != dtype::int64 || m.tensor.shape.size() != 1 ||
          m.bytes > m.tensor.total_bytes || m.tensor.total_bytes - m.bytes >= 8)
        fail(decode_error::code::invalid_tensor,
             "range data: not the int64 words of a " + std::to_string(m.bytes) + "-byte snapshot");
      return m;
    }
    }
    fail(decode_error::code::unknown_message,
         "message kind " + std::to_string(static_cast<unsigned>(root.which())) +
             " is not known to protocol version " + std::to_string(protocol_version));
  }

private:
  batch read_batch(capnp::List<ws::Message>::Reader list) {
    if (list.size() == 0)
      fail(decode_error::code::missing_field, "an empty batch");
    if (list.size() > max_batch_messages)
      fail(decode_error::code::limit_exceeded, "a batch of " + std::to_string(list.size()) +
                                                   " messages, above " +
                                                   std::to_string(max_batch_messages));
    check_list(list.size(), "batch");
    batch m;
    m.messages.reserve(list.size());
    for (auto element : list) {
      if (element.which() == ws::Message::BATCH)
        fail(decode_error::code::invalid_value, "a batch inside a batch");
      auto one = read(element);
      const std::string_view kind = kind_name(one);
      if (const auto* tensor = tensor_of(one)) {
        // A reference into the arena was resolved and bounds-checked by read(), as alone.
        if (tensor->offset != 0 || tensor->dense_bytes() != tensor->total_bytes)
          fail(decode_error::code::invalid_tensor,
               "a " + std::string(kind) + " in a batch carries a chunk of " +
                   std::to_string(tensor->dense_bytes()) + " bytes at offset " +
                   std::to_string(tensor->offset) + " of a tensor of " +
                   std::to_string(tensor->total_bytes) + ", not the whole tensor");
      }
      auto fused = to_batched(std::move(one));
      if (!fused)
        fail(decode_error::code::invalid_value, "a " + std::string(kind) + " in a batch");
      m.messages.push_back(std::move(*fused));
    }
    return m;
  }

  // Text that must be present; `non_empty` also refuses "".
  std::string required_text(bool present, capnp::Text::Reader text, const char* field,
                            bool non_empty = true) {
    if (!present)
      fail(decode_error::code::missing_field, std::string(field) + " is missing");
    std::string s = bounded_text(text, field);
    if (non_empty && s.empty())
      fail(decode_error::code::missing_field, std::string(field) + " is empty");
    return s;
  }

  std::string bounded_text(capnp::Text::Reader text, const char* field) {
    if (text.size() > limits_.max_text_bytes)
      fail(decode_error::code::limit_exceeded, std::string(field) + " of " +
                                                   std::to_string(text.size()) + " bytes, limit " +
                                                   std::to_string(limits_.max_text_bytes));
    return std::string(text.cStr(), text.size());
  }

  void check_list(std::size_t size, const char* field) {
    if (size > limits_.max_list_elements)
      fail(decode_error::code::limit_exceeded, std::string(field) + " has " + std::to_string(size) +
                                                   " elements, limit " +
                                                   std::to_string(limits_.max_list_elements));
  }

  /// `packable`: the message may carry a packed tensor (push, pushpull, pull reply); `sparse`: a
  /// row-sparse one (push).
  tensor_chunk read_tensor(bool present, ws::Tensor::Reader t, const char* field,
                           bool packable = false, bool sparse = false) {
    if (!present)
      fail(decode_error::code::missing_field, std::string(field) + " is missing");
    tensor_chunk c;
    c.type = from_wire<dtype>(t.getDtype(), dtype_count, "tensor dtype");
    auto shape = t.getShape();
    if (shape.size() > limits_.max_rank)
      fail(decode_error::code::limit_exceeded, "tensor has " + std::to_string(shape.size()) +
                                                   " axes, limit " +
                                                   std::to_string(limits_.max_rank));
    c.shape.reserve(shape.size());
    for (std::int64_t extent : shape)
      c.shape.push_back(extent);
    c.total_bytes = t.getTotalBytes();
    c.offset = t.getOffset();
    auto packing = t.getCompression();
    const auto packing_type = static_cast<std::uint16_t>(packing.getType());
    if (packing_type > static_cast<std::uint16_t>(compression_type::one_bit))
      fail(decode_error::code::invalid_enum, "tensor compression type: value " +
                                                 std::to_string(packing_type) +
                                                 " is not in the enumeration");
    c.compression = {static_cast<compression_type>(packing_type), packing.getThreshold(),
                     packing.getElements()};
    if (c.compression.type != compression_type::none && !packable)
      fail(decode_error::code::invalid_tensor,
           std::string(field) + " is " + std::string{to_string(c.compression.type)} +
               " compressed; only push, pushpull and pull reply tensors are");
    c.row_sparse = t.getRowSparse();
    auto ids = t.getRowIds();
    c.row_ids =
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(ids.begin()), ids.size());
    if (c.row_sparse && !sparse)
      fail(decode_error::code::invalid_tensor,
           std::string(field) + " is row-sparse; only push tensors are");
    auto data = t.getData();
    c.data =
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(data.begin()), data.size());
    auto shm = t.getShm();
    if (shm.getBytes() != 0) {
      // Only bounds are checked: the arena's bytes are numbers like any payload.
      const shm_ref ref{shm.getOffset(), shm.getBytes()};
      const std::string where = "shared-memory reference [" + std::to_string(ref.offset) + ", +" +
                                std::to_string(ref.bytes) + ")";
      if (!c.data.empty())
        fail(decode_error::code::invalid_tensor,
             std::string(field) + " has both inline data and a " + where);
      if (arena_.empty())
        fail(decode_error::code::invalid_tensor,
             std::string(field) + " has a " + where + " but this connection has no arena");
      if (ref.offset > arena_.size() || ref.bytes > arena_.size() - ref.offset)
        fail(decode_error::code::invalid_tensor, std::string(field) + " has a " + where +
                                                     " outside the arena of " +
                                                     std::to_string(arena_.size()) + " bytes");
      if (ref.offset % 8 != 0)
        fail(decode_error::code::invalid_tensor,
             std::string(field) + " has a " + where + " not aligned to 8 bytes");
      c.data =
          arena_.subspan(static_cast<std::size_t>(ref.offset), static_cast<std::size_t>(ref.bytes));
      c.shm = ref;
    }
    if (auto error = validate_tensor(c, limits_))
      throw rejection{std::move(*error)};
    return c;
  }

  std::uint8_t read_group(std::uint8_t group) {
    if (group == 0 || (group & ~group::all) != 0)
      fail(decode_error::code::invalid_value,
           "barrier group " + std::to_string(group) + " is not a non-empty subset of 1|2|4");
    return group;
  }

  message read(ws::Registration::Reader r) {
    registration m;
    m.request_id = r.getRequestId();
    m.protocol_version = r.getProtocolVersion();
    m.node_role = from_wire<role>(r.getRole(), role_count, "registration role");
    m.job_id = required_text(r.hasJobId(), r.getJobId(), "registration job id");
    // authToken (an older sender's) is ignored: the link handshake proved the token.
    m.host = required_text(r.hasHost(), r.getHost(), "registration host");
    m.port = r.getPort();
    m.rank_hint = r.getRankHint();
    m.recovering = r.getRecovering();
    m.join_at_barrier = r.getJoinAtBarrier();
    if (m.rank_hint < -1)
      fail(decode_error::code::invalid_value,
           "registration rank hint " + std::to_string(m.rank_hint) + " is below -1");
    return m;
  }

  message read(ws::Admission::Reader r) {
    admission m;
    m.request_id = r.getRequestId();
    switch (r.which()) {
    case ws::Admission::UNSET:
      fail(decode_error::code::missing_field, "admission outcome is unset");
    case ws::Admission::ADMITTED: {
      auto g = r.getAdmitted();
      admitted out;
      out.rank = g.getRank();
      out.node_id = g.getNodeId();
      out.secret = sealed_secret{};
      const auto sealed = g.getSealedSecret();
      if (!g.hasSealedSecret() || sealed.size() != out.secret->size())
        fail(decode_error::code::invalid_value,
             "admission sealed secret of " + std::to_string(sealed.size()) + " bytes (expected " +
                 std::to_string(out.secret->size()) + ")");
      std::copy(sealed.begin(), sealed.end(), out.secret->begin());
      out.joined = g.getJoined();
      const auto first = g.getFirstBarrier();
      if (first.size() > 8)
        fail(decode_error::code::invalid_value,
             "admission first barriers: " + std::to_string(first.size()) +
                 " groups (at most 8: the unions of the three groups)");
      for (const auto id : first)
        out.first_barrier.push_back(id);
      m.outcome = out;
      return m;
    }
    case ws::Admission::REJECTED: {
      auto g = r.getRejected();
      rejected out;
      out.reason = from_wire<reject_reason>(g.getReason(), reject_reason_count, "admission reason");
      out.detail = bounded_text(g.getDetail(), "admission detail");
      m.outcome = std::move(out);
      return m;
    }
    }
    fail(decode_error::code::unknown_message,
         "admission outcome " + std::to_string(static_cast<unsigned>(r.which())) + " is not known");
  }

  message read(ws::Membership::Reader r) {
    membership m;
    m.epoch = r.getEpoch();
    m.num_workers = r.getNumWorkers();
    m.num_servers = r.getNumServers();
    m.request_id = r.getRequestId();
    auto nodes = r.getNodes();
    check_list(nodes.size(), "membership nodes");
    m.nodes.reserve(nodes.size());
    for (auto n : nodes) {
      node_info info;
      info.node_id = n.getNodeId();
      info.node_role = from_wire<role>(n.getRole(), role_count, "membership node role");
      info.rank = n.getRank();
      info.host = bounded_text(n.getHost(), "membership node host");
      info.data_port = n.getDataPort();
      info.alive = n.getAlive();
      info.left = n.getLeft();
      m.nodes.push_back(std::move(info));
    }
    auto ranges = r.getKeyRanges();
    check_list(ranges.size(), "membership key ranges");
    m.key_ranges.reserve(ranges.size());
    for (auto kr : ranges) {
      key_range range{kr.getBegin(), kr.getEnd(), kr.getServerRank(), kr.getShardIndex()};
      const std::string where = "key range " + std::to_string(m.key_ranges.size());
      if (range.begin >= range.end)
        fail(decode_error::code::invalid_value, where + " [" + std::to_string(range.begin) + ", " +
                                                    std::to_string(range.end) + ") is empty");
      if (!m.key_ranges.empty() && m.key_ranges.back().end > range.begin)
        fail(decode_error::code::invalid_value,
             where + " begins at " + std::to_string(range.begin) +
                 ", before the previous range ends at " + std::to_string(m.key_ranges.back().end));
      if (range.server_rank >= m.num_servers)
        fail(decode_error::code::invalid_value, where + " names server rank " +
                                                    std::to_string(range.server_rank) + " of " +
                                                    std::to_string(m.num_servers));
      m.key_ranges.push_back(range);
    }
    return m;
  }

  message read(ws::Init::Reader r) {
    init m;
    m.request_id = r.getRequestId();
    m.key = r.getKey();
    m.tensor = read_tensor(r.hasTensor(), r.getTensor(), "init tensor");
    m.row_sparse = r.getRowSparse();
    if (m.row_sparse && m.tensor.shape.empty())
      fail(decode_error::code::invalid_tensor, "row-sparse init of a scalar (it needs rows)");
    return m;
  }

  message read(ws::Push::Reader r) {
    push m;
    m.request_id = r.getRequestId();
    m.key = r.getKey();
    m.sender_rank = r.getSenderRank();
    m.round = r.getRound();
    m.resent = r.getResent();
    m.tensor = read_tensor(r.hasTensor(), r.getTensor(), "push tensor", true, true);
    return m;
  }

  message read(ws::PullRequest::Reader r) {
    pull_request m{r.getRequestId(), r.getKey(), r.getSenderRank(), r.getRound(), r.getTimeoutMs()};
    m.row_sparse = r.getRowSparse();
    auto ids = r.getRowIds();
    if (!m.row_sparse && ids.size() != 0)
      fail(decode_error::code::invalid_value, "pull request row ids without rowSparse");
    if (ids.size() % 8 != 0)
      fail(decode_error::code::invalid_value, "pull request row ids of " +
                                                  std::to_string(ids.size()) +
                                                  " bytes, not a whole number of int64");
    m.row_ids =
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(ids.begin()), ids.size());
    m.reply_compression =
        read_reply_packing(r.getReplyCompression(), r.getReplyThreshold(), "pull request");
    if (m.row_sparse && m.reply_compression.type != compression_type::none)
      fail(decode_error::code::invalid_value,
           "pull request: a row-sparse pull asks for a packed reply");
    return m;
  }

  reply_packing read_reply_packing(ws::Compression type, float threshold, const char* what) {
    const auto raw = static_cast<std::uint16_t>(type);
    if (raw > static_cast<std::uint16_t>(compression_type::one_bit))
      fail(decode_error::code::invalid_enum, std::string{what} + " reply compression: value " +
                                                 std::to_string(raw) + " is not known");
    reply_packing packing{static_cast<compression_type>(raw), threshold};
    if (packing.type != compression_type::none)
      if (auto problem = threshold_problem(packing.type, threshold))
        fail(decode_error::code::invalid_value,
             std::string{what} + " reply compression " + std::string{to_string(packing.type)} +
                 " with threshold " + std::to_string(threshold) + " " + *problem);
    return packing;
  }

  message read(ws::PullReply::Reader r) {
    pull_reply m;
    m.request_id = r.getRequestId();
    m.key = r.getKey();
    m.round = r.getRound();
    m.durable = r.getDurable();
    // Packed only to a request that asked for it: the receiver checks that against its request.
    m.tensor = read_tensor(r.hasTensor(), r.getTensor(), "pull reply tensor", true);
    return m;
  }

  message read(ws::PushPull::Reader r) {
    pushpull m;
    m.request_id = r.getRequestId();
    m.key = r.getKey();
    m.sender_rank = r.getSenderRank();
    m.round = r.getRound();
    m.tensor = read_tensor(r.hasTensor(), r.getTensor(), "pushpull tensor", true);
    m.timeout_ms = r.getTimeoutMs();
    m.resent = r.getResent();
    m.reply_compression =
        read_reply_packing(r.getReplyCompression(), r.getReplyThreshold(), "pushpull");
    return m;
  }

  message read(ws::SyncSettings::Reader r) {
    sync_settings m;
    m.request_id = r.getRequestId();
    m.mode = from_wire<consistency_mode>(r.getMode(), consistency_count, "sync settings mode");
    m.quorum = r.getQuorum();
    if (m.quorum == 0)
      fail(decode_error::code::invalid_value, "sync settings quorum of 0 workers");
    m.rescale_quorum = r.getRescaleQuorum();
    m.max_staleness = r.getMaxStaleness();
    if (m.max_staleness < -1)
      fail(decode_error::code::invalid_value,
           "sync settings max staleness " + std::to_string(m.max_staleness) + " (-1 or >= 0)");
    m.max_rounds_ahead = r.getMaxRoundsAhead();
    if (m.max_rounds_ahead == 0)
      fail(decode_error::code::invalid_value, "sync settings max rounds ahead of 0");
    return m;
  }

  /// A member's barrier values: at most max_barrier_values.
  std::vector<double> barrier_values(capnp::List<double>::Reader values, const std::string& what) {
    if (values.size() > max_barrier_values)
      fail(decode_error::code::limit_exceeded, what + ": " + std::to_string(values.size()) +
                                                   " values, more than " +
                                                   std::to_string(max_barrier_values));
    std::vector<double> out;
    out.reserve(values.size());
    for (double v : values)
      out.push_back(v);
    return out;
  }

  message read(ws::Barrier::Reader r) {
    return barrier{r.getRequestId(),
                   r.getBarrierId(),
                   read_group(r.getGroup()),
                   r.getSenderNodeId(),
                   barrier_values(r.getValues(), "barrier values"),
                   r.getStart()};
  }

  message read(ws::BarrierRelease::Reader r) {
    barrier_release m{r.getRequestId(), r.getBarrierId(), read_group(r.getGroup()), {}};
    auto gathered = r.getGathered();
    check_list(gathered.size(), "barrier release gathered values");
    m.gathered.reserve(gathered.size());
    for (auto g : gathered)
      m.gathered.push_back(
          gathered_values{from_wire<role>(g.getRole(), role_count, "gathered values role"),
                          g.getRank(), barrier_values(g.getValues(), "gathered values")});
    return m;
  }

  message read(ws::SetOptimizer::Reader r) {
    set_optimizer m;
    m.request_id = r.getRequestId();
    m.name = required_text(r.hasName(), r.getName(), "optimizer name");
    auto params = r.getParams();
    check_list(params.size(), "optimizer params");
    m.params.reserve(params.size());
    for (auto p : params)
      m.params.push_back(
          {required_text(p.hasName(), p.getName(), "optimizer param name"), p.getValue()});
    return m;
  }

  message read(ws::SetGradientCompression::Reader r) {
    set_gradient_compression m;
    m.request_id = r.getRequestId();
    m.type = required_text(r.hasType(), r.getType(), "gradient compression type");
    m.threshold = r.getThreshold();
    return m;
  }

  message read(ws::Command::Reader r) {
    command m;
    m.request_id = r.getRequestId();
    m.dump_optimizer = r.getDumpOptimizer();
    m.rounds = r.getRounds();
    switch (r.which()) {
    case ws::Command::UNSET:
      fail(decode_error::code::missing_field, "command is unset");
    case ws::Command::STOP:
      m.kind = command_kind::stop;
      return m;
    case ws::Command::SAVE_CHECKPOINT:
      m.kind = command_kind::save_checkpoint;
      m.path = required_text(r.hasSaveCheckpoint(), r.getSaveCheckpoint(), "checkpoint path");
      return m;
    case ws::Command::LOAD_CHECKPOINT:
      m.kind = command_kind::load_checkpoint;
      m.path = required_text(r.hasLoadCheckpoint(), r.getLoadCheckpoint(), "checkpoint path");
      return m;
    case ws::Command::SYNC_MODE:
      m.kind = command_kind::sync_mode;
      return m;
    case ws::Command::ASYNC_MODE:
      m.kind = command_kind::async_mode;
      return m;
    }
    fail(decode_error::code::unknown_message,
         "command " + std::to_string(static_cast<unsigned>(r.which())) + " is not known");
  }

  message read(ws::LinkHello::Reader r) {
    link_hello m{required_text(r.hasHostId(), r.getHostId(), "link hello host id"),
                 r.getArenaBytes(),
                 r.getWindowBytes(),
                 {},
                 std::nullopt};
    m.nonce = digest(r.hasNonce(), r.getNonce(), "link hello nonce");
    // Each field is read once: the traversal limit is bounded by the frame's own size.
    if (r.hasProof())
      if (auto proof = r.getProof(); proof.size() != 0)
        m.proof = digest(true, proof, "link hello proof");
    m.key_share = optional_digest(r.hasKeyShare(), r.getKeyShare(), "link hello key share");
    if (r.getNodeRole() != ws::Role::UNSPECIFIED)
      m.identity = node_identity{
          from_wire<role>(r.getNodeRole(), role_count, "link hello node role"), r.getNodeRank()};
    else if (r.getNodeRank() != 0)
      fail(decode_error::code::invalid_value,
           "link hello node rank " + std::to_string(r.getNodeRank()) + " without a node role");
    m.node_proof = optional_digest(r.hasNodeProof(), r.getNodeProof(), "link hello node proof");
    if (m.node_proof && !m.identity)
      fail(decode_error::code::invalid_value, "link hello node proof without a node role");
    return m;
  }

  /// An optional 32-byte field: absent or empty means none.
  std::optional<link_digest> optional_digest(bool present, capnp::Data::Reader data,
                                             const char* field) {
    if (!present || data.size() == 0)
      return std::nullopt;
    return digest(true, data, field);
  }

  link_digest digest(bool present, capnp::Data::Reader data, const char* field) {
    link_digest out{};
    if (!present)
      fail(decode_error::code::missing_field, std::string(field) + " is missing");
    if (data.size() != out.size())
      fail(decode_error::code::invalid_value,
           std::string(field) + " of " + std::to_string(data.size()) + " bytes (expected " +
               std::to_string(out.size()) + ")");
    std::copy(data.begin(), data.end(), out.begin());
    return out;
  }

  message read(ws::ArenaOffer::Reader r) {
    arena_offer m{required_text(r.hasName(), r.getName(), "arena offer name"), r.getBytes()};
    if (m.bytes == 0)
      fail(decode_error::code::invalid_value, "arena offer of 0 bytes");
    return m;
  }

  message read(ws::Heartbeat::Reader r) {
    return heartbeat{r.getSenderNodeId(), r.getSequence(), r.getTimestampNs()};
  }

  message read(ws::Error::Reader r) {
    error_reply m;
    m.request_id = r.getRequestId();
    switch (r.which()) {
    case ws::Error::NO_KEY:
      break;
    case ws::Error::KEY:
      m.key = r.getKey();
      break;
    default:
      fail(decode_error::code::unknown_message,
           "error key union " + std::to_string(static_cast<unsigned>(r.which())) + " is not known");
    }
    m.code = from_wire<error_code>(r.getCode(), error_code_count, "error code");
    m.message = bounded_text(r.getMessage(), "error message");
    return m;
  }

  const decode_limits& limits_;
  std::span<const std::byte> arena_;
};

// The standard serialization's segment table, checked against the body size before Cap'n
// Proto allocates its segment array from it.
void check_segment_table(std::span<const std::byte> body, const decode_limits& limits) {
  const std::uint64_t count = std::uint64_t{load_le32(body.data())} + 1;
  if (count > limits.max_segments)
    fail(decode_error::code::malformed_frame, "segment table announces " + std::to_string(count) +
                                                  " segments, limit " +
                                                  std::to_string(limits.max_segments));
  const std::uint64_t table_bytes = ((count + 2) / 2) * 8;
  if (table_bytes > body.size())
    fail(decode_error::code::truncated, "segment table of " + std::to_string(table_bytes) +
                                            " bytes in a body of " + std::to_string(body.size()));
  std::uint64_t words = 0;
  for (std::uint64_t i = 0; i < count; ++i)
    words += load_le32(body.data() + 4 + 4 * i);
  const std::uint64_t announced = table_bytes + words * 8;
  if (announced > body.size())
    fail(decode_error::code::truncated, "segments announce " + std::to_string(announced) +
                                            " bytes, the body has " + std::to_string(body.size()));
  if (announced < body.size())
    fail(decode_error::code::malformed_frame,
         std::to_string(body.size() - announced) + " bytes follow the last segment");
}

result<decoded_message> decode_checked(std::span<const std::byte> body, const decode_limits& limits,
                                       std::span<const std::byte> arena) {
  if (body.size() > limits.max_frame_bytes)
    fail(decode_error::code::frame_too_large, "frame body of " + std::to_string(body.size()) +
                                                  " bytes, limit " +
                                                  std::to_string(limits.max_frame_bytes));
  if (body.size() < 8 || body.size() % 8 != 0)
    fail(decode_error::code::malformed_frame,
         "frame body of " + std::to_string(body.size()) + " bytes is not a positive multiple of 8");
  check_segment_table(body, limits);

  const std::size_t words = body.size() / sizeof(capnp::word);
  std::shared_ptr<const std::uint64_t[]> copy;
  const void* at = body.data();
  if (reinterpret_cast<std::uintptr_t>(at) % alignof(capnp::word) != 0) {
    // Cap'n Proto reads words in place; the size was capped above, so this copy is bounded.
    std::shared_ptr<std::uint64_t[]> aligned(new std::uint64_t[words]);
    std::memcpy(aligned.get(), body.data(), body.size());
    at = aligned.get();
    copy = std::move(aligned);
  }

  capnp::ReaderOptions options;
  // Twice the frame and a little: Cap'n Proto charges a few words more than a segment holds when
  // pointers cross segments (a batch of 40 small values in two segments, 610 words of segments,
  // needed 613-616), and a tight limit refused such frames.
  options.traversalLimitInWords = 2 * words + 64;
  options.nestingLimit = nesting_limit;
  capnp::FlatArrayMessageReader frame(kj::arrayPtr(static_cast<const capnp::word*>(at), words),
                                      options);
  reader r(limits, arena);
  return decoded_message(r.read(frame.getRoot<ws::Message>()), std::move(copy));
}

} // namespace

result<std::size_t> read_frame_prefix(std::span<const std::byte> prefix,
                                      const decode_limits& limits) {
  if (prefix.size() < frame_prefix_bytes)
    return decode_error{decode_error::code::truncated,
                        "frame prefix of " + std::to_string(prefix.size()) + " bytes, need 8"};
  const std::uint64_t length = load_le64(prefix.data());
  if (length > limits.max_frame_bytes)
    return decode_error{decode_error::code::frame_too_large,
                        "frame announces a body of " + std::to_string(length) + " bytes, limit " +
                            std::to_string(limits.max_frame_bytes)};
  // The smallest body is one table word and a root pointer.
  if (length < 16 || length % 8 != 0)
    return decode_error{decode_error::code::malformed_frame,
                        "frame announces a body of " + std::to_string(length) +
                            " bytes, not a multiple of 8 of at least 16"};
  return static_cast<std::size_t>(length);
}

result<decoded_message> decode_body(std::span<const std::byte> body, const decode_limits& limits,
                                    std::span<const std::byte> arena) {
  try {
    return decode_checked(body, limits, arena);
  } catch (rejection& r) {
    return std::move(r.error);
  } catch (const kj::Exception& e) {
    return decode_error{decode_error::code::malformed_message,
                        std::string("Cap'n Proto: ") + e.getDescription().cStr()};
  } catch (const std::exception& e) {
    return decode_error{decode_error::code::malformed_message, e.what()};
  }
}

result<decoded_message> decode(std::span<const std::byte> frame, const decode_limits& limits,
                               std::span<const std::byte> arena) {
  auto length = read_frame_prefix(frame, limits);
  if (!length)
    return length.error();
  const std::size_t available = frame.size() - frame_prefix_bytes;
  if (available < *length)
    return decode_error{decode_error::code::truncated,
                        "frame announces " + std::to_string(*length) + " body bytes, has " +
                            std::to_string(available)};
  if (available > *length)
    return decode_error{decode_error::code::malformed_frame,
                        std::to_string(available - *length) + " bytes follow the announced body"};
  return decode_body(frame.subspan(frame_prefix_bytes), limits, arena);
}

} // namespace troupe::wire

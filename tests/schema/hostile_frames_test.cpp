// Bytes from a peer are untrusted: every frame below is truncated, random, mutated, lies about
// its sizes, or is well formed but inconsistent. Each must come back as a typed decode_error,
// without a crash (run under AddressSanitizer too) and without an allocation sized by a length
// field (checked with allocation_probe).

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "schema/codec.hpp"
#include "tests/allocation_probe.hpp"
#include "tests/schema/sample_messages.hpp"

using namespace troupe::wire;
using troupe::test::allocation_probe;
using troupe::test::pattern_buffer;
using code = decode_error::code;

namespace {

// Frame offset of the Message union's discriminant in a single-segment frame from our encoder:
// prefix (8), segment table (8), root pointer (8), then the root struct's first data word.
constexpr std::size_t discriminant_offset = 24;

// Decodes a copy of `bytes` held in an allocation of exactly that size (a read past the end is
// then a heap overflow AddressSanitizer reports) and returns the error, or nullopt if it decoded.
std::optional<decode_error> rejection(std::span<const std::byte> bytes,
                                      const decode_limits& limits = {}) {
  std::vector<std::byte> copy(bytes.begin(), bytes.end());
  auto r = decode(copy, limits);
  if (r)
    return std::nullopt;
  return r.error();
}

bool decodes(std::span<const std::byte> bytes, const decode_limits& limits = {}) {
  return !rejection(bytes, limits).has_value();
}

code kind_of(const std::optional<decode_error>& e) {
  BOOST_TEST_REQUIRE(e.has_value());
  return e->kind;
}

code kind_of(const result<decoded_message>& r) {
  BOOST_TEST_REQUIRE(!r.has_value());
  return r.error().kind;
}

std::vector<std::byte> frame_of(const message& msg) {
  return encode(msg).flatten();
}

void put_u16(std::vector<std::byte>& frame, std::size_t at, std::uint16_t v) {
  frame[at] = static_cast<std::byte>(v & 0xff);
  frame[at + 1] = static_cast<std::byte>(v >> 8);
}

std::uint16_t get_u16(const std::vector<std::byte>& frame, std::size_t at) {
  return static_cast<std::uint16_t>(static_cast<unsigned>(frame[at]) |
                                    static_cast<unsigned>(frame[at + 1]) << 8);
}

// Hand-written Cap'n Proto: one segment of words, serialized with its table (no prefix).
struct raw_segment {
  std::vector<std::uint64_t> words;

  static std::uint64_t struct_pointer(std::int32_t offset, std::uint16_t data_words,
                                      std::uint16_t pointers) {
    return static_cast<std::uint32_t>(offset) << 2 | std::uint64_t{data_words} << 32 |
           std::uint64_t{pointers} << 48;
  }
  // element_size: 2 = byte, 7 = inline composite (count is then the word count).
  static std::uint64_t list_pointer(std::int32_t offset, unsigned element_size,
                                    std::uint32_t count) {
    return (static_cast<std::uint32_t>(offset) << 2 | 1u) | std::uint64_t{count << 3 | element_size}
                                                                << 32;
  }
  static std::uint64_t composite_tag(std::uint32_t elements, std::uint16_t data_words,
                                     std::uint16_t pointers) {
    return std::uint64_t{elements << 2} | std::uint64_t{data_words} << 32 |
           std::uint64_t{pointers} << 48;
  }
  // Offset from the pointer at `from` to the object at `to`.
  static std::int32_t offset(std::size_t from, std::size_t to) {
    return static_cast<std::int32_t>(to) - static_cast<std::int32_t>(from) - 1;
  }

  // Segment table (one segment) followed by the words, 8-byte aligned.
  std::vector<std::uint64_t> body() const {
    std::vector<std::uint64_t> out;
    out.push_back(std::uint64_t{words.size()} << 32); // segment count - 1 = 0, then the size
    out.insert(out.end(), words.begin(), words.end());
    return out;
  }
};

std::span<const std::byte> as_bytes(const std::vector<std::uint64_t>& words) {
  return std::as_bytes(std::span(words));
}

// set_optimizer "o" whose `params` elements all name the same text of `text_words` words: each
// name is read again, so the bytes read grow with `params` while the frame does not.
std::vector<std::uint64_t> optimizer_sharing_one_name(std::uint32_t params,
                                                      std::uint32_t text_words) {
  raw_segment s;
  auto& w = s.words;
  w.resize(7 + 2 * params + 1 + text_words);
  w[0] = raw_segment::struct_pointer(0, 1, 1); // root -> Message at 1
  w[1] = 12;                                   // Message.which = setOptimizer
  w[2] = raw_segment::struct_pointer(0, 1, 2); // -> SetOptimizer at 3
  w[3] = 77;                                   // requestId
  const std::size_t own_name = 7 + 2 * params;
  const std::size_t shared = own_name + 1;
  w[4] = raw_segment::list_pointer(raw_segment::offset(4, own_name), 2, 2); // name "o"
  w[5] = raw_segment::list_pointer(raw_segment::offset(5, 6), 7, 2 * params);
  w[6] = raw_segment::composite_tag(params, 1, 1);
  for (std::uint32_t i = 0; i < params; ++i) {
    const std::size_t element = 7 + 2 * i;
    double value = i;
    std::memcpy(&w[element], &value, 8);
    w[element + 1] =
        raw_segment::list_pointer(raw_segment::offset(element + 1, shared), 2, text_words * 8);
  }
  w[own_name] = 'o';
  for (std::uint32_t i = 0; i < text_words; ++i)
    w[shared + i] = 0x6161616161616161ull;             // "aaaaaaaa"
  w[shared + text_words - 1] &= 0x00ffffffffffffffull; // NUL terminator in the last byte
  return s.body();
}

/// A tensor a decoder must refuse, and how.
struct bad_tensor {
  const char* what;
  tensor_chunk tensor;
  code expected;
};

message in_push(const tensor_chunk& t) {
  return push{1, 2, 3, 4, t};
}
message in_init(const tensor_chunk& t) {
  return init{1, 2, t};
}
message in_pull_reply(const tensor_chunk& t) {
  return pull_reply{1, 2, 3, t};
}
message in_pushpull(const tensor_chunk& t) {
  return pushpull{1, 2, 3, 4, t};
}

/// Every case's tensor, carried by each message `carriers` make of it, is refused with the
/// case's code.
template <class... Carrier>
void expect_refused(const std::vector<bad_tensor>& cases, Carrier... carriers) {
  for (const auto& c : cases)
    for (const message& msg : {carriers(c.tensor)...}) {
      auto r = rejection(frame_of(msg));
      BOOST_TEST((kind_of(r) == c.expected), kind_name(msg)
                                                 << ", " << c.what << ": " << r->message);
    }
}

} // namespace

BOOST_AUTO_TEST_SUITE(hostile_frames)

BOOST_AUTO_TEST_CASE(every_truncation_of_a_frame_is_rejected) {
  pattern_buffer payload(64);
  std::size_t rejected = 0;
  for (const auto& msg : troupe::test::sample_messages(payload.bytes())) {
    const auto frame = frame_of(msg);
    BOOST_TEST_REQUIRE(decodes(frame), kind_name(msg));
    for (std::size_t length = 0; length < frame.size(); ++length) {
      auto r = rejection(std::span(frame).first(length));
      const code kind = kind_of(r);
      BOOST_TEST((kind == code::truncated || kind == code::malformed_frame),
                 kind_name(msg) << " cut at " << length << ": " << r->message);
      ++rejected;
    }
    // The body alone, cut at every length, fails the segment table or Cap'n Proto's checks.
    const auto body = std::span(frame).subspan(frame_prefix_bytes);
    for (std::size_t length = 0; length < body.size(); ++length) {
      std::vector<std::byte> copy(body.begin(), body.begin() + static_cast<long>(length));
      BOOST_TEST(!decode_body(copy).has_value(), kind_name(msg) << " body cut at " << length);
    }
  }
  BOOST_TEST_MESSAGE(rejected << " truncated frames rejected");
}

BOOST_AUTO_TEST_CASE(random_bytes_are_rejected_without_crash_or_large_allocation) {
  std::mt19937_64 rng(20261129);
  constexpr int buffers = 4000;
  int accepted = 0;
  std::size_t largest = 0;
  for (int i = 0; i < buffers; ++i) {
    const std::size_t words = 1 + rng() % 96;
    std::vector<std::uint64_t> body(words);
    for (auto& w : body)
      w = rng();
    // Half the buffers get a segment table that matches their size, so Cap'n Proto itself
    // parses random pointers instead of the table check refusing them early.
    if (i % 2 == 0 && words > 1)
      body[0] = std::uint64_t{words - 1} << 32;
    allocation_probe probe;
    auto r = decode_body(as_bytes(body));
    largest = std::max(largest, probe.largest());
    if (r)
      ++accepted;
    else
      BOOST_TEST(!r.error().message.empty());
  }
  BOOST_TEST_MESSAGE(buffers - accepted << " of " << buffers << " random buffers rejected");
  BOOST_TEST(accepted <= buffers / 100);
  BOOST_TEST(largest <= std::size_t{64} << 10);
}

BOOST_AUTO_TEST_CASE(mutated_frames_are_rejected_or_decode_to_consistent_messages) {
  pattern_buffer payload(64);
  std::mt19937_64 rng(42);
  const auto samples = troupe::test::sample_messages(payload.bytes());
  int accepted = 0;
  int total = 0;
  std::size_t largest = 0;
  for (const auto& msg : samples) {
    const auto original = frame_of(msg);
    for (int round = 0; round < 400; ++round) {
      auto frame = original;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) {
        // Leave the prefix alone most of the time so mutations reach the message.
        const std::size_t at = frame_prefix_bytes + rng() % (frame.size() - frame_prefix_bytes);
        frame[at] = static_cast<std::byte>(rng());
      }
      allocation_probe probe;
      auto r = decode(frame);
      largest = std::max(largest, probe.largest());
      ++total;
      if (!r)
        continue;
      ++accepted;
      // Whatever was accepted obeys the codec's promises.
      if (const tensor_chunk* t = tensor_of(r->msg)) {
        BOOST_TEST(!validate_tensor(*t).has_value());
        BOOST_TEST(
            (t->data.empty() || (t->data.data() >= frame.data() &&
                                 t->data.data() + t->data.size() <= frame.data() + frame.size())));
      }
      if (const auto* m = std::get_if<membership>(&r->msg))
        for (std::size_t k = 1; k < m->key_ranges.size(); ++k)
          BOOST_TEST(m->key_ranges[k - 1].end <= m->key_ranges[k].begin);
    }
  }
  BOOST_TEST_MESSAGE(total - accepted << " of " << total << " mutated frames rejected, " << accepted
                                      << " still valid");
  BOOST_TEST(largest <= std::size_t{64} << 10);
}

BOOST_AUTO_TEST_CASE(segment_tables_that_lie_are_rejected_before_allocation) {
  struct lie {
    const char* what;
    std::vector<std::uint32_t> table; // segment count - 1, then sizes, as 32-bit words
    std::size_t body_words;           // total body words (table included)
    code expected;
  };
  const std::vector<lie> lies = {
      {"2^32 segments", {0xffffffffu, 1}, 4, code::malformed_frame},
      {"1000 segments in 4 words", {999, 1}, 4, code::malformed_frame},
      {"63 segments, table longer than the body", {62, 1}, 4, code::truncated},
      {"one segment of 2^32-1 words", {0, 0xffffffffu}, 4, code::truncated},
      {"two segments of 2^31 words", {1, 0x80000000u, 0x80000000u, 0}, 4, code::truncated},
      {"segments shorter than the body", {0, 1}, 4, code::malformed_frame},
      {"a first segment of zero words", {0, 0}, 1, code::malformed_message},
  };
  for (const auto& l : lies) {
    std::vector<std::uint64_t> body(l.body_words, 0);
    std::memcpy(body.data(), l.table.data(), std::min(l.table.size() * 4, body.size() * 8));
    allocation_probe probe;
    auto r = decode_body(as_bytes(body));
    BOOST_TEST((kind_of(r) == l.expected), l.what << ": " << r.error().message);
    BOOST_TEST(probe.largest() < 4096u, l.what);
  }
}

BOOST_AUTO_TEST_CASE(a_prefix_announcing_a_huge_body_is_rejected_before_allocation) {
  for (std::uint64_t announced : {~std::uint64_t{0}, std::uint64_t{1} << 63, std::uint64_t{1} << 40,
                                  (std::uint64_t{256} << 20) + 8}) {
    std::vector<std::byte> prefix(8);
    for (int i = 0; i < 8; ++i)
      prefix[i] = static_cast<std::byte>(announced >> (8 * i));
    allocation_probe probe;
    auto r = read_frame_prefix(prefix);
    BOOST_TEST_REQUIRE(!r.has_value());
    BOOST_TEST((r.error().kind == code::frame_too_large));
    auto whole = decode(prefix);
    BOOST_TEST_REQUIRE(!whole.has_value());
    BOOST_TEST((whole.error().kind == code::frame_too_large));
    BOOST_TEST(probe.largest() < 4096u);
  }
  for (std::uint64_t announced : {0u, 8u, 12u, 17u}) {
    std::vector<std::byte> prefix(8);
    prefix[0] = static_cast<std::byte>(announced);
    auto r = read_frame_prefix(prefix);
    BOOST_TEST_REQUIRE(!r.has_value());
    BOOST_TEST((r.error().kind == code::malformed_frame), announced);
  }
  BOOST_TEST((read_frame_prefix(std::vector<std::byte>(7)).error().kind == code::truncated));
}

BOOST_AUTO_TEST_CASE(frames_over_the_configured_cap_are_rejected_without_a_copy) {
  pattern_buffer payload(16 << 10);
  auto frame = frame_of(push{1, 2, 3, 4, troupe::test::float_tensor(payload.bytes(), 64, 64)});
  decode_limits small;
  small.max_frame_bytes = 4096;
  // The same frame at an odd address, which decode would otherwise copy to align it.
  std::vector<std::byte> shifted(frame.size() + 1);
  std::memcpy(shifted.data() + 1, frame.data(), frame.size());
  allocation_probe probe;
  BOOST_TEST((kind_of(decode(frame, small)) == code::frame_too_large));
  BOOST_TEST((kind_of(decode_body(std::span(frame).subspan(8), small)) == code::frame_too_large));
  // Misaligned and over the cap: refused before the aligned copy is made.
  BOOST_TEST((kind_of(decode_body(std::span(shifted).subspan(9), small)) == code::frame_too_large));
  BOOST_TEST(probe.largest() < 4096u);
  // At the cap it decodes.
  small.max_frame_bytes = frame.size() - 8;
  BOOST_TEST(decode(frame, small).has_value());
}

BOOST_AUTO_TEST_CASE(a_frame_with_bytes_after_its_last_segment_is_rejected) {
  auto frame = frame_of(ack{1});
  frame.resize(frame.size() + 8);
  BOOST_TEST((kind_of(decode(frame)) == code::malformed_frame));
  // Announcing the longer body does not help: the segment table disagrees.
  const std::uint64_t body = frame.size() - 8;
  for (int i = 0; i < 8; ++i)
    frame[i] = static_cast<std::byte>(body >> (8 * i));
  BOOST_TEST((kind_of(decode(frame)) == code::malformed_frame));
}

BOOST_AUTO_TEST_CASE(a_tensor_whose_shape_disagrees_with_its_payload_is_rejected) {
  pattern_buffer payload(64);
  const auto bytes = payload.bytes();
  const std::vector<bad_tensor> cases = {
      {"total bytes not shape times dtype",
       {dtype::float32, {4, 4}, 60, 0, bytes.first(60)},
       code::invalid_tensor},
      {"payload longer than the tensor",
       {dtype::float32, {2, 2}, 16, 0, bytes.first(32)},
       code::invalid_tensor},
      {"chunk past the end",
       {dtype::float32, {4, 4}, 64, 48, bytes.first(32)},
       code::invalid_tensor},
      {"offset beyond the tensor",
       {dtype::float32, {4, 4}, 64, 1024, bytes.first(4)},
       code::invalid_tensor},
      {"offset splits an element",
       {dtype::float64, {8}, 64, 4, bytes.first(8)},
       code::invalid_tensor},
      {"size splits an element", {dtype::int64, {8}, 64, 0, bytes.first(12)}, code::invalid_tensor},
      {"negative extent", {dtype::float32, {-4, -4}, 64, 0, bytes}, code::invalid_tensor},
      {"extents overflow 64 bits",
       {dtype::float32, {std::int64_t{1} << 40, std::int64_t{1} << 40}, 64, 0, bytes},
       code::invalid_tensor},
      {"bytes overflow 64 bits",
       {dtype::float64, {std::int64_t{1} << 62}, 64, 0, bytes},
       code::invalid_tensor},
      {"empty chunk of a non-empty tensor", {dtype::float32, {4}, 16, 0, {}}, code::invalid_tensor},
      {"33 axes",
       {dtype::float32, tensor_shape(33, 1), 4, 0, bytes.first(4)},
       code::limit_exceeded},
      {"64 TiB tensor",
       {dtype::int64, {std::int64_t{1} << 43}, std::uint64_t{1} << 46, 0, bytes},
       code::limit_exceeded},
  };
  expect_refused(cases, in_push, in_init, in_pull_reply, in_pushpull);
}

BOOST_AUTO_TEST_CASE(a_packed_tensor_that_does_not_fit_its_declaration_is_rejected) {
  pattern_buffer payload(64);
  const auto bytes = payload.bytes();
  auto packed = [&](dtype type, std::uint64_t total, std::uint64_t offset, std::size_t size,
                    compression_type how, float threshold, std::uint64_t elements) {
    return tensor_chunk{type,
                        {static_cast<std::int64_t>(total / size_of(type))},
                        total,
                        offset,
                        bytes.first(size),
                        std::nullopt,
                        tensor_compression{how, threshold, elements}};
  };
  using ct = compression_type;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<bad_tensor> cases = {
      {"packed length short of the elements",
       packed(dtype::float32, 400, 0, 4, ct::two_bit, 0.5f, 17), code::invalid_tensor},
      {"packed length beyond the elements",
       packed(dtype::float32, 400, 0, 12, ct::two_bit, 0.5f, 17), code::invalid_tensor},
      {"elements past the end", packed(dtype::float32, 64, 32, 4, ct::one_bit, 0.5f, 9),
       code::invalid_tensor},
      {"elements overflowing 64 bits in bytes",
       packed(dtype::float32, 64, 0, 4, ct::two_bit, 0.5f, std::uint64_t{1} << 62),
       code::invalid_tensor},
      {"offset beyond the tensor", packed(dtype::float32, 64, 128, 4, ct::two_bit, 0.5f, 1),
       code::invalid_tensor},
      {"offset splitting an element", packed(dtype::float32, 64, 2, 4, ct::two_bit, 0.5f, 1),
       code::invalid_tensor},
      {"no elements of a non-empty tensor", packed(dtype::float32, 64, 0, 0, ct::two_bit, 0.5f, 0),
       code::invalid_tensor},
      {"a float64 tensor", packed(dtype::float64, 64, 0, 4, ct::two_bit, 0.5f, 8),
       code::invalid_tensor},
      {"an int32 tensor", packed(dtype::int32, 64, 0, 4, ct::one_bit, 0.5f, 16),
       code::invalid_tensor},
      {"a 2bit threshold of 0", packed(dtype::float32, 64, 0, 4, ct::two_bit, 0.0f, 16),
       code::invalid_value},
      {"a negative threshold", packed(dtype::float32, 64, 0, 4, ct::one_bit, -0.5f, 16),
       code::invalid_value},
      {"a threshold that is not a number", packed(dtype::float32, 64, 0, 4, ct::two_bit, nan, 16),
       code::invalid_value},
      {"a compression type outside the enumeration",
       packed(dtype::float32, 64, 0, 4, static_cast<ct>(3), 0.5f, 16), code::invalid_enum},
  };
  expect_refused(cases, in_push, in_pushpull, in_pull_reply);
  // A valid packed tensor in an init (a value, never packed); in a push and in a pull reply (a
  // compressed pull's: the worker checks that it asked for one) it decodes.
  const auto fine = packed(dtype::float32, 64, 0, 4, ct::two_bit, 0.5f, 16);
  BOOST_TEST(decodes(frame_of(push{1, 2, 3, 4, fine})));
  BOOST_TEST(decodes(frame_of(pull_reply{1, 2, 3, fine})));
  auto r = rejection(frame_of(init{1, 2, fine}));
  BOOST_TEST((kind_of(r) == code::invalid_tensor), r->message);
}

BOOST_AUTO_TEST_CASE(an_offer_of_a_packed_reply_with_a_rule_that_is_not_one_is_rejected) {
  using ct = compression_type;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::pair<reply_packing, code>> offers = {
      {{static_cast<ct>(3), 0.5f}, code::invalid_enum},
      {{ct::two_bit, 0.0f}, code::invalid_value},
      {{ct::one_bit, -0.5f}, code::invalid_value},
      {{ct::two_bit, nan}, code::invalid_value},
  };
  pattern_buffer payload(16);
  const tensor_chunk t{dtype::float32, {4}, 16, 0, payload.bytes()};
  for (const auto& [offer, expected] : offers) {
    pull_request pull{1, 2, 3, 4, 0};
    pull.reply_compression = offer;
    pushpull both{5, 6, 7, 8, t};
    both.reply_compression = offer;
    for (const message& msg : {message{pull}, message{both}}) {
      auto r = rejection(frame_of(msg));
      BOOST_TEST((kind_of(r) == expected), kind_name(msg) << ": " << r->message);
    }
  }
  // Rows are never packed: a row-sparse pull that offers it is refused.
  std::vector<std::int64_t> ids{1, 3};
  pull_request rows{1, 2, 3, 4, 0};
  rows.row_sparse = true;
  rows.row_ids = std::as_bytes(std::span{ids});
  rows.reply_compression = {ct::one_bit, 0.0f};
  BOOST_TEST((kind_of(rejection(frame_of(rows))) == code::invalid_value));
  rows.reply_compression = {};
  BOOST_TEST(decodes(frame_of(rows)));
}

BOOST_AUTO_TEST_CASE(a_row_sparse_tensor_that_does_not_fit_its_rows_is_rejected) {
  pattern_buffer payload(64);
  const auto bytes = payload.bytes();
  std::vector<std::int64_t> ids{1, 3};
  const auto two_ids = std::as_bytes(std::span{ids});
  // Two rows of 4 float32 of a (?, 4) key, with their two ids.
  auto rows = [&](std::span<const std::byte> row_ids, std::uint64_t offset = 0,
                  std::size_t size = 32) {
    tensor_chunk t{dtype::float32, {2, 4}, 32, offset, bytes.first(size)};
    t.row_sparse = true;
    t.row_ids = row_ids;
    return t;
  };
  auto packed = rows(two_ids, 0, 4);
  packed.compression = {compression_type::two_bit, 0.5f, 8};
  auto scalar = rows({}, 0, 4);
  scalar.shape = {};
  scalar.total_bytes = 4;
  auto ids_without_flag = rows(two_ids);
  ids_without_flag.row_sparse = false;
  const std::vector<bad_tensor> cases = {
      {"one id for two rows", rows(two_ids.first(8)), code::invalid_tensor},
      {"ids of 12 bytes", rows(two_ids.first(12)), code::invalid_tensor},
      {"a chunk of the rows", rows(two_ids, 16, 16), code::invalid_tensor},
      {"packed rows", packed, code::invalid_tensor},
      {"rows of a scalar", scalar, code::invalid_tensor},
      {"row ids without rowSparse", ids_without_flag, code::invalid_tensor},
  };
  expect_refused(cases, in_push);
  // Whole rows with their ids are a push's, and nothing else's.
  BOOST_TEST(decodes(frame_of(push{1, 2, 3, 4, rows(two_ids)})));
  const std::vector<bad_tensor> elsewhere = {
      {"rows outside a push", rows(two_ids), code::invalid_tensor}};
  expect_refused(elsewhere, in_init, in_pull_reply, in_pushpull);
  // A row-sparse init must have rows; a pull's ids come whole and with the flag.
  init scalar_init{1, 2, tensor_chunk{dtype::float32, {}, 4, 0, bytes.first(4)}, true};
  BOOST_TEST((kind_of(rejection(frame_of(scalar_init))) == code::invalid_tensor));
  pull_request ragged{1, 2, 3, 4, 0};
  ragged.row_sparse = true;
  ragged.row_ids = two_ids.first(12);
  BOOST_TEST((kind_of(rejection(frame_of(ragged))) == code::invalid_value));
  pull_request unflagged{1, 2, 3, 4, 0};
  unflagged.row_ids = two_ids;
  BOOST_TEST((kind_of(rejection(frame_of(unflagged))) == code::invalid_value));
  pull_request asked{1, 2, 3, 4, 0};
  asked.row_sparse = true;
  asked.row_ids = two_ids;
  BOOST_TEST(decodes(frame_of(asked)));
}

BOOST_AUTO_TEST_CASE(enum_values_outside_their_enumerations_are_rejected) {
  pattern_buffer payload(16);
  tensor_chunk t{static_cast<dtype>(17), {4}, 16, 0, payload.bytes()};
  const std::vector<message> cases = {
      push{1, 2, 3, 4, t},
      registration{1, 1, static_cast<role>(3), "job", "host", 1},
      registration{1, 1, static_cast<role>(255), "job", "host", 1},
      admission{1, rejected{static_cast<reject_reason>(7), ""}},
      membership{1, 1, 1, {node_info{1, static_cast<role>(7), 0, "h", 1, true}}, {}},
      error_reply{1, std::nullopt, static_cast<error_code>(15), ""},
      error_reply{1, 5, static_cast<error_code>(200), ""},
      sync_settings{1, static_cast<consistency_mode>(2), 1, false, -1, 2},
  };
  for (const auto& msg : cases) {
    auto r = rejection(frame_of(msg));
    BOOST_TEST((kind_of(r) == code::invalid_enum), kind_name(msg) << ": " << r->message);
  }
}

BOOST_AUTO_TEST_CASE(an_unknown_or_unset_message_kind_is_rejected) {
  auto frame = frame_of(heartbeat{1, 2, 3});
  BOOST_TEST_REQUIRE(get_u16(frame, discriminant_offset) == 15); // Message.heartbeat @15
  // 17-20, 22 and 23: the links' control frames; 21: sync settings; 24: a batch; 25 and 26: the
  // elastic servers' hand-over and range data.
  for (std::uint16_t kind : {0, 27, 999, 0xffff}) {
    auto patched = frame;
    put_u16(patched, discriminant_offset, kind);
    auto r = rejection(patched);
    BOOST_TEST((kind_of(r) == code::unknown_message), kind << ": " << r->message);
  }
  // A root struct of zeros is the unset message.
  const std::vector<std::uint64_t> zeros = {std::uint64_t{3} << 32,
                                            raw_segment::struct_pointer(0, 1, 1), 0, 0};
  BOOST_TEST((kind_of(decode_body(as_bytes(zeros))) == code::unknown_message));
}

BOOST_AUTO_TEST_CASE(a_message_read_as_a_larger_kind_reports_its_missing_fields) {
  // A pull request carries no tensor; relabelled as a push it lacks the required one. Reading a
  // struct as a bigger one is how an older sender's frame looks, and must stay safe.
  auto frame = frame_of(pull_request{1, 2, 3, 4});
  BOOST_TEST_REQUIRE(get_u16(frame, discriminant_offset) == 6); // Message.pullRequest @6
  for (std::uint16_t as : {4, 5, 7, 8}) {                       // init, push, pullReply, pushPull
    auto patched = frame;
    put_u16(patched, discriminant_offset, as);
    auto r = rejection(patched);
    BOOST_TEST((kind_of(r) == code::missing_field), as << ": " << r->message);
  }
  // An ack relabelled as a registration has no role, job or host.
  auto ack_frame = frame_of(ack{1});
  put_u16(ack_frame, discriminant_offset, 1);
  BOOST_TEST((kind_of(rejection(ack_frame)) == code::invalid_enum));
  // ... as a command or an admission, its union is unset.
  put_u16(ack_frame, discriminant_offset, 14);
  BOOST_TEST((kind_of(rejection(ack_frame)) == code::missing_field));
  put_u16(ack_frame, discriminant_offset, 2);
  BOOST_TEST((kind_of(rejection(ack_frame)) == code::missing_field));
}

BOOST_AUTO_TEST_CASE(required_fields_that_are_empty_are_rejected) {
  const std::vector<message> cases = {
      registration{1, 1, role::worker, "", "host", 1},
      registration{1, 1, role::worker, "job", "", 1},
      set_optimizer{1, "", {}},
      set_optimizer{1, "sgd", {{"", 1.0}}},
      set_gradient_compression{1, "", 0.5},
      command{1, command_kind::save_checkpoint, ""},
      command{1, command_kind::load_checkpoint, ""},
  };
  for (const auto& msg : cases) {
    auto r = rejection(frame_of(msg));
    BOOST_TEST((kind_of(r) == code::missing_field), kind_name(msg) << ": " << r->message);
  }
}

BOOST_AUTO_TEST_CASE(key_ranges_that_are_empty_unsorted_or_name_unknown_servers_are_rejected) {
  const std::vector<std::vector<key_range>> cases = {
      {{5, 5, 0, 0}},                  // empty
      {{6, 5, 0, 0}},                  // reversed
      {{0, 10, 0, 0}, {5, 20, 1, 0}},  // overlapping
      {{10, 20, 0, 0}, {0, 10, 1, 0}}, // unsorted
      {{0, 10, 2, 0}},                 // server rank 2 of 2
  };
  for (const auto& ranges : cases) {
    auto r = rejection(frame_of(membership{1, 1, 2, {}, ranges}));
    BOOST_TEST((kind_of(r) == code::invalid_value), r->message);
  }
}

BOOST_AUTO_TEST_CASE(a_barrier_group_outside_one_to_seven_is_rejected) {
  for (std::uint8_t g : {0, 8, 9, 255}) {
    BOOST_TEST((kind_of(rejection(frame_of(barrier{1, 2, g, 3, {}}))) == code::invalid_value));
    BOOST_TEST((kind_of(rejection(frame_of(barrier_release{1, 2, g, {}}))) == code::invalid_value));
  }
}

BOOST_AUTO_TEST_CASE(lists_and_texts_above_the_limits_are_rejected) {
  decode_limits small;
  small.max_list_elements = 2;
  small.max_text_bytes = 8;
  auto three_nodes = frame_of(membership{1, 3, 0, {{}, {}, {}}, {}});
  BOOST_TEST((kind_of(decode(three_nodes, small)) == code::limit_exceeded));
  auto three_params = frame_of(set_optimizer{1, "sgd", {{"a", 1}, {"b", 2}, {"c", 3}}});
  BOOST_TEST((kind_of(decode(three_params, small)) == code::limit_exceeded));
  auto long_host = frame_of(registration{1, 1, role::worker, "job", "a-long-host", 1});
  BOOST_TEST((kind_of(decode(long_host, small)) == code::limit_exceeded));
  auto long_message = frame_of(error_reply{1, std::nullopt, error_code::internal, "123456789"});
  BOOST_TEST((kind_of(decode(long_message, small)) == code::limit_exceeded));
  // Within the limits the same limits accept.
  BOOST_TEST(decode(frame_of(membership{1, 2, 0, {{}, {}}, {}}), small).has_value());
}

BOOST_AUTO_TEST_CASE(the_traversal_limit_is_the_frame_size_not_the_default) {
  // Hand-built frames: a set_optimizer whose parameter names all point at one shared text. One
  // parameter reads about as many words as the frame has; 16 read 16 times as many, which Cap'n
  // Proto's default 64 MiB limit would let through but the frame's own size does not.
  const auto one = optimizer_sharing_one_name(1, 32);
  auto accepted = decode_body(as_bytes(one));
  BOOST_TEST_REQUIRE(accepted.has_value(), (accepted ? "" : accepted.error().message));
  const auto& opt = std::get<set_optimizer>(accepted->msg);
  BOOST_TEST(opt.request_id == 77u);
  BOOST_TEST(opt.name == "o");
  BOOST_TEST_REQUIRE(opt.params.size() == 1u);
  BOOST_TEST(opt.params[0].name == std::string(255, 'a'));

  const auto many = optimizer_sharing_one_name(16, 32);
  allocation_probe probe;
  auto r = decode_body(as_bytes(many));
  BOOST_TEST((kind_of(r) == code::malformed_message), r.error().message);
  BOOST_TEST(probe.largest() < 4096u);
}

BOOST_AUTO_TEST_CASE(a_list_of_empty_structs_claiming_huge_length_is_rejected) {
  // set_optimizer.params: an inline-composite list of 2^28 zero-sized elements in zero words.
  // Unchecked, the decoder would reserve 2^28 parameters (gigabytes).
  raw_segment s;
  s.words = {raw_segment::struct_pointer(0, 1, 1),       12,
             raw_segment::struct_pointer(0, 1, 2),       77,
             raw_segment::list_pointer(2, 2, 2),         raw_segment::list_pointer(0, 7, 0),
             raw_segment::composite_tag(1u << 28, 0, 0), 'o'};
  decode_limits unlimited_lists;
  unlimited_lists.max_list_elements = std::size_t{1} << 30;
  allocation_probe probe;
  auto r = decode_body(as_bytes(s.body()), unlimited_lists);
  BOOST_TEST((kind_of(r) == code::malformed_message), r.error().message);
  BOOST_TEST(probe.largest() < 4096u);
}

BOOST_AUTO_TEST_CASE(a_batch_holds_only_whole_requests_or_answers_and_no_batch) {
  pattern_buffer payload(256);
  const auto tensor = troupe::test::float_tensor(payload.bytes(), 2, 32);
  // Empty.
  BOOST_TEST((kind_of(rejection(frame_of(batch{}))) == code::missing_field));
  // More elements than the receiver takes in a list.
  batch many;
  for (std::uint64_t i = 0; i < 10; ++i)
    many.messages.push_back(ack{i});
  decode_limits five;
  five.max_list_elements = 5;
  BOOST_TEST((kind_of(rejection(frame_of(many), five)) == code::limit_exceeded));
  BOOST_TEST(decodes(frame_of(many)));
  // A chunk of a tensor, not all of it.
  auto chunk = tensor;
  chunk.shape = {4, 32};
  chunk.total_bytes = 2 * tensor.data.size();
  chunk.offset = tensor.data.size();
  auto r = rejection(frame_of(batch{{push{1, 2, 0, 0, chunk}}}));
  BOOST_TEST((kind_of(r) == code::invalid_tensor), r->message);
  BOOST_TEST(r->message.find("not the whole tensor") != std::string::npos, r->message);
  // A reference into the arena: resolved against a mapped arena as a message alone is, bounds
  // checked, and refused on a connection without one.
  std::vector<std::uint64_t> arena_words(64);
  const auto arena = std::as_bytes(std::span(arena_words));
  auto shared = tensor;
  shared.shm = shm_ref{64, tensor.data.size()};
  auto in_arena = frame_of(batch{{ack{3}, pushpull{1, 2, 0, 0, shared}}});
  auto taken = decode(in_arena, {}, arena);
  BOOST_TEST_REQUIRE(taken.has_value());
  const auto& items = std::get<batch>(taken->msg).messages;
  BOOST_TEST_REQUIRE(items.size() == 2u);
  const auto& viewed = std::get<pushpull>(items[1]).tensor;
  BOOST_TEST(viewed.data.data() == arena.data() + 64);
  BOOST_TEST(viewed.data.size() == tensor.data.size());
  auto no_arena = decode(in_arena);
  BOOST_TEST((kind_of(no_arena) == code::invalid_tensor), no_arena.error().message);
  BOOST_TEST(no_arena.error().message.find("no arena") != std::string::npos,
             no_arena.error().message);
  shared.shm = shm_ref{arena.size() - 8, tensor.data.size()};
  auto outside = decode(frame_of(batch{{pushpull{1, 2, 0, 0, shared}}}), {}, arena);
  BOOST_TEST((kind_of(outside) == code::invalid_tensor), outside.error().message);
  // Another kind relabelled into a batch: an ack's struct read as a heartbeat.
  auto relabelled = frame_of(batch{{ack{1, 2}}});
  // After the root struct (its union tag, then the batch's list pointer) comes the list's tag
  // word; the element's union tag is the first 16 bits of its data word.
  const std::size_t element_tag = discriminant_offset + 24;
  BOOST_TEST_REQUIRE(get_u16(relabelled, element_tag) == 9); // Message.ack @9
  put_u16(relabelled, element_tag, 15);                      // Message.heartbeat @15
  r = rejection(relabelled);
  BOOST_TEST((kind_of(r) == code::invalid_value), r->message);
  BOOST_TEST(r->message == "a heartbeat in a batch", r->message);
  // A batch inside a batch.
  put_u16(relabelled, element_tag, 24);
  BOOST_TEST(!decodes(relabelled));
}

BOOST_AUTO_TEST_CASE(decode_errors_have_names_for_logs) {
  BOOST_TEST(to_string(code::frame_too_large) == "frame_too_large");
  BOOST_TEST(to_string(code::chunk_overlap) == "chunk_overlap");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(sync_settings_and_link_credit_out_of_range_are_rejected) {
  const std::vector<std::pair<message, const char*>> cases = {
      {sync_settings{1, consistency_mode::sync, 0, false, -1, 2}, "quorum of 0"},
      {sync_settings{1, consistency_mode::async, 2, false, -2, 2}, "max staleness -2"},
      {sync_settings{1, consistency_mode::sync, 2, false, -1, 0}, "max rounds ahead 0"},
      {link_credit{0}, "credit of 0 bytes"},
  };
  for (const auto& [msg, what] : cases) {
    auto r = rejection(frame_of(msg));
    BOOST_TEST((kind_of(r) == code::invalid_value), what << ": " << r->message);
  }
}

BOOST_AUTO_TEST_CASE(
    an_admission_without_its_sealed_secret_or_an_unclaimed_node_proof_is_rejected) {
  link_digest bytes{};
  bytes.fill(7);
  const std::vector<std::pair<message, const char*>> cases = {
      {admission{1, admitted{1, 9, {}, false, {}}}, "sealed secret"},
      {link_hello{"host", 0, 0, bytes, bytes, std::nullopt, std::nullopt, bytes}, "node proof"},
  };
  for (const auto& [msg, what] : cases) {
    auto r = rejection(frame_of(msg));
    BOOST_TEST_REQUIRE(r.has_value(), what);
    BOOST_TEST((r->kind == code::invalid_value), what << ": " << r->message);
    BOOST_TEST(r->message.find(what) != std::string::npos, r->message);
  }
}

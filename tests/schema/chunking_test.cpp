// Tensors split into chunk frames by chunker and put back together by reassembler, up to 1 GiB.

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "schema/chunking.hpp"
#include "schema/codec.hpp"
#include "tests/schema/sample_messages.hpp"

using namespace troupe::wire;
using troupe::test::pattern_buffer;

namespace {

bool bytes_equal(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

// A whole float32 vector of `bytes / 4` elements.
tensor_chunk float_vector(std::span<const std::byte> payload) {
  return tensor_chunk{
      dtype::float32, {static_cast<std::int64_t>(payload.size() / 4)}, payload.size(), 0, payload};
}

// A chunk survives its frame unchanged.
void round_trip_check(const tensor_chunk& chunk) {
  const auto frame = encode(push{1, 3, 0, 5, chunk}).flatten();
  auto decoded = decode(frame);
  BOOST_TEST_REQUIRE(decoded.has_value());
  BOOST_TEST((std::get<push>(decoded->msg).tensor == chunk));
}

// The tensor of a decoded chunk frame.
const tensor_chunk& tensor_in(const decoded_message& d) {
  const tensor_chunk* t = tensor_of(d.msg);
  BOOST_TEST_REQUIRE(t != nullptr);
  return *t;
}

} // namespace

BOOST_AUTO_TEST_SUITE(chunking)

BOOST_AUTO_TEST_CASE(a_one_gib_tensor_round_trips_in_chunks_byte_for_byte) {
  // 1 GiB of float32 in 64 MiB chunks: each chunk frame is above Cap'n Proto's default traversal
  // limit (64 MiB), so this also shows decode sizes the limit from the frame itself. The source
  // and destination are allocated once; one frame buffer is reused for every chunk.
  const auto start = std::chrono::steady_clock::now();
  constexpr std::size_t gib = std::size_t{1} << 30;
  constexpr std::size_t chunk = std::size_t{64} << 20;
  std::unique_ptr<std::uint64_t[]> source_words(new std::uint64_t[gib / 8]);
  std::unique_ptr<std::uint64_t[]> destination_words(new std::uint64_t[gib / 8]);
  for (std::size_t i = 0; i < gib / 8; ++i)
    source_words[i] = i * 0x9e3779b97f4a7c15ull;
  std::span<const std::byte> source(reinterpret_cast<const std::byte*>(source_words.get()), gib);
  std::span<std::byte> destination(reinterpret_cast<std::byte*>(destination_words.get()), gib);

  const push whole{1, 3, 0, 5, float_vector(source)};
  // One Data field cannot hold it: unchunked, encode refuses instead of overflowing.
  BOOST_CHECK_THROW(encode(whole), std::invalid_argument);

  chunker split(whole, chunk);
  BOOST_TEST_REQUIRE(split.chunk_count() == gib / chunk);
  reassembler together(destination, dtype::float32, {static_cast<std::int64_t>(gib / 4)});
  std::vector<std::byte> frame_buffer;
  for (std::size_t i = 0; i < split.chunk_count(); ++i) {
    auto frame = split.encode_chunk(i);
    // The chunk's payload is referenced from the source, not copied into the frame.
    BOOST_TEST(std::ranges::any_of(frame.pieces(), [&](std::span<const std::byte> piece) {
      return piece.data() == source.data() + i * chunk && piece.size() == chunk;
    }));
    frame_buffer.resize(frame.size());
    frame.flatten_into(frame_buffer);
    auto decoded = decode(frame_buffer);
    BOOST_TEST_REQUIRE(decoded.has_value(), (decoded ? "" : decoded.error().message));
    const auto& got = std::get<push>(decoded->msg);
    BOOST_TEST(got.request_id == 1u);
    BOOST_TEST(got.key == 3u);
    BOOST_TEST(got.round == 5u);
    BOOST_TEST(got.tensor.offset == i * chunk);
    auto added = together.add(got.tensor);
    BOOST_TEST_REQUIRE(added.has_value(), (added ? "" : added.error().message));
    BOOST_TEST(*added == (i + 1 == split.chunk_count()));
  }
  BOOST_TEST(together.complete());
  BOOST_TEST(together.bytes_received() == gib);
  BOOST_TEST(std::memcmp(source.data(), destination.data(), gib) == 0);
  const auto seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  BOOST_TEST_MESSAGE("1 GiB in " << split.chunk_count() << " chunks round-tripped in " << seconds
                                 << " s");
}

BOOST_AUTO_TEST_CASE(chunks_cover_the_tensor_in_order_with_a_short_last_chunk) {
  pattern_buffer payload(4000); // 1000 float32
  chunker split(pull_reply{9, 8, 7, float_vector(payload.bytes())}, 512);
  BOOST_TEST_REQUIRE(split.chunk_count() == 8u);
  std::uint64_t expected_offset = 0;
  for (std::size_t i = 0; i < split.chunk_count(); ++i) {
    auto part = split.chunk(i);
    const auto& reply = std::get<pull_reply>(part);
    BOOST_TEST(reply.request_id == 9u);
    BOOST_TEST(reply.key == 8u);
    BOOST_TEST(reply.round == 7u);
    BOOST_TEST(reply.tensor.total_bytes == 4000u);
    BOOST_TEST(reply.tensor.offset == expected_offset);
    BOOST_TEST(reply.tensor.data.size() == (i + 1 < 8 ? 512u : 4000u - 7 * 512));
    BOOST_TEST(reply.tensor.data.data() == payload.bytes().data() + expected_offset);
    BOOST_TEST(!validate_tensor(reply.tensor).has_value());
    expected_offset += reply.tensor.data.size();
  }
  BOOST_TEST(expected_offset == 4000u);
  BOOST_CHECK_THROW(split.chunk(8), std::out_of_range);
}

BOOST_AUTO_TEST_CASE(a_packed_tensor_is_chunked_in_whole_words_that_name_their_elements) {
  // 100 float32 elements packed 2bit: 7 words (28 bytes); chunks of 8 bytes hold 32 elements.
  pattern_buffer payload(32);
  const push whole{1, 3, 0, 5,
                   tensor_chunk{dtype::float32,
                                {100},
                                400,
                                0,
                                payload.bytes().first(28),
                                std::nullopt,
                                tensor_compression{compression_type::two_bit, 0.5f, 100}}};
  chunker split(whole, 8);
  BOOST_TEST_REQUIRE(split.chunk_count() == 4u);
  const std::uint64_t elements[] = {32, 32, 32, 4};
  for (std::size_t i = 0; i < 4; ++i) {
    const auto part = std::get<push>(split.chunk(i)).tensor;
    BOOST_TEST(part.offset == i * 32 * 4);
    BOOST_TEST(part.compression.elements == elements[i]);
    BOOST_TEST(part.data.size() == (i < 3 ? 8u : 4u));
    BOOST_TEST(part.data.data() == payload.bytes().data() + i * 8);
    BOOST_TEST(!validate_tensor(part).has_value());
    round_trip_check(part);
  }
  // 1bit: 32 elements a word, so 8 bytes hold 64.
  const push one_bit{1, 3, 0, 5,
                     tensor_chunk{dtype::float16,
                                  {100},
                                  200,
                                  0,
                                  payload.bytes().first(16),
                                  std::nullopt,
                                  tensor_compression{compression_type::one_bit, 0.5f, 100}}};
  chunker halves(one_bit, 8);
  BOOST_TEST_REQUIRE(halves.chunk_count() == 2u);
  BOOST_TEST(std::get<push>(halves.chunk(1)).tensor.offset == 128u);
  BOOST_TEST(std::get<push>(halves.chunk(1)).tensor.compression.elements == 36u);
  // A packed chunk is not a value: a reassembler refuses it and writes nothing.
  std::vector<std::byte> out(400, std::byte{0x11});
  reassembler assembly(out);
  BOOST_TEST(!assembly.add(std::get<push>(split.chunk(0)).tensor).has_value());
  BOOST_TEST((out[0] == std::byte{0x11}));
  // A receiver that asked for packed chunks (a compressed pull) unpacks each where its elements
  // lie: here the unpacker writes each element's index.
  reassembler unpacking(out);
  unpacking.accept_packed([](const tensor_chunk& chunk, std::byte* at) {
    for (std::uint64_t i = 0; i < chunk.compression.elements; ++i) {
      const float index = static_cast<float>(chunk.offset / 4 + i);
      std::memcpy(at + i * 4, &index, 4);
    }
  });
  for (std::size_t i = split.chunk_count(); i-- > 0;) {
    auto added = unpacking.add(std::get<push>(split.chunk(i)).tensor);
    BOOST_TEST_REQUIRE(added.has_value(), (added ? "" : added.error().message));
    BOOST_TEST(*added == (i == 0));
  }
  for (std::size_t i = 0; i < 100; ++i) {
    float value = 0;
    std::memcpy(&value, out.data() + i * 4, 4);
    BOOST_TEST(value == static_cast<float>(i));
  }
}

BOOST_AUTO_TEST_CASE(chunks_arriving_in_any_order_reassemble) {
  pattern_buffer payload(10'000 * 8);
  const tensor_chunk whole{dtype::float64, {100, 100}, payload.bytes().size(), 0, payload.bytes()};
  chunker split(init{1, 2, whole}, 4096);
  std::vector<std::size_t> order(split.chunk_count());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(7);
  std::shuffle(order.begin(), order.end(), rng);

  std::vector<std::byte> destination(payload.bytes().size());
  reassembler together(destination, split.chunk_count());
  for (std::size_t k = 0; k < order.size(); ++k) {
    auto frame = split.encode_chunk(order[k]).flatten();
    auto decoded = decode(frame);
    BOOST_TEST_REQUIRE(decoded.has_value());
    auto added = together.add(tensor_in(*decoded));
    BOOST_TEST_REQUIRE(added.has_value(), (added ? "" : added.error().message));
    BOOST_TEST(*added == (k + 1 == order.size()));
  }
  BOOST_TEST(bytes_equal(destination, payload.bytes()));
  BOOST_TEST((together.type() == dtype::float64));
  BOOST_TEST(together.shape() == (std::vector<std::int64_t>{100, 100}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(the_reassembler_rejects_overlapping_chunks_and_changes_nothing) {
  pattern_buffer payload(64);
  std::vector<std::byte> destination(64, std::byte{0xee});
  reassembler together(destination);
  auto slice = [&](std::uint64_t offset, std::size_t size) {
    return tensor_chunk{dtype::int32, {16}, 64, offset, payload.bytes().subspan(offset, size)};
  };
  BOOST_TEST_REQUIRE(together.add(slice(16, 16)).has_value());
  const std::vector<std::pair<std::uint64_t, std::size_t>> overlapping = {
      {16, 16}, {8, 16}, {28, 8}, {0, 64}, {20, 4}};
  for (auto [offset, size] : overlapping) {
    auto before = destination;
    auto added = together.add(slice(offset, size));
    BOOST_TEST_REQUIRE(!added.has_value());
    BOOST_TEST((added.error().kind == decode_error::code::chunk_overlap), added.error().message);
    BOOST_TEST(bytes_equal(destination, before));
  }
  BOOST_TEST(together.bytes_received() == 16u);
  // Adjacent chunks on both sides are fine, and complete the tensor.
  BOOST_TEST(!*together.add(slice(0, 16)));
  BOOST_TEST(!*together.add(slice(48, 16)));
  BOOST_TEST(*together.add(slice(32, 16)));
  BOOST_TEST(bytes_equal(destination, payload.bytes()));
  // Once complete, any further chunk is a duplicate.
  auto again = together.add(slice(0, 4));
  BOOST_TEST_REQUIRE(!again.has_value());
  BOOST_TEST((again.error().kind == decode_error::code::chunk_overlap));
}

BOOST_AUTO_TEST_CASE(the_reassembler_rejects_chunks_outside_the_destination) {
  pattern_buffer payload(64);
  std::vector<std::byte> destination(32);
  reassembler together(destination);
  // Claims the 32-byte tensor but carries bytes past its end.
  auto past = together.add(tensor_chunk{dtype::int32, {8}, 32, 24, payload.bytes().first(16)});
  BOOST_TEST_REQUIRE(!past.has_value());
  BOOST_TEST((past.error().kind == decode_error::code::chunk_out_of_range));
  auto far = together.add(
      tensor_chunk{dtype::int32, {8}, 32, ~std::uint64_t{0} - 3, payload.bytes().first(8)});
  BOOST_TEST_REQUIRE(!far.has_value());
  BOOST_TEST((far.error().kind == decode_error::code::chunk_out_of_range));
  BOOST_TEST(together.bytes_received() == 0u);
}

BOOST_AUTO_TEST_CASE(the_reassembler_rejects_a_chunk_of_another_total_dtype_or_shape) {
  pattern_buffer payload(64);
  std::vector<std::byte> destination(64);
  reassembler together(destination);
  BOOST_TEST_REQUIRE(
      together.add(tensor_chunk{dtype::float32, {4, 4}, 64, 0, payload.bytes().first(16)})
          .has_value());
  auto code_of = [&](const tensor_chunk& c) {
    auto r = together.add(c);
    BOOST_TEST_REQUIRE(!r.has_value());
    return r.error().kind;
  };
  const auto rest = payload.bytes().subspan(16, 16);
  BOOST_TEST(
      (code_of({dtype::float32, {8, 4}, 128, 16, rest}) == decode_error::code::chunk_mismatch));
  BOOST_TEST((code_of({dtype::int32, {4, 4}, 64, 16, rest}) == decode_error::code::chunk_mismatch));
  BOOST_TEST(
      (code_of({dtype::float32, {2, 8}, 64, 16, rest}) == decode_error::code::chunk_mismatch));
  BOOST_TEST(
      (code_of({dtype::float32, {4, 5}, 64, 16, rest}) == decode_error::code::invalid_tensor));
  BOOST_TEST(together.bytes_received() == 16u);
}

BOOST_AUTO_TEST_CASE(a_reassembler_with_a_declared_shape_refuses_any_other) {
  pattern_buffer payload(48);
  std::vector<std::byte> destination(48);
  reassembler together(destination, dtype::float32, {3, 4});
  auto wrong = together.add(tensor_chunk{dtype::float32, {4, 3}, 48, 0, payload.bytes()});
  BOOST_TEST_REQUIRE(!wrong.has_value());
  BOOST_TEST((wrong.error().kind == decode_error::code::chunk_mismatch));
  BOOST_TEST(*together.add(tensor_chunk{dtype::float32, {3, 4}, 48, 0, payload.bytes()}));
  // The declaration must describe the destination.
  BOOST_CHECK_THROW(reassembler(destination, dtype::float64, {3, 4}), std::invalid_argument);
  BOOST_CHECK_THROW(reassembler(destination, dtype::float32, {-3, -4}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(the_reassembler_bounds_the_ranges_a_peer_can_scatter) {
  pattern_buffer payload(64);
  std::vector<std::byte> destination(64);
  reassembler together(destination, 2);
  auto slice = [&](std::uint64_t offset) {
    return tensor_chunk{dtype::int64, {8}, 64, offset, payload.bytes().subspan(offset, 8)};
  };
  BOOST_TEST(together.add(slice(0)).has_value());
  BOOST_TEST(together.add(slice(16)).has_value());
  auto third = together.add(slice(32));
  BOOST_TEST_REQUIRE(!third.has_value());
  BOOST_TEST((third.error().kind == decode_error::code::limit_exceeded));
  // Filling a gap merges ranges, which is always allowed.
  BOOST_TEST(together.add(slice(8)).has_value());
  BOOST_TEST(together.add(slice(32)).has_value());
}

BOOST_AUTO_TEST_CASE(an_empty_tensor_is_one_empty_chunk) {
  const tensor_chunk empty{dtype::float32, {0, 5}, 0, 0, {}};
  chunker split(push{1, 2, 3, 4, empty});
  BOOST_TEST(split.chunk_count() == 1u);
  auto frame = split.encode_chunk(0).flatten();
  auto decoded = decode(frame);
  BOOST_TEST_REQUIRE(decoded.has_value(), (decoded ? "" : decoded.error().message));
  reassembler together(std::span<std::byte>{});
  BOOST_TEST(!together.complete());
  auto added = together.add(tensor_in(*decoded));
  BOOST_TEST_REQUIRE(added.has_value());
  BOOST_TEST(*added);
}

BOOST_AUTO_TEST_CASE(a_message_without_a_tensor_is_a_single_chunk_of_itself) {
  const message sent = pull_request{1, 2, 3, 4};
  chunker split(sent, 8);
  BOOST_TEST(split.chunk_count() == 1u);
  BOOST_TEST((split.chunk(0) == sent));
}

BOOST_AUTO_TEST_CASE(the_chunker_refuses_bad_chunk_sizes_and_partial_tensors) {
  pattern_buffer payload(64);
  const message whole = push{1, 2, 3, 4, float_vector(payload.bytes())};
  BOOST_CHECK_THROW(chunker(whole, 0), std::invalid_argument);
  BOOST_CHECK_THROW(chunker(whole, 12), std::invalid_argument);
  BOOST_CHECK_THROW(chunker(whole, max_chunk_bytes + 8), std::invalid_argument);
  BOOST_CHECK_NO_THROW(chunker(whole, max_chunk_bytes));

  tensor_chunk partial = float_vector(payload.bytes());
  partial.data = partial.data.first(32);
  BOOST_CHECK_THROW(chunker(push{1, 2, 3, 4, partial}), std::invalid_argument);
  tensor_chunk inconsistent = float_vector(payload.bytes());
  inconsistent.shape = {3};
  BOOST_CHECK_THROW(chunker(push{1, 2, 3, 4, inconsistent}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(the_default_chunk_fits_the_default_frame_cap) {
  pattern_buffer payload(default_chunk_bytes + 4096);
  chunker split(push{1, 2, 3, 4, float_vector(payload.bytes())});
  BOOST_TEST(split.chunk_count() == 2u);
  auto frame = split.encode_chunk(0);
  BOOST_TEST(frame.body_size() <= decode_limits{}.max_frame_bytes);
  auto flat = frame.flatten();
  BOOST_TEST(decode(flat).has_value());
}

BOOST_AUTO_TEST_SUITE_END()

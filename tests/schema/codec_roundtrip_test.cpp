// Every message kind survives encode -> frame -> decode with every field intact, and tensor
// payloads cross without copies where the codec promises none.

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "schema/codec.hpp"
#include "tests/schema/sample_messages.hpp"

using namespace troupe::wire;
using troupe::test::float_tensor;
using troupe::test::pattern_buffer;

namespace {

// Encodes, flattens and decodes; keeps the frame alive with the decoded message that views it.
struct round_trip {
  explicit round_trip(const message& sent) : frame(encode(sent).flatten()) {
    auto result = decode(frame);
    BOOST_TEST_REQUIRE(result.has_value(), (result ? "" : result.error().message));
    decoded.emplace(std::move(*result));
  }
  template <class T>
  const T& as() const {
    BOOST_TEST_REQUIRE(std::holds_alternative<T>(decoded->msg));
    return std::get<T>(decoded->msg);
  }
  std::vector<std::byte> frame;
  std::optional<decoded_message> decoded;
};

bool bytes_equal(std::span<const std::byte> a, std::span<const std::byte> b) {
  return std::ranges::equal(a, b);
}

bool inside(std::span<const std::byte> part, std::span<const std::byte> whole) {
  return std::less_equal<>{}(whole.data(), part.data()) &&
         std::less_equal<>{}(part.data() + part.size(), whole.data() + whole.size());
}

} // namespace

BOOST_AUTO_TEST_SUITE(codec_round_trip)

BOOST_AUTO_TEST_CASE(a_registration_round_trips_field_by_field) {
  registration sent{77, protocol_version, role::worker, "job-1", "host.example", 4242};
  round_trip rt(sent);
  const auto& got = rt.as<registration>();
  BOOST_TEST(got.request_id == 77u);
  BOOST_TEST(got.protocol_version == protocol_version);
  BOOST_TEST((got.node_role == role::worker));
  BOOST_TEST(got.job_id == "job-1");
  BOOST_TEST(got.host == "host.example");
  BOOST_TEST(got.port == 4242);
}

BOOST_AUTO_TEST_CASE(an_admission_round_trips_both_outcomes) {
  sealed_secret sealed{};
  for (std::size_t i = 0; i < sealed.size(); ++i)
    sealed[i] = static_cast<std::uint8_t>(3 * i + 1);
  round_trip yes(admission{5, admitted{2, 13, sealed, false, {}}});
  const auto& a = yes.as<admission>();
  BOOST_TEST(a.request_id == 5u);
  BOOST_TEST_REQUIRE(std::holds_alternative<admitted>(a.outcome));
  BOOST_TEST(std::get<admitted>(a.outcome).rank == 2u);
  BOOST_TEST(std::get<admitted>(a.outcome).node_id == 13u);
  BOOST_TEST((std::get<admitted>(a.outcome).secret == sealed));

  round_trip no(admission{6, rejected{reject_reason::bad_token, "token differs"}});
  const auto& r = no.as<admission>();
  BOOST_TEST(r.request_id == 6u);
  BOOST_TEST_REQUIRE(std::holds_alternative<rejected>(r.outcome));
  BOOST_TEST((std::get<rejected>(r.outcome).reason == reject_reason::bad_token));
  BOOST_TEST(std::get<rejected>(r.outcome).detail == "token differs");

  for (auto reason : {reject_reason::protocol_version, reject_reason::wrong_job,
                      reject_reason::bad_token, reject_reason::role_full, reject_reason::duplicate,
                      reject_reason::shutting_down, reject_reason::wrong_role}) {
    round_trip each(admission{1, rejected{reason, ""}});
    BOOST_TEST((std::get<rejected>(each.as<admission>().outcome).reason == reason));
  }
}

BOOST_AUTO_TEST_CASE(a_membership_table_round_trips_field_by_field) {
  membership sent;
  sent.epoch = 9;
  sent.num_workers = 3;
  sent.num_servers = 2;
  sent.nodes = {{1, role::scheduler, 0, "a", 1, true},
                {8, role::server, 1, "b", 2, true},
                {11, role::worker, 2, "c", 0, false},
                {13, role::worker, 3, "d", 0, true, true}};
  sent.key_ranges = {{0, 10, 0, 0}, {10, 20, 0, 1}, {30, 40, 1, 0}};
  round_trip rt(sent);
  const auto& got = rt.as<membership>();
  BOOST_TEST(got.epoch == 9u);
  BOOST_TEST(got.num_workers == 3u);
  BOOST_TEST(got.num_servers == 2u);
  BOOST_TEST_REQUIRE(got.nodes.size() == 4u);
  for (std::size_t i = 0; i < 3; ++i) {
    BOOST_TEST(got.nodes[i].node_id == sent.nodes[i].node_id);
    BOOST_TEST((got.nodes[i].node_role == sent.nodes[i].node_role));
    BOOST_TEST(got.nodes[i].rank == sent.nodes[i].rank);
    BOOST_TEST(got.nodes[i].host == sent.nodes[i].host);
    BOOST_TEST(got.nodes[i].data_port == sent.nodes[i].data_port);
    BOOST_TEST(got.nodes[i].alive == sent.nodes[i].alive);
    BOOST_TEST(got.nodes[i].left == sent.nodes[i].left);
  }
  BOOST_TEST_REQUIRE(got.key_ranges.size() == 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    BOOST_TEST(got.key_ranges[i].begin == sent.key_ranges[i].begin);
    BOOST_TEST(got.key_ranges[i].end == sent.key_ranges[i].end);
    BOOST_TEST(got.key_ranges[i].server_rank == sent.key_ranges[i].server_rank);
    BOOST_TEST(got.key_ranges[i].shard_index == sent.key_ranges[i].shard_index);
  }
}

BOOST_AUTO_TEST_CASE(an_empty_membership_table_round_trips) {
  round_trip rt(membership{});
  BOOST_TEST((rt.as<membership>() == membership{}));
}

BOOST_AUTO_TEST_CASE(init_push_pushpull_and_pull_reply_round_trip_with_their_tensors) {
  pattern_buffer payload(24);
  const tensor_chunk t{dtype::float32, {2, 3}, 24, 0, payload.bytes()};

  round_trip i(init{1, 2, t});
  BOOST_TEST(i.as<init>().request_id == 1u);
  BOOST_TEST(i.as<init>().key == 2u);
  BOOST_TEST((i.as<init>().tensor == t));

  round_trip p(push{3, 4, 5, 6, t});
  const auto& got = p.as<push>();
  BOOST_TEST(got.request_id == 3u);
  BOOST_TEST(got.key == 4u);
  BOOST_TEST(got.sender_rank == 5u);
  BOOST_TEST(got.round == 6u);
  BOOST_TEST((got.tensor.type == dtype::float32));
  BOOST_TEST(got.tensor.shape == (std::vector<std::int64_t>{2, 3}),
             boost::test_tools::per_element());
  BOOST_TEST(got.tensor.total_bytes == 24u);
  BOOST_TEST(got.tensor.offset == 0u);
  BOOST_TEST(bytes_equal(got.tensor.data, payload.bytes()));

  round_trip pp(pushpull{7, 8, 9, 10, t});
  BOOST_TEST((pp.as<pushpull>() == pushpull{7, 8, 9, 10, t}));

  round_trip pr(pull_reply{11, 12, 13, t});
  BOOST_TEST((pr.as<pull_reply>() == pull_reply{11, 12, 13, t}));
}

BOOST_AUTO_TEST_CASE(every_dtype_and_a_scalar_shape_round_trip) {
  pattern_buffer payload(8);
  for (auto type : {dtype::float32, dtype::float16, dtype::int32, dtype::int64, dtype::float64}) {
    const std::size_t size = size_of(type);
    tensor_chunk t{type, {}, size, 0, payload.bytes().first(size)};
    round_trip rt(push{1, 1, 0, 0, t});
    BOOST_TEST((rt.as<push>().tensor == t), to_string(type));
  }
}

BOOST_AUTO_TEST_CASE(a_compressed_push_and_pushpull_round_trip_their_packing) {
  pattern_buffer payload(12);
  // 40 float32 elements from element 16 of a (64) tensor, 2bit: 3 words.
  const tensor_chunk t{dtype::float32,
                       {64},
                       256,
                       64,
                       payload.bytes(),
                       std::nullopt,
                       tensor_compression{compression_type::two_bit, 0.25f, 40}};
  round_trip p(push{1, 2, 3, 4, t});
  BOOST_TEST((p.as<push>().tensor == t));
  BOOST_TEST(p.as<push>().tensor.dense_bytes() == 160u);
  round_trip pp(pushpull{5, 6, 7, 8, t});
  BOOST_TEST((pp.as<pushpull>().tensor == t));
  const tensor_chunk one_bit{dtype::float16,
                             {2, 32},
                             128,
                             0,
                             payload.bytes().first(8),
                             std::nullopt,
                             tensor_compression{compression_type::one_bit, 0.0f, 64}};
  round_trip o(push{1, 2, 3, 4, one_bit});
  BOOST_TEST((o.as<push>().tensor == one_bit));
  // Compressed pulls: the offer of a packed reply, and the packed reply.
  pull_request pull{1, 2, 3, 4, 5};
  pull.reply_compression = {compression_type::one_bit, 0.25f};
  round_trip asked(pull);
  BOOST_TEST((asked.as<pull_request>() == pull));
  pushpull both{5, 6, 7, 8, t};
  both.reply_compression = {compression_type::two_bit, 0.5f};
  round_trip asked_both(both);
  BOOST_TEST((asked_both.as<pushpull>() == both));
  round_trip reply(pull_reply{9, 10, 11, one_bit});
  BOOST_TEST((reply.as<pull_reply>().tensor == one_bit));
}

BOOST_AUTO_TEST_CASE(a_chunk_in_the_middle_of_a_tensor_round_trips_its_offset) {
  pattern_buffer payload(40);
  tensor_chunk t{dtype::float64, {100}, 800, 160, payload.bytes()};
  round_trip rt(pull_reply{1, 2, 3, t});
  BOOST_TEST(rt.as<pull_reply>().tensor.offset == 160u);
  BOOST_TEST(rt.as<pull_reply>().tensor.total_bytes == 800u);
  BOOST_TEST((rt.as<pull_reply>().tensor == t));
}

BOOST_AUTO_TEST_CASE(a_pull_request_an_ack_and_a_heartbeat_round_trip) {
  round_trip pr(pull_request{1, 2, 3, 4});
  BOOST_TEST(pr.as<pull_request>().request_id == 1u);
  BOOST_TEST(pr.as<pull_request>().key == 2u);
  BOOST_TEST(pr.as<pull_request>().sender_rank == 3u);
  BOOST_TEST(pr.as<pull_request>().round == 4u);

  round_trip a(ack{~std::uint64_t{0}});
  BOOST_TEST(a.as<ack>().request_id == ~std::uint64_t{0});

  round_trip h(heartbeat{5, 6, -7});
  BOOST_TEST(h.as<heartbeat>().sender_node_id == 5u);
  BOOST_TEST(h.as<heartbeat>().sequence == 6u);
  BOOST_TEST(h.as<heartbeat>().timestamp_ns == -7);
}

BOOST_AUTO_TEST_CASE(a_barrier_and_its_release_round_trip) {
  round_trip b(barrier{1, 2, group::all, 4, {}});
  BOOST_TEST(b.as<barrier>().request_id == 1u);
  BOOST_TEST(b.as<barrier>().barrier_id == 2u);
  BOOST_TEST(b.as<barrier>().group == group::all);
  BOOST_TEST(b.as<barrier>().sender_node_id == 4u);

  round_trip r(barrier_release{1, 2, group::scheduler, {}});
  BOOST_TEST(r.as<barrier_release>().request_id == 1u);
  BOOST_TEST(r.as<barrier_release>().barrier_id == 2u);
  BOOST_TEST(r.as<barrier_release>().group == group::scheduler);
}

BOOST_AUTO_TEST_CASE(barrier_values_and_a_release_s_gathered_values_round_trip_and_are_bounded) {
  barrier sent{1, 2, group::workers, 4, {1.5, -0.25, 4e300}};
  round_trip b(sent);
  BOOST_TEST((b.as<barrier>() == sent));
  barrier_release release{
      1, 2, group::workers, {{role::worker, 0, {61234.5}}, {role::worker, 1, {0.0, 7.0}}}};
  round_trip r(release);
  BOOST_TEST((r.as<barrier_release>() == release));

  // 65 values: the receiver refuses the frame, naming the limit.
  barrier too_many{1, 2, group::workers, 4, std::vector<double>(max_barrier_values + 1, 1.0)};
  const auto frame = encode(too_many).flatten();
  auto decoded = decode(frame);
  BOOST_TEST_REQUIRE(!decoded.has_value());
  BOOST_TEST((decoded.error().kind == decode_error::code::limit_exceeded));
  BOOST_TEST(decoded.error().message.find("65 values, more than 64") != std::string::npos,
             decoded.error().message);
  barrier_release too_many_gathered{
      1, 2, group::workers, {{role::worker, 3, std::vector<double>(65, 1.0)}}};
  const auto release_frame = encode(too_many_gathered).flatten();
  BOOST_TEST(!decode(release_frame).has_value());
}

BOOST_AUTO_TEST_CASE(set_optimizer_keeps_its_parameters_in_order) {
  set_optimizer sent{3, "test", {{"rescale_grad", 2.0}, {"wd", 0.0}, {"lr", -1e-300}}};
  round_trip rt(sent);
  const auto& got = rt.as<set_optimizer>();
  BOOST_TEST(got.request_id == 3u);
  BOOST_TEST(got.name == "test");
  BOOST_TEST_REQUIRE(got.params.size() == 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    BOOST_TEST(got.params[i].name == sent.params[i].name);
    BOOST_TEST(got.params[i].value == sent.params[i].value);
  }
}

BOOST_AUTO_TEST_CASE(set_gradient_compression_round_trips) {
  round_trip rt(set_gradient_compression{4, "2bit", 0.5});
  BOOST_TEST(rt.as<set_gradient_compression>().request_id == 4u);
  BOOST_TEST(rt.as<set_gradient_compression>().type == "2bit");
  BOOST_TEST(rt.as<set_gradient_compression>().threshold == 0.5);
}

BOOST_AUTO_TEST_CASE(every_command_round_trips) {
  for (const command& sent :
       {command{1, command_kind::stop, ""}, command{6, command_kind::stop, "", false, 123},
        command{2, command_kind::save_checkpoint, "ckpt/a", true},
        command{3, command_kind::load_checkpoint, "/ckpt/b"},
        command{4, command_kind::sync_mode, ""}, command{5, command_kind::async_mode, ""}}) {
    round_trip rt(sent);
    const auto& got = rt.as<command>();
    BOOST_TEST(got.request_id == sent.request_id);
    BOOST_TEST((got.kind == sent.kind));
    BOOST_TEST(got.path == sent.path);
    BOOST_TEST(got.dump_optimizer == sent.dump_optimizer);
    BOOST_TEST(got.rounds == sent.rounds);
  }
}

BOOST_AUTO_TEST_CASE(an_error_reply_round_trips_with_and_without_a_key) {
  round_trip with(error_reply{9, 42, error_code::unknown_key, "key 42 was never initialised"});
  const auto& a = with.as<error_reply>();
  BOOST_TEST(a.request_id == 9u);
  BOOST_TEST_REQUIRE(a.key.has_value());
  BOOST_TEST(*a.key == 42u);
  BOOST_TEST((a.code == error_code::unknown_key));
  BOOST_TEST(a.message == "key 42 was never initialised");

  round_trip without(error_reply{10, std::nullopt, error_code::lost_peer, "server 1 lost"});
  BOOST_TEST(!without.as<error_reply>().key.has_value());

  for (int c = 0; c <= static_cast<int>(error_code::moved); ++c) {
    round_trip each(error_reply{1, std::nullopt, static_cast<error_code>(c), ""});
    BOOST_TEST(static_cast<int>(each.as<error_reply>().code) == c);
  }
}

BOOST_AUTO_TEST_CASE(every_alternative_of_message_round_trips_equal) {
  pattern_buffer payload(4096 + 64);
  const auto samples = troupe::test::sample_messages(payload.bytes());
  std::set<std::size_t> kinds;
  for (const auto& sent : samples) {
    round_trip rt(sent);
    BOOST_TEST((rt.decoded->msg == sent), kind_name(sent));
    kinds.insert(sent.index());
  }
  BOOST_TEST(kinds.size() == std::variant_size_v<message>);
}

BOOST_AUTO_TEST_CASE(a_batch_copies_its_tensors_into_the_frame_whatever_their_size) {
  // Above the size that a lone message references instead of copying.
  pattern_buffer payload(64 << 10);
  const batch sent{{push{1, 2, 3, 4, float_tensor(payload.bytes(), 128, 128)},
                    pushpull{5, 6, 3, 7, float_tensor(payload.bytes(), 128, 128)}}};
  auto frame = encode(sent);
  for (auto piece : frame.pieces())
    BOOST_TEST(!(piece.data() >= payload.bytes().data() &&
                 piece.data() < payload.bytes().data() + payload.bytes().size()));
  round_trip rt(sent);
  BOOST_TEST((rt.decoded->msg == message{sent}));
  const auto& decoded = rt.as<batch>();
  BOOST_TEST_REQUIRE(decoded.messages.size() == 2u);
  BOOST_TEST(std::get<pushpull>(decoded.messages[1]).round == 7u);
  BOOST_TEST((unbatched(batched{ack{3}}) == message{ack{3}}));
  BOOST_TEST(!to_batched(heartbeat{}).has_value());
  BOOST_TEST(to_batched(pull_request{9}).has_value());
}

BOOST_AUTO_TEST_CASE(a_batch_holds_whole_packed_pushes) {
  // Whole means every element of the tensor, whatever the packed bytes' size.
  pattern_buffer payload(16);
  const tensor_chunk packed{dtype::float32,
                            {50},
                            200,
                            0,
                            payload.bytes(),
                            std::nullopt,
                            tensor_compression{compression_type::two_bit, 0.5f, 50}};
  const batch sent{{push{1, 2, 3, 4, packed}, pushpull{5, 6, 3, 7, packed}}};
  round_trip rt(sent);
  BOOST_TEST((rt.decoded->msg == message{sent}));
}

BOOST_AUTO_TEST_CASE(a_batch_of_values_in_the_arena_is_one_segment_and_decodes) {
  // A server's answers to 40 pulls of 4 KiB through the shared-memory arena: the frame holds only
  // the references. Its first segment once came out too small, and the second segment's far
  // pointers cost Cap'n Proto's reader more than the frame's own word count, which the traversal
  // limit then was: the frame was refused.
  std::vector<std::uint64_t> arena_words(40 * 512);
  const auto arena = std::as_bytes(std::span(arena_words));
  batch sent;
  for (std::uint64_t i = 0; i < 40; ++i) {
    auto tensor = float_tensor(arena.subspan(i * 4096, 4096), 1, 1024);
    tensor.shape = {1024};
    tensor.shm = shm_ref{i * 4096, 4096};
    sent.messages.push_back(pull_reply{i, 1000 + i, 3, tensor});
  }
  auto frame = encode(sent).flatten();
  std::uint32_t segments_less_one = 0;
  std::memcpy(&segments_less_one, frame.data() + frame_prefix_bytes, sizeof segments_less_one);
  BOOST_TEST(segments_less_one == 0u);
  auto result = decode(frame, {}, arena);
  BOOST_TEST_REQUIRE(result.has_value());
  const auto& items = std::get<batch>(result->msg).messages;
  BOOST_TEST_REQUIRE(items.size() == 40u);
  const auto& last = std::get<pull_reply>(items.back()).tensor;
  BOOST_TEST(last.data.data() == arena.data() + 39 * 4096);
  BOOST_TEST(last.data.size() == 4096u);
}

BOOST_AUTO_TEST_CASE(the_frame_starts_with_its_body_length_in_little_endian) {
  auto frame = encode(ack{1}).flatten();
  BOOST_TEST_REQUIRE(frame.size() >= 16u);
  std::uint64_t length = 0;
  for (int i = 7; i >= 0; --i)
    length = length << 8 | static_cast<std::uint64_t>(frame[i]);
  BOOST_TEST(length == frame.size() - frame_prefix_bytes);
  BOOST_TEST(length % 8 == 0u);
  auto announced = read_frame_prefix(frame);
  BOOST_TEST_REQUIRE(announced.has_value());
  BOOST_TEST(*announced == length);
  BOOST_TEST(decode_body(std::span(frame).subspan(frame_prefix_bytes)).has_value());
}

BOOST_AUTO_TEST_CASE(a_tensor_payload_is_decoded_in_place_without_a_copy) {
  pattern_buffer payload(64 << 10);
  auto frame = encode(push{1, 2, 3, 4, float_tensor(payload.bytes(), 128, 128)}).flatten();
  auto result = decode(frame);
  BOOST_TEST_REQUIRE(result.has_value());
  BOOST_TEST(!result->copied());
  const auto& data = std::get<push>(result->msg).tensor.data;
  BOOST_TEST(inside(data, frame));
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(data.data()) % 8 == 0u);
  BOOST_TEST(bytes_equal(data, payload.bytes()));
}

BOOST_AUTO_TEST_CASE(a_large_aligned_payload_is_referenced_by_the_frame_not_copied) {
  pattern_buffer payload(1 << 20);
  auto frame = encode(push{1, 2, 3, 4, float_tensor(payload.bytes(), 512, 512)});
  const auto pieces = frame.pieces();
  const bool referenced = std::ranges::any_of(pieces, [&](std::span<const std::byte> piece) {
    return piece.data() == payload.bytes().data() && piece.size() == payload.bytes().size();
  });
  BOOST_TEST(referenced);
  std::size_t total = 0;
  for (auto piece : pieces)
    total += piece.size();
  BOOST_TEST(total == frame.size());
  // The frame's own memory holds only the metadata.
  BOOST_TEST(frame.size() - payload.bytes().size() < 256u);
}

BOOST_AUTO_TEST_CASE(a_referenced_payload_of_odd_size_is_framed_without_reading_past_it) {
  // float16 with an odd element count: 2051 elements = 4102 bytes, not a multiple of 8. The
  // payload fills an allocation of exactly that size, so a read past it is a heap overflow that
  // AddressSanitizer reports.
  const std::size_t size = 4102;
  auto* storage = static_cast<std::byte*>(::operator new (size, std::align_val_t{8}));
  for (std::size_t i = 0; i < size; ++i)
    storage[i] = static_cast<std::byte>(i * 7 + 1);
  std::span<const std::byte> payload(storage, size);

  tensor_chunk t{dtype::float16, {2051}, size, 0, payload};
  auto frame = encode(pull_reply{1, 2, 3, t});
  const auto pieces = frame.pieces();
  auto referenced = std::ranges::find_if(
      pieces, [&](std::span<const std::byte> piece) { return piece.data() == storage; });
  BOOST_TEST_REQUIRE((referenced != pieces.end()));
  BOOST_TEST(referenced->size() == 4096u); // the whole words of the caller's buffer
  // The last partial word comes from the frame's own copy, zero-padded.
  BOOST_TEST_REQUIRE((referenced + 1 != pieces.end()));
  const auto tail = *(referenced + 1);
  BOOST_TEST_REQUIRE(tail.size() == 8u);
  BOOST_TEST(bytes_equal(tail.first(6), payload.subspan(4096)));
  BOOST_TEST((tail[6] == std::byte{0} && tail[7] == std::byte{0}));

  auto flat = frame.flatten();
  auto result = decode(flat);
  BOOST_TEST_REQUIRE(result.has_value(), (result ? "" : result.error().message));
  BOOST_TEST(bytes_equal(std::get<pull_reply>(result->msg).tensor.data, payload));
  ::operator delete (storage, std::align_val_t{8});
}

BOOST_AUTO_TEST_CASE(a_misaligned_payload_is_copied_into_the_frame_and_round_trips) {
  pattern_buffer buffer(8 * 1024 + 8);
  auto payload = buffer.bytes().subspan(4, 8 * 1024); // 4-byte aligned float32 data
  auto frame = encode(push{1, 2, 3, 4, float_tensor(payload, 32, 64)});
  BOOST_TEST(std::ranges::none_of(frame.pieces(), [&](std::span<const std::byte> piece) {
    return piece.data() == payload.data();
  }));
  auto flat = frame.flatten();
  auto result = decode(flat);
  BOOST_TEST_REQUIRE(result.has_value());
  BOOST_TEST(bytes_equal(std::get<push>(result->msg).tensor.data, payload));
}

BOOST_AUTO_TEST_CASE(a_frame_at_a_misaligned_address_is_copied_once_and_decodes) {
  pattern_buffer payload(4096);
  const push sent{1, 2, 3, 4, float_tensor(payload.bytes(), 32, 32)};
  auto flat = encode(sent).flatten();
  std::vector<std::byte> shifted(flat.size() + 1);
  std::memcpy(shifted.data() + 1, flat.data(), flat.size());
  std::span<const std::byte> misaligned(shifted.data() + 1, flat.size());
  auto result = decode(misaligned);
  BOOST_TEST_REQUIRE(result.has_value(), (result ? "" : result.error().message));
  BOOST_TEST(result->copied());
  const auto& data = std::get<push>(result->msg).tensor.data;
  BOOST_TEST(!inside(data, shifted));
  BOOST_TEST((result->msg == message{sent}));
  // The copy lives as long as any decoded_message that shares it.
  decoded_message kept = *result;
  result = decode_error{decode_error::code::truncated, "drop the first copy"};
  BOOST_TEST(bytes_equal(std::get<push>(kept.msg).tensor.data, payload.bytes()));
}

BOOST_AUTO_TEST_CASE(pieces_can_be_flattened_into_a_caller_buffer) {
  pattern_buffer payload(8192);
  auto frame = encode(push{1, 2, 3, 4, float_tensor(payload.bytes(), 64, 32)});
  std::vector<std::byte> out(frame.size());
  frame.flatten_into(out);
  BOOST_TEST(bytes_equal(out, frame.flatten()));
  std::vector<std::byte> wrong(frame.size() - 8);
  BOOST_CHECK_THROW(frame.flatten_into(wrong), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(encode_refuses_a_command_kind_outside_the_enumeration) {
  BOOST_CHECK_THROW(encode(command{1, static_cast<command_kind>(9), ""}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(the_message_helpers_name_kinds_and_find_tensors) {
  pattern_buffer payload(16);
  message p = push{1, 2, 3, 4, float_tensor(payload.bytes(), 2, 2)};
  BOOST_TEST(kind_name(p) == "push");
  BOOST_TEST(tensor_of(p) == &std::get<push>(p).tensor);
  BOOST_TEST(kind_name(message{ack{}}) == "ack");
  BOOST_TEST(tensor_of(message{ack{}}) == nullptr);
  BOOST_TEST(size_of(dtype::float16) == 2u);
  BOOST_TEST(size_of(static_cast<dtype>(42)) == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

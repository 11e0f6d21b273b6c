// actors/data_link: the framing classes without a network, then the server and client brokers
// over loopback inside one process (an actor system with the middleman; a raw socket plays the
// hostile peer). Every wait is bounded: a broken data path fails a check, it never hangs.

#include <arpa/inet.h>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <netinet/in.h>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <sys/socket.h>
#include <sys/time.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/data_link.hpp"
#include "actors/data_link_framing.hpp"
#include "actors/shm_arena.hpp"
#include "schema/chunking.hpp"
#include "tests/shm_files.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

constexpr auto patience = 5s;

/// `count` float32 values 0, 1, 2, ... (as bytes, so tensors are checked byte for byte).
std::shared_ptr<std::vector<float>> ramp(std::size_t count, float start = 0) {
  auto values = std::make_shared<std::vector<float>>(count);
  std::iota(values->begin(), values->end(), start);
  return values;
}

wire::tensor_chunk tensor_view(std::span<const float> values) {
  wire::tensor_chunk t;
  t.type = wire::dtype::float32;
  t.shape = {static_cast<std::int64_t>(values.size())};
  t.total_bytes = values.size_bytes();
  t.data = std::as_bytes(values);
  return t;
}

wire::push make_push(std::uint64_t request_id, std::span<const float> values) {
  wire::push p;
  p.request_id = request_id;
  p.key = request_id % 7;
  p.sender_rank = 1;
  p.round = 3;
  p.tensor = tensor_view(values);
  return p;
}

/// Feeds a whole frame to a receiver the way a scribe would: the announced reads, in order,
/// into whatever buffer the receiver leaves in place.
receive_outcome feed(frame_receiver& receiver, std::vector<char>& scribe_buffer,
                     std::span<const std::byte> frame) {
  std::size_t at = 0;
  std::size_t next = frame_receiver::first_read;
  receive_outcome out;
  while (at < frame.size()) {
    scribe_buffer.resize(next);
    std::memcpy(scribe_buffer.data(), frame.data() + at, next);
    at += next;
    out = receiver.consume(scribe_buffer);
    if (out.frame || out.error)
      return out;
    next = out.next_read;
  }
  return out;
}

// --- an actor system with the io module, and what a test spawned in it -----------------------

struct link_fixture {
  link_fixture() {
    cfg.load<caf::io::middleman>();
    cfg.set("scheduler.max-threads", 2);
    sys = std::make_unique<caf::actor_system>(cfg);
    watcher = std::make_unique<caf::scoped_actor>(*sys);
  }
  ~link_fixture() {
    // The system waits for every actor before it goes: end the brokers and the echo actors.
    for (auto& a : spawned)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }

  /// An actor that answers every request by sending the same envelope back (the tensor still
  /// viewing the server's frame buffer, kept alive by the envelope).
  caf::actor spawn_echo() {
    // The spawned function takes an (unused) argument because CAF 0.17.6's init_fun_factory
    // dereferences a null argument tuple for functions without one (UBSan reports it).
    auto echo = sys->spawn(
        [](caf::event_based_actor* self, int) -> caf::behavior {
          return {[=](envelope& request, caf::actor& reply_to) {
            self->send(reply_to, std::move(request));
          }};
        },
        0);
    spawned.push_back(echo);
    return echo;
  }

  /// A data server on 127.0.0.1 (echoing unless options.route says otherwise) whose closed
  /// connections are reported to `watcher` as well (see await_disconnects).
  data_server start_server(data_server_options options = {}) {
    if (!options.route) {
      auto echo = spawn_echo();
      options.route = [echo](const envelope&) { return echo; };
    }
    options.on_disconnect = [told = std::move(options.on_disconnect),
                             w = caf::actor_cast<caf::actor>(*watcher)](std::uint64_t id) {
      if (told)
        told(id);
      caf::anon_send(w, peer_lost_atom::value, id);
    };
    auto server = spawn_data_server(*sys, "127.0.0.1", 0, std::move(options));
    BOOST_TEST_REQUIRE(server.has_value());
    spawned.push_back(server->broker);
    return *server;
  }

  caf::actor connect(std::uint16_t port, const caf::scoped_actor& receiver,
                     data_link_options options = {}) {
    auto link = connect_data_link(*sys, "127.0.0.1", port, caf::actor_cast<caf::actor>(receiver),
                                  std::move(options));
    BOOST_TEST_REQUIRE(link.has_value());
    spawned.push_back(*link);
    return *link;
  }

  /// The next envelope for `self`, or nullopt after `patience`.
  static std::optional<envelope> next_envelope(caf::scoped_actor& self) {
    std::optional<envelope> got;
    self->receive([&](envelope& env) { got = std::move(env); },
                  [&](link_down_atom, std::uint64_t, const std::string& reason) {
                    BOOST_TEST_MESSAGE("unexpected link_down: " << reason);
                  },
                  caf::after(patience) >> [] {});
    return got;
  }

  /// The ids of the next `count` connections the servers report closed (fewer on timeout).
  /// Tests whose raw peers go away wait for this: CAF 0.17.6 leaks a connection that is still
  /// being closed when the actor system shuts down.
  std::vector<std::uint64_t> await_disconnects(std::size_t count) {
    std::vector<std::uint64_t> ids;
    for (std::size_t i = 0; i < count; ++i)
      (*watcher)->receive([&](peer_lost_atom, std::uint64_t id) { ids.push_back(id); },
                          caf::after(patience) >> [] {});
    return ids;
  }

  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  /// Receives (peer_lost_atom, connection id) from every server's on_disconnect.
  std::unique_ptr<caf::scoped_actor> watcher;
  std::vector<caf::actor> spawned;
};

// --- a raw TCP peer, for bytes no encoder would write --------------------------------------

struct raw_peer {
  explicit raw_peer(std::uint16_t port, const char* address = "127.0.0.1") {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval timeout{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    ::inet_pton(AF_INET, address, &to.sin_addr);
    connected = ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0;
  }
  ~raw_peer() { close(); }

  void close() {
    if (fd >= 0)
      ::close(fd);
    fd = -1;
  }

  bool send(std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      auto n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0)
        return false;
      bytes = bytes.subspan(static_cast<std::size_t>(n));
    }
    return true;
  }
  bool send_prefix(std::uint64_t body_length) {
    std::byte prefix[8];
    for (int i = 0; i < 8; ++i)
      prefix[i] = static_cast<std::byte>(body_length >> (8 * i));
    return send(prefix);
  }
  /// Reads exactly `size` bytes; false on close, error or timeout.
  bool receive(void* out, std::size_t size) {
    auto* at = static_cast<char*>(out);
    while (size > 0) {
      auto n = ::recv(fd, at, size, 0);
      if (n <= 0)
        return false;
      at += n;
      size -= static_cast<std::size_t>(n);
    }
    return true;
  }
  /// The next frame from the server, decoded (into a buffer kept in `last_body`).
  std::optional<wire::message> receive_frame() {
    std::byte prefix[8];
    if (!receive(prefix, sizeof prefix))
      return std::nullopt;
    auto length = wire::read_frame_prefix(prefix);
    if (!length)
      return std::nullopt;
    last_body.assign(*length / 8, 0);
    if (!receive(last_body.data(), *length))
      return std::nullopt;
    auto decoded = wire::decode_body(std::as_bytes(std::span(last_body)));
    if (!decoded)
      return std::nullopt;
    return decoded->msg;
  }
  /// True when the server closed the connection (EOF) within the receive timeout.
  bool sees_close() {
    char byte;
    return ::recv(fd, &byte, 1, 0) == 0;
  }

  int fd = -1;
  bool connected = false;
  std::vector<std::uint64_t> last_body;
};

const wire::error_reply* as_error(const std::optional<wire::message>& msg) {
  return msg ? std::get_if<wire::error_reply>(&*msg) : nullptr;
}
// The pointer views the optional: a temporary would be gone before the pointer is used.
const wire::error_reply* as_error(std::optional<wire::message>&&) = delete;

} // namespace

BOOST_AUTO_TEST_SUITE(data_link_framing)

BOOST_AUTO_TEST_CASE(the_send_queue_appends_frames_in_order_in_bounded_steps) {
  auto values = ramp(70000);
  std::vector<wire::encoded_frame> frames;
  std::vector<char> expected;
  frame_send_queue queue;
  std::weak_ptr<const void> watch = values;
  for (std::size_t count : {3u, 1025u, 70000u}) {
    auto msg = make_push(count, std::span(*values).first(count));
    auto flat = wire::encode(msg).flatten();
    expected.insert(expected.end(), reinterpret_cast<const char*>(flat.data()),
                    reinterpret_cast<const char*>(flat.data()) + flat.size());
    queue.push(wire::encode(msg), values);
  }
  values.reset();
  BOOST_TEST(queue.frames() == 3u);
  BOOST_TEST(queue.queued_bytes() == expected.size());
  std::vector<char> out;
  while (!queue.empty()) {
    const std::size_t before = out.size();
    BOOST_TEST(queue.append_to(out, 1000) <= 1000u);
    BOOST_TEST(out.size() > before);
  }
  BOOST_TEST(queue.queued_bytes() == 0u);
  BOOST_TEST((out == expected));
  // Once every byte is in the write buffer, nothing keeps the tensor alive.
  BOOST_TEST(watch.expired());
}

BOOST_AUTO_TEST_CASE(the_receiver_decodes_a_frame_in_place_and_reuses_its_buffer) {
  auto pool = std::make_shared<receive_buffer_pool>(std::size_t{64} << 20);
  frame_receiver receiver(pool, {});
  std::vector<char> scribe_buffer;
  auto values = ramp(4096);
  for (int round = 0; round < 2; ++round) {
    auto frame = wire::encode(make_push(9, *values)).flatten();
    auto out = feed(receiver, scribe_buffer, frame);
    BOOST_TEST_REQUIRE(out.frame.has_value());
    BOOST_TEST(!out.error.has_value());
    BOOST_TEST(out.next_read == wire::frame_prefix_bytes);
    BOOST_TEST(scribe_buffer.size() == wire::frame_prefix_bytes);
    const auto& push = std::get<wire::push>(out.frame->msg);
    BOOST_TEST((push == make_push(9, *values)));
    // Zero copy: the tensor views the buffer the envelope keeps alive.
    const auto* buffer = static_cast<const std::vector<char>*>(out.frame->keepalive.get());
    BOOST_TEST_REQUIRE(buffer != nullptr);
    const auto* data = reinterpret_cast<const char*>(push.tensor.data.data());
    BOOST_TEST((data >= buffer->data() && data < buffer->data() + buffer->size()));
  }
  const auto stats = pool->stats();
  BOOST_TEST(stats.misses == 1u);
  BOOST_TEST(stats.hits == 1u);
}

BOOST_AUTO_TEST_CASE(a_frame_without_a_tensor_gives_its_buffer_back_at_once) {
  auto pool = std::make_shared<receive_buffer_pool>(std::size_t{1} << 20);
  frame_receiver receiver(pool, {});
  std::vector<char> scribe_buffer;
  auto frame = wire::encode(wire::ack{5}).flatten();
  auto out = feed(receiver, scribe_buffer, frame);
  BOOST_TEST_REQUIRE(out.frame.has_value());
  BOOST_TEST(!out.frame->keepalive);
  BOOST_TEST(pool->stats().cached_buffers == 1u);
}

BOOST_AUTO_TEST_CASE(an_oversized_prefix_is_fatal_before_anything_is_allocated) {
  auto pool = std::make_shared<receive_buffer_pool>(std::size_t{1} << 20);
  wire::decode_limits limits;
  limits.max_frame_bytes = 1 << 20;
  frame_receiver receiver(pool, limits);
  std::vector<char> prefix(8, 0);
  prefix[3] = 1; // 16 MiB
  auto out = receiver.consume(prefix);
  BOOST_TEST(out.fatal());
  BOOST_TEST_REQUIRE(out.error.has_value());
  BOOST_TEST((out.error->kind == wire::decode_error::code::frame_too_large));
  BOOST_TEST(pool->stats().misses == 0u);
}

BOOST_AUTO_TEST_CASE(a_body_contradicting_its_length_is_fatal_and_bad_content_is_not) {
  auto pool = std::make_shared<receive_buffer_pool>(std::size_t{1} << 20);
  frame_receiver receiver(pool, {});
  std::vector<char> scribe_buffer;

  wire::barrier bad_group;
  bad_group.group = 0; // encode writes it as given; decode refuses it
  auto out = feed(receiver, scribe_buffer, wire::encode(bad_group).flatten());
  BOOST_TEST_REQUIRE(out.error.has_value());
  BOOST_TEST(!out.fatal());
  BOOST_TEST((out.error->kind == wire::decode_error::code::invalid_value));

  // The prefix announces 16 bytes while the segment table announces more: the length lies.
  auto flat = wire::encode(wire::ack{1}).flatten();
  std::vector<std::byte> lying(flat.begin(), flat.begin() + 24);
  lying[0] = std::byte{16};
  for (int i = 1; i < 8; ++i)
    lying[i] = std::byte{0};
  out = feed(receiver, scribe_buffer, lying);
  BOOST_TEST_REQUIRE(out.error.has_value());
  BOOST_TEST(out.fatal());
}

BOOST_AUTO_TEST_CASE(the_buffer_pool_keeps_at_most_its_cap) {
  receive_buffer_pool pool(std::size_t{3} << 20);
  std::vector<std::shared_ptr<const std::vector<char>>> out;
  for (int i = 0; i < 5; ++i)
    out.push_back(pool.keep(pool.take(std::size_t{1} << 20)));
  out.clear();
  const auto stats = pool.stats();
  BOOST_TEST(stats.cached_bytes <= (std::size_t{3} << 20));
  BOOST_TEST(stats.cached_buffers == 3u);
  BOOST_TEST(stats.evictions == 2u);
  // A cached buffer is not handed out for a request far smaller than itself.
  auto small = pool.take(100);
  BOOST_TEST(small.size() == 100u);
  BOOST_TEST(pool.stats().misses == 6u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(data_link_brokers, link_fixture)

BOOST_AUTO_TEST_CASE(the_server_binds_the_loopback_address_it_was_given_and_nothing_else) {
  auto server = start_server();
  BOOST_TEST(server.port != 0);
  BOOST_TEST(server.host == "127.0.0.1");
  {
    raw_peer loopback(server.port, "127.0.0.1");
    BOOST_TEST(loopback.connected);
    // 127.0.0.2 reaches this host too, but a socket bound to 127.0.0.1 alone does not answer it.
    raw_peer other(server.port, "127.0.0.2");
    BOOST_TEST(!other.connected);
  }
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(small_and_large_tensors_round_trip_byte_identical) {
  auto server = start_server();
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self);

  auto small = ramp(1000, 0.5f);
  self->send(link, envelope{make_push(1, *small), small, 0});
  auto reply = next_envelope(self);
  BOOST_TEST_REQUIRE(reply.has_value());
  BOOST_TEST((std::get<wire::push>(reply->msg) == make_push(1, *small)));

  // 64 MiB in 16 MiB chunks: each chunk is a frame, reassembled at the receiver.
  auto large = ramp(std::size_t{16} << 20, 1.0f);
  wire::chunker chunks(make_push(2, *large), std::size_t{16} << 20);
  BOOST_TEST_REQUIRE(chunks.chunk_count() == 4u);
  for (std::size_t i = 0; i < chunks.chunk_count(); ++i)
    self->send(link, envelope{chunks.chunk(i), large, 0});
  std::vector<float> received(large->size(), -1.0f);
  wire::reassembler assembly(std::as_writable_bytes(std::span(received)));
  for (std::size_t i = 0; i < chunks.chunk_count(); ++i) {
    auto part = next_envelope(self);
    BOOST_TEST_REQUIRE(part.has_value());
    const auto& push = std::get<wire::push>(part->msg);
    BOOST_TEST(push.request_id == 2u);
    auto added = assembly.add(push.tensor);
    BOOST_TEST_REQUIRE(added.has_value());
  }
  BOOST_TEST(assembly.complete());
  BOOST_TEST(std::memcmp(received.data(), large->data(), large->size() * sizeof(float)) == 0);
}

BOOST_AUTO_TEST_CASE(many_frames_of_mixed_sizes_arrive_in_the_order_they_were_sent) {
  auto server = start_server();
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self);
  auto values = ramp(std::size_t{1} << 18);
  // Tiny, just above the encoder's copy threshold with a partial last word, and 1 MiB: big
  // frames must not be overtaken by the small ones queued behind them.
  const std::size_t sizes[] = {2, 1025, 70001, std::size_t{1} << 18};
  constexpr std::uint64_t count = 400;
  for (std::uint64_t id = 1; id <= count; ++id)
    self->send(link, envelope{make_push(id, std::span(*values).first(sizes[id % 4])), values, 0});
  for (std::uint64_t id = 1; id <= count; ++id) {
    auto reply = next_envelope(self);
    BOOST_TEST_REQUIRE(reply.has_value());
    const auto& push = std::get<wire::push>(reply->msg);
    BOOST_TEST_REQUIRE(push.request_id == id);
    BOOST_TEST_REQUIRE((push == make_push(id, std::span(*values).first(sizes[id % 4]))));
  }
}

BOOST_AUTO_TEST_CASE(a_malformed_frame_gets_an_error_reply_and_the_server_keeps_serving) {
  auto server = start_server();
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self);

  raw_peer hostile(server.port);
  BOOST_TEST_REQUIRE(hostile.connected);
  wire::barrier bad_group;
  bad_group.request_id = 7;
  bad_group.group = 0;
  BOOST_TEST_REQUIRE(hostile.send(wire::encode(bad_group).flatten()));
  auto reply = hostile.receive_frame();
  const auto* error = as_error(reply);
  BOOST_TEST_REQUIRE(error != nullptr);
  BOOST_TEST((error->code == wire::error_code::bad_frame));
  BOOST_TEST(error->message.find("barrier group") != std::string::npos);

  // The same connection still works...
  auto values = ramp(2000);
  BOOST_TEST_REQUIRE(hostile.send(wire::encode(make_push(8, *values)).flatten()));
  auto echoed = hostile.receive_frame();
  BOOST_TEST_REQUIRE(echoed.has_value());
  BOOST_TEST((std::get<wire::push>(*echoed) == make_push(8, *values)));
  // ...and so does every other.
  self->send(link, envelope{make_push(9, *values), values, 0});
  auto other = next_envelope(self);
  BOOST_TEST_REQUIRE(other.has_value());
  BOOST_TEST(std::get<wire::push>(other->msg).request_id == 9u);
  hostile.close();
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(an_oversized_or_lying_length_closes_only_that_connection) {
  auto server = start_server();
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self);

  {
    raw_peer hostile(server.port);
    BOOST_TEST_REQUIRE(hostile.connected);
    BOOST_TEST_REQUIRE(hostile.send_prefix(std::uint64_t{1} << 40)); // 1 TiB: above the cap
    auto reply = hostile.receive_frame();
    const auto* error = as_error(reply);
    BOOST_TEST_REQUIRE(error != nullptr);
    BOOST_TEST((error->code == wire::error_code::bad_frame));
    BOOST_TEST(error->message.find("frame_too_large") != std::string::npos);
    BOOST_TEST(hostile.sees_close());
  }
  {
    // A length the segment table contradicts: the stream cannot be trusted after it.
    raw_peer liar(server.port);
    BOOST_TEST_REQUIRE(liar.connected);
    auto flat = wire::encode(wire::ack{1}).flatten();
    std::vector<std::byte> lying(flat.begin(), flat.begin() + 24);
    lying[0] = std::byte{16};
    BOOST_TEST_REQUIRE(liar.send(lying));
    auto reply = liar.receive_frame();
    const auto* error = as_error(reply);
    BOOST_TEST_REQUIRE(error != nullptr);
    BOOST_TEST(liar.sees_close());
  }
  // Each closed connection is reported once, with its own id.
  auto closed = await_disconnects(2);
  BOOST_TEST_REQUIRE(closed.size() == 2u);
  BOOST_TEST(closed[0] != closed[1]);

  // The well-behaved link was not touched.
  auto values = ramp(100);
  self->send(link, envelope{make_push(3, *values), values, 0});
  auto reply = next_envelope(self);
  BOOST_TEST_REQUIRE(reply.has_value());
  BOOST_TEST(std::get<wire::push>(reply->msg).request_id == 3u);
}

BOOST_AUTO_TEST_CASE(a_request_nobody_handles_is_answered_with_unsupported) {
  data_server_options options;
  options.route = [](const envelope&) { return caf::actor{}; };
  auto server = start_server(std::move(options));
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self);
  self->send(link, envelope{wire::pull_request{41, 5, 0, 0}, nullptr, 0});
  auto reply = next_envelope(self);
  BOOST_TEST_REQUIRE(reply.has_value());
  const auto& error = std::get<wire::error_reply>(reply->msg);
  BOOST_TEST(error.request_id == 41u);
  BOOST_TEST((error.key == std::optional<std::uint64_t>{5}));
  BOOST_TEST((error.code == wire::error_code::unsupported));
}

BOOST_AUTO_TEST_CASE(a_reply_for_a_closed_connection_is_dropped_and_serving_goes_on) {
  auto server = start_server();
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self);
  self->send(server.broker, envelope{wire::ack{1}, nullptr, 12345});
  self->send(link, envelope{wire::ack{2}, nullptr, 0});
  auto reply = next_envelope(self);
  BOOST_TEST_REQUIRE(reply.has_value());
  BOOST_TEST(std::get<wire::ack>(reply->msg).request_id == 2u);
}

BOOST_AUTO_TEST_CASE(a_frame_above_the_cap_is_refused_locally_with_an_error_reply) {
  auto server = start_server();
  caf::scoped_actor self{*sys};
  data_link_options options;
  options.tuning.limits.max_frame_bytes = std::size_t{1} << 20;
  auto link = connect(server.port, self, options);
  auto values = ramp(std::size_t{1} << 19); // 2 MiB
  self->send(link, envelope{make_push(77, *values), values, 0});
  auto reply = next_envelope(self);
  BOOST_TEST_REQUIRE(reply.has_value());
  const auto& error = std::get<wire::error_reply>(reply->msg);
  BOOST_TEST(error.request_id == 77u);
  BOOST_TEST((error.code == wire::error_code::internal));
  BOOST_TEST(error.message.find("max_frame_bytes") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_client_sees_link_down_when_the_server_stops) {
  auto server = start_server();
  caf::scoped_actor self{*sys};
  connect(server.port, self);
  self->send(server.broker, stop_atom::value);
  std::string reason;
  self->receive([&](link_down_atom, std::uint64_t, const std::string& why) { reason = why; },
                caf::after(patience) >> [] {});
  BOOST_TEST(reason.find("127.0.0.1:" + std::to_string(server.port)) != std::string::npos);
}

BOOST_AUTO_TEST_CASE(connecting_to_a_closed_port_fails_with_an_error_naming_host_and_port) {
  // A port that was free a moment ago: bind, read it, close.
  int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(probe, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  ::getsockname(probe, reinterpret_cast<sockaddr*>(&address), &length);
  const std::uint16_t port = ntohs(address.sin_port);
  ::close(probe);

  caf::scoped_actor self{*sys};
  auto link = connect_data_link(*sys, "127.0.0.1", port, caf::actor_cast<caf::actor>(self));
  BOOST_TEST_REQUIRE(!link.has_value());
  BOOST_TEST((link.error().code() == errc::peer_lost));
  BOOST_TEST(link.error().message().find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
}

BOOST_AUTO_TEST_CASE(spawning_a_server_without_a_route_is_a_caller_error) {
  auto server = spawn_data_server(*sys, "127.0.0.1", 0, {});
  BOOST_TEST_REQUIRE(!server.has_value());
  BOOST_TEST((server.error().code() == errc::invalid_argument));
}

BOOST_AUTO_TEST_SUITE_END()

// ================================================================================================
// The same-host fast path (actors/shm_arena.hpp): the ring and the mappings alone, the codec's
// checks of a reference, then both brokers over loopback, which share this host.

namespace {

/// Collects a broker's log lines (they come from the middleman's thread).
struct log_sink {
  std::function<void(std::string_view)> writer() {
    return [lines = lines](std::string_view line) {
      std::lock_guard<std::mutex> guard{lines->first};
      lines->second.emplace_back(line);
    };
  }
  /// Waits up to `patience` for a line containing `fragment`.
  bool await(const std::string& fragment) {
    const auto until = std::chrono::steady_clock::now() + patience;
    while (std::chrono::steady_clock::now() < until) {
      {
        std::lock_guard<std::mutex> guard{lines->first};
        for (const auto& line : lines->second)
          if (line.find(fragment) != std::string::npos)
            return true;
      }
      std::this_thread::sleep_for(2ms);
    }
    return false;
  }
  std::shared_ptr<std::pair<std::mutex, std::vector<std::string>>> lines =
      std::make_shared<std::pair<std::mutex, std::vector<std::string>>>();
};

data_link_tuning shm_tuning(std::size_t arena_bytes, log_sink& sink) {
  data_link_tuning tuning;
  tuning.shm_arena_bytes = arena_bytes;
  tuning.log = sink.writer();
  return tuning;
}

constexpr std::string_view fast_path_on = "go through shared memory";

} // namespace

BOOST_AUTO_TEST_SUITE(shm_arena_alone)

BOOST_AUTO_TEST_CASE(the_ring_reclaims_only_the_released_prefix_and_wraps_early) {
  auto created = shm_send_arena::create(std::size_t{1} << 20);
  BOOST_TEST_REQUIRE(created.has_value());
  auto& ring = **created;
  BOOST_TEST(is_arena_name(ring.name()));
  BOOST_TEST(testing::arena_files().count(ring.name().substr(1)) == 1u);
  constexpr std::size_t third = 300 * 1024; // a multiple of the 64-byte alignment
  BOOST_TEST((ring.allocate(third) == std::optional<std::size_t>{0}));
  BOOST_TEST((ring.allocate(third) == std::optional<std::size_t>{third}));
  BOOST_TEST((ring.allocate(third) == std::optional<std::size_t>{2 * third}));
  BOOST_TEST(!ring.allocate(third).has_value()); // full: the caller sends inline
  BOOST_TEST(ring.release(third));               // out of order: nothing is reclaimed yet
  BOOST_TEST(!ring.release(third));              // each region once
  BOOST_TEST(!ring.release(12345));              // not a region
  BOOST_TEST(ring.outstanding() == 3u);
  BOOST_TEST(!ring.allocate(third).has_value());
  BOOST_TEST(ring.release(0)); // now the prefix [0, 2 * third) goes
  BOOST_TEST(ring.outstanding() == 1u);
  // The start is free again: the next regions go there, before the end of the arena is used.
  BOOST_TEST((ring.allocate(third) == std::optional<std::size_t>{0}));
  BOOST_TEST((ring.allocate(third) == std::optional<std::size_t>{third}));
  BOOST_TEST(!ring.allocate(1).has_value()); // up to the region still in use
  BOOST_TEST(ring.release(2 * third));
  BOOST_TEST(ring.release(0));
  BOOST_TEST(ring.release(third));
  BOOST_TEST(ring.outstanding() == 0u);
  BOOST_TEST((ring.allocate(std::size_t{1} << 20) == std::optional<std::size_t>{0}));
  BOOST_TEST(!ring.allocate((std::size_t{1} << 20) + 1).has_value());
  ring.unlink();
  BOOST_TEST(testing::arena_files().count(ring.name().substr(1)) == 0u);
}

BOOST_AUTO_TEST_CASE(the_peer_maps_read_only_and_releases_wake_the_broker_once_per_batch) {
  auto created = shm_send_arena::create(std::size_t{64} << 10);
  BOOST_TEST_REQUIRE(created.has_value());
  auto& ring = **created;
  auto region = ring.allocate(4096);
  BOOST_TEST_REQUIRE(region.has_value());
  std::memset(ring.bytes().data() + *region, 0x5a, 4096);

  BOOST_TEST(!shm_peer_arena::open("/etc-passwd", 4096).has_value());
  BOOST_TEST(!shm_peer_arena::open(ring.name(), std::size_t{1} << 20).has_value()); // too big
  auto peer = shm_peer_arena::open(ring.name(), ring.size());
  BOOST_TEST_REQUIRE(peer.has_value());
  BOOST_TEST(((*peer)->bytes()[*region + 4095] == std::byte{0x5a}));
  ring.unlink(); // the mappings outlive the name

  int wakes = 0;
  (*peer)->on_release([&] { ++wakes; });
  auto first = (*peer)->hold(*region);
  auto second = (*peer)->hold(128);
  first.reset();
  second.reset();
  BOOST_TEST(wakes == 1); // one wake while the queue was not empty
  BOOST_TEST(((*peer)->take_releases() == std::vector<std::uint64_t>{*region, 128}));
  (*peer)->detach();
  (*peer)->hold(0).reset();
  BOOST_TEST((*peer)->take_releases().empty());
  BOOST_TEST(wakes == 1);
}

BOOST_AUTO_TEST_CASE(the_codec_checks_a_reference_against_the_arena_it_is_given) {
  std::vector<std::uint64_t> arena_words(1024); // 8 KiB
  auto arena = std::as_bytes(std::span(arena_words));
  for (std::size_t i = 0; i < arena_words.size(); ++i)
    arena_words[i] = i;
  auto values = ramp(1024); // 4 KiB: data is only used for the size
  auto push = make_push(5, *values);
  auto decode_with = [&](wire::shm_ref ref, std::span<const std::byte> mapped) {
    push.tensor.shm = ref;
    auto flat = wire::encode(push).flatten();
    return wire::decode(flat, {}, mapped);
  };
  auto inside = decode_with({4096, 4096}, arena);
  BOOST_TEST_REQUIRE(inside.has_value());
  const auto& got = std::get<wire::push>(inside->msg).tensor;
  BOOST_TEST(got.data.data() == arena.data() + 4096); // a view, no copy
  BOOST_TEST((got.shm == std::optional<wire::shm_ref>{wire::shm_ref{4096, 4096}}));

  auto outside = decode_with({8192, 4096}, arena);
  BOOST_TEST_REQUIRE(!outside.has_value());
  BOOST_TEST((outside.error().kind == wire::decode_error::code::invalid_tensor));
  BOOST_TEST(outside.error().message.find("[8192, +4096) outside the arena of 8192 bytes") !=
             std::string::npos);
  auto wrapping = decode_with({~std::uint64_t{0} - 7, 4096}, arena);
  BOOST_TEST_REQUIRE(!wrapping.has_value());
  BOOST_TEST(wrapping.error().message.find("outside the arena") != std::string::npos);
  auto misaligned = decode_with({4, 4096}, arena);
  BOOST_TEST_REQUIRE(!misaligned.has_value());
  BOOST_TEST(misaligned.error().message.find("not aligned") != std::string::npos);
  auto no_arena = decode_with({0, 4096}, {});
  BOOST_TEST_REQUIRE(!no_arena.has_value());
  BOOST_TEST(no_arena.error().message.find("no arena") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(shm_fast_path, link_fixture)

namespace {

/// Answers every push with itself, its round set to 1 when it arrived through shared memory.
caf::actor spawn_tagging_echo(caf::actor_system& sys, std::vector<caf::actor>& spawned) {
  auto echo = sys.spawn(
      [](caf::event_based_actor* self, int) -> caf::behavior {
        return {[=](envelope& request, caf::actor& reply_to) {
          if (auto* push = std::get_if<wire::push>(&request.msg))
            push->round = push->tensor.shm ? 1 : 0;
          self->send(reply_to, std::move(request));
        }};
      },
      0);
  spawned.push_back(echo);
  return echo;
}

/// `sent` as the tagging echo answers it.
wire::push tagged(wire::push sent, std::uint64_t round) {
  sent.round = round;
  return sent;
}

} // namespace

BOOST_AUTO_TEST_CASE(tensors_round_trip_bit_exact_through_a_wrapping_ring_and_inline_when_full) {
  const auto before = testing::arena_files();
  log_sink server_log, client_log;
  data_server_options server_options;
  auto echo = spawn_tagging_echo(*sys, spawned);
  server_options.route = [echo](const envelope&) { return echo; };
  server_options.tuning = shm_tuning(std::size_t{1} << 20, server_log);
  auto server = start_server(std::move(server_options));
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self, {shm_tuning(std::size_t{1} << 20, client_log)});
  BOOST_TEST_REQUIRE(client_log.await(std::string(fast_path_on)));
  BOOST_TEST_REQUIRE(server_log.await(std::string(fast_path_on)));
  // Both arenas are mapped by both ends now: their names are gone from /dev/shm.
  BOOST_TEST((testing::arena_files() == before));

  // Below the threshold, just above it with a partial last word, and 256 KiB; 400 in flight
  // through 1 MiB arenas: the rings wrap many times and fill up, and then frames go inline.
  auto values = ramp(std::size_t{1} << 16);
  const std::size_t sizes[] = {2, 1025, 16385, std::size_t{1} << 16};
  constexpr std::uint64_t count = 400;
  for (std::uint64_t id = 1; id <= count; ++id)
    self->send(link, envelope{make_push(id, std::span(*values).first(sizes[id % 4])), values, 0});
  std::size_t up_shm = 0, down_shm = 0, big = 0;
  for (std::uint64_t id = 1; id <= count; ++id) {
    auto reply = next_envelope(self);
    BOOST_TEST_REQUIRE(reply.has_value());
    const auto& push = std::get<wire::push>(reply->msg);
    BOOST_TEST_REQUIRE(push.request_id == id);
    const auto expected = std::span(*values).first(sizes[id % 4]);
    BOOST_TEST_REQUIRE(push.tensor.data.size() == expected.size_bytes());
    BOOST_TEST_REQUIRE(
        std::memcmp(push.tensor.data.data(), expected.data(), expected.size_bytes()) == 0);
    const bool above = expected.size_bytes() >= default_shm_threshold_bytes;
    big += above;
    up_shm += push.round == 1;
    down_shm += push.tensor.shm.has_value();
    BOOST_TEST_REQUIRE((above || (push.round == 0 && !push.tensor.shm)));
  }
  BOOST_TEST_MESSAGE("through shared memory: " << up_shm << " of " << big << " up, " << down_shm
                                               << " down");
  BOOST_TEST(up_shm > 0u);
  BOOST_TEST(down_shm > 0u);
  BOOST_TEST(up_shm + down_shm > 4u); // 1 MiB holds four 256 KiB regions: the rings wrapped

  // Held replies keep the server's regions: it falls back to inline frames, never waits...
  std::vector<envelope> held;
  bool went_inline = false;
  for (std::uint64_t id = 1000; id < 1016 && !went_inline; ++id) {
    self->send(link, envelope{make_push(id, *values), values, 0});
    auto reply = next_envelope(self);
    BOOST_TEST_REQUIRE(reply.has_value());
    const auto& push = std::get<wire::push>(reply->msg);
    BOOST_TEST_REQUIRE((push == tagged(make_push(id, *values), push.round)));
    went_inline = !push.tensor.shm;
    held.push_back(std::move(*reply));
  }
  BOOST_TEST_REQUIRE(went_inline);
  // ...and takes them back once released.
  held.clear();
  bool back_to_shm = false;
  for (std::uint64_t id = 2000; id < 2200 && !back_to_shm; ++id) {
    self->send(link, envelope{make_push(id, *values), values, 0});
    auto reply = next_envelope(self);
    BOOST_TEST_REQUIRE(reply.has_value());
    const auto& push = std::get<wire::push>(reply->msg);
    BOOST_TEST_REQUIRE((push == tagged(make_push(id, *values), push.round)));
    back_to_shm = std::get<wire::push>(reply->msg).tensor.shm.has_value();
    if (!back_to_shm)
      std::this_thread::sleep_for(1ms);
  }
  BOOST_TEST(back_to_shm);
  self->send(link, stop_atom::value);
  BOOST_TEST(await_disconnects(1).size() == 1u);
  BOOST_TEST((testing::arena_files() == before));
}

BOOST_AUTO_TEST_CASE(with_the_arena_off_at_either_end_tensors_go_through_the_socket) {
  const auto before = testing::arena_files();
  for (bool client_off : {true, false}) {
    log_sink server_log, client_log;
    data_server_options server_options;
    auto echo = spawn_tagging_echo(*sys, spawned);
    server_options.route = [echo](const envelope&) { return echo; };
    server_options.tuning = shm_tuning(client_off ? std::size_t{1} << 20 : 0, server_log);
    auto server = start_server(std::move(server_options));
    caf::scoped_actor self{*sys};
    auto link =
        connect(server.port, self, {shm_tuning(client_off ? 0 : std::size_t{1} << 20, client_log)});
    auto values = ramp(std::size_t{1} << 16);
    for (std::uint64_t id = 1; id <= 20; ++id) {
      self->send(link, envelope{make_push(id, *values), values, 0});
      auto reply = next_envelope(self);
      BOOST_TEST_REQUIRE(reply.has_value());
      const auto& push = std::get<wire::push>(reply->msg);
      BOOST_TEST_REQUIRE((push == tagged(make_push(id, *values), 0)));
      BOOST_TEST_REQUIRE(!push.tensor.shm);
    }
    BOOST_TEST((testing::arena_files() == before));
    self->send(link, stop_atom::value);
    BOOST_TEST(await_disconnects(1).size() == 1u);
  }
}

BOOST_AUTO_TEST_CASE(a_reference_outside_the_arena_gets_bad_frame_naming_it_and_serving_goes_on) {
  auto server = start_server();
  raw_peer peer(server.port);
  BOOST_TEST_REQUIRE(peer.connected);
  // The handshake by hand: hello, the server's hello and offer, our offer and its accept.
  BOOST_TEST_REQUIRE(peer.send(wire::encode(wire::link_hello{host_identity(), 1 << 20}).flatten()));
  auto hello = peer.receive_frame();
  BOOST_TEST_REQUIRE((hello && std::holds_alternative<wire::link_hello>(*hello)));
  BOOST_TEST(std::get<wire::link_hello>(*hello).host_id == host_identity());
  auto offer = peer.receive_frame();
  BOOST_TEST_REQUIRE((offer && std::holds_alternative<wire::arena_offer>(*offer)));
  auto ours = shm_send_arena::create(std::size_t{1} << 20);
  BOOST_TEST_REQUIRE(ours.has_value());
  BOOST_TEST_REQUIRE(
      peer.send(wire::encode(wire::arena_offer{(*ours)->name(), (*ours)->size()}).flatten()));
  auto accept = peer.receive_frame();
  BOOST_TEST_REQUIRE((accept && std::holds_alternative<wire::arena_accept>(*accept)));
  BOOST_TEST(std::get<wire::arena_accept>(*accept).ok,
             std::get<wire::arena_accept>(*accept).detail);
  (*ours)->unlink();

  auto values = ramp(1024);
  auto push = make_push(11, *values);
  push.tensor.shm = wire::shm_ref{std::uint64_t{2} << 20, values->size() * sizeof(float)};
  BOOST_TEST_REQUIRE(peer.send(wire::encode(push).flatten()));
  auto reply = peer.receive_frame();
  const auto* error = as_error(reply);
  BOOST_TEST_REQUIRE(error != nullptr);
  BOOST_TEST((error->code == wire::error_code::bad_frame));
  BOOST_TEST(error->message.find("[2097152, +4096) outside the arena of 1048576 bytes") !=
                 std::string::npos,
             error->message);

  // A good reference on the same connection is echoed (inline: we never accepted the server's
  // arena), and its region comes back in an arena_release once the echo is written.
  std::memcpy((*ours)->bytes().data() + 4096, values->data(), 4096);
  push = make_push(12, *values);
  push.tensor.shm = wire::shm_ref{4096, 4096};
  BOOST_TEST_REQUIRE(peer.send(wire::encode(push).flatten()));
  auto echoed = peer.receive_frame();
  BOOST_TEST_REQUIRE((echoed && std::holds_alternative<wire::push>(*echoed)));
  BOOST_TEST((std::get<wire::push>(*echoed) == make_push(12, *values)));
  auto release = peer.receive_frame();
  BOOST_TEST_REQUIRE((release && std::holds_alternative<wire::arena_release>(*release)));
  BOOST_TEST((std::get<wire::arena_release>(*release).offsets == std::vector<std::uint64_t>{4096}));
  peer.close();
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_SUITE_END()

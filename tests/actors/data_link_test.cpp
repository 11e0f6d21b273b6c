// actors/data_link: the framing classes without a network, then the server and client brokers
// over loopback inside one process (an actor system with the middleman; a raw socket plays the
// hostile peer). Every wait is bounded: a broken data path fails a check, it never hangs.

#include <algorithm>
#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <netinet/in.h>
#include <numeric>
#include <optional>
#include <poll.h>
#include <sched.h>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <variant>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/config/tls_credentials.hpp"
#include "actors/data_link.hpp"
#include "actors/logic/data_link_framing.hpp"
#include "actors/logic/node_identity.hpp"
#include "actors/logic/shm_arena.hpp"
#include "actors/server_node.hpp"
#include "schema/chunking.hpp"
#include "tests/listening_socket.hpp"
#include "tests/poll.hpp"
#include "tests/raw_peer.hpp"
#include "tests/shm_files.hpp"
#include "tests/stderr_capture.hpp"
#include "tests/tcp_sockets.hpp"
#include "tests/tls_certs.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::testing::raw_peer;
using troupe::testing::stderr_capture;

namespace {

// Every wait for something that must happen: generous, for a loaded machine under a sanitizer
// (it is what a failing case waits before it says so; a passing one waits only as long as needed).
constexpr auto patience = 30s;

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

/// Receives `sent`, then another frame, and checks that the first frame's buffer stayed with its
/// envelope meanwhile (not back in the pool, where the next frame would overwrite what the
/// message views) and went back to the pool with it.
void check_buffer_stays_with_envelope(const wire::message& sent) {
  auto pool = std::make_shared<receive_buffer_pool>(std::size_t{1} << 20);
  frame_receiver receiver(pool, {});
  std::vector<char> scribe_buffer;
  auto out = feed(receiver, scribe_buffer, wire::encode(sent).flatten());
  BOOST_TEST_REQUIRE(out.frame.has_value());
  BOOST_TEST_REQUIRE(out.frame->keepalive != nullptr);
  BOOST_TEST(pool->stats().cached_buffers == 0u);
  auto next = wire::encode(make_push(7, *ramp(1024, 100.0f))).flatten();
  auto other = feed(receiver, scribe_buffer, next);
  BOOST_TEST_REQUIRE(other.frame.has_value());
  BOOST_TEST((out.frame->msg == sent));
  out.frame.reset();
  BOOST_TEST(pool->stats().cached_buffers == 1u);
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
          return {[=](envelope& request, const reply_sink& reply_to) {
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
      options.route = [echo](const envelope&) { return caf::actor_cast<request_handler>(echo); };
    }
    options.route = [route = std::move(options.route), seen = last_connection](const envelope& e) {
      seen->store(e.connection);
      return route(e);
    };
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

  /// A push of `values` with `id` sent on `link` comes back from the echoing server unchanged.
  static void expect_round_trip(caf::scoped_actor& self, const caf::actor& link, std::uint64_t id,
                                const std::shared_ptr<std::vector<float>>& values) {
    self->send(link, envelope{make_push(id, *values), values, 0});
    auto reply = next_envelope(self);
    BOOST_TEST_REQUIRE(reply.has_value());
    BOOST_TEST_REQUIRE(std::holds_alternative<wire::push>(reply->msg));
    BOOST_TEST((std::get<wire::push>(reply->msg) == make_push(id, *values)));
  }

  /// A push of `values` with `id`, sent on `link` in chunks of `chunk_bytes` (one frame each),
  /// comes back from the echoing server whole and byte-identical. Returns the number of chunks.
  static std::size_t expect_chunked_round_trip(caf::scoped_actor& self, const caf::actor& link,
                                               std::uint64_t id,
                                               const std::shared_ptr<std::vector<float>>& values,
                                               std::size_t chunk_bytes) {
    wire::chunker chunks(make_push(id, *values), chunk_bytes);
    for (std::size_t i = 0; i < chunks.chunk_count(); ++i)
      self->send(link, envelope{chunks.chunk(i), values, 0});
    std::vector<float> received(values->size(), -1.0f);
    wire::reassembler assembly(std::as_writable_bytes(std::span(received)));
    for (std::size_t i = 0; i < chunks.chunk_count(); ++i) {
      auto part = next_envelope(self);
      BOOST_TEST_REQUIRE(part.has_value());
      const auto& push = std::get<wire::push>(part->msg);
      BOOST_TEST(push.request_id == id);
      BOOST_TEST_REQUIRE(assembly.add(push.tensor).has_value());
    }
    BOOST_TEST(assembly.complete());
    BOOST_TEST(std::memcmp(received.data(), values->data(), values->size() * sizeof(float)) == 0);
    return chunks.chunk_count();
  }

  /// The echoes of pushes 1 to `count`, push `id` carrying the first sizes[id % sizes.size()] of
  /// `values`: all of them, in that order, unchanged.
  static void expect_mixed_echoes_in_order(caf::scoped_actor& self,
                                           const std::vector<float>& values,
                                           std::span<const std::size_t> sizes,
                                           std::uint64_t count) {
    for (std::uint64_t id = 1; id <= count; ++id) {
      auto reply = next_envelope(self);
      BOOST_TEST_REQUIRE(reply.has_value());
      const auto& push = std::get<wire::push>(reply->msg);
      BOOST_TEST_REQUIRE(push.request_id == id);
      BOOST_TEST_REQUIRE(
          (push == make_push(id, std::span(values).first(sizes[id % sizes.size()]))));
    }
  }

  /// The server's id of `link`'s connection: one tiny push echoed (the route records it).
  std::uint64_t await_connection(caf::scoped_actor& self, const caf::actor& link) {
    auto one = std::make_shared<std::vector<float>>(1, 1.0f);
    self->send(link, envelope{make_push(0, *one), one, 0});
    auto reply = next_envelope(self);
    BOOST_TEST_REQUIRE(reply.has_value());
    return last_connection->load();
  }

  /// A client link's state.
  data_link_stats stats_of(const caf::actor& link) {
    data_link_stats got;
    (*watcher)
        ->request(link, patience, stats_atom::value)
        .receive([&](const data_link_stats& s) { got = s; },
                 [&](const caf::error& e) { BOOST_TEST_MESSAGE("no stats: " << sys->render(e)); });
    return got;
  }
  /// The state of a server's connection `id`.
  data_link_stats stats_of(const data_server& server, std::uint64_t id) {
    data_link_stats got;
    (*watcher)
        ->request(server.broker, patience, stats_atom::value, id)
        .receive([&](const data_link_stats& s) { got = s; },
                 [&](const caf::error& e) { BOOST_TEST_MESSAGE("no stats: " << sys->render(e)); });
    return got;
  }
  /// Asks `ask` for stats until `wanted` holds them, for up to `patience`; the last answer.
  static data_link_stats await_stats(const std::function<data_link_stats()>& ask,
                                     const std::function<bool(const data_link_stats&)>& wanted) {
    const auto until = std::chrono::steady_clock::now() + patience;
    auto got = ask();
    while (!wanted(got) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(2ms);
      got = ask();
    }
    return got;
  }

  /// The ids of the next `count` connections the servers report closed (fewer on timeout).
  /// Tests whose raw peers go away wait for this: CAF 0.17.6 leaks a connection that is still
  /// being closed when the actor system shuts down.
  std::vector<std::uint64_t> await_disconnects(std::size_t count) {
    return await_disconnects(count, patience);
  }
  template <class Duration>
  std::vector<std::uint64_t> await_disconnects(std::size_t count, Duration wait) {
    std::vector<std::uint64_t> ids;
    for (std::size_t i = 0; i < count; ++i)
      (*watcher)->receive([&](peer_lost_atom, std::uint64_t id) { ids.push_back(id); },
                          caf::after(wait) >> [] {});
    return ids;
  }

  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  /// Receives (peer_lost_atom, connection id) from every server's on_disconnect.
  std::unique_ptr<caf::scoped_actor> watcher;
  std::vector<caf::actor> spawned;
  /// The connection id of the last request any server routed.
  std::shared_ptr<std::atomic<std::uint64_t>> last_connection =
      std::make_shared<std::atomic<std::uint64_t>>(0);
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
  // Nothing goes before the peer's hello has told its window (0 here: no flow control).
  BOOST_TEST(!queue.ready());
  BOOST_TEST(queue.append_to(out, 1000) == 0u);
  queue.open(0);
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

BOOST_AUTO_TEST_CASE(a_batch_keeps_its_buffer_while_its_tensors_are_in_use) {
  auto values = ramp(1024);
  const wire::batch sent{{make_push(3, *values), wire::pull_request{8, 4}, make_push(5, *values)}};
  // The buffer stays with the envelope, which its tensors view.
  check_buffer_stays_with_envelope(sent);
}

BOOST_AUTO_TEST_CASE(a_row_sparse_pull_keeps_its_buffer_while_its_row_ids_are_in_use) {
  // Its row ids view the frame, as a tensor would, though it has none: given back at once, the
  // buffer would hold the next frame's bytes when the shard reads the ids (two workers pulling
  // from one server saw their ids out of order).
  std::vector<std::int64_t> rows(512);
  for (std::size_t i = 0; i < rows.size(); ++i)
    rows[i] = static_cast<std::int64_t>(3 * i);
  wire::pull_request sent{8, 4, 0, 1, 0};
  sent.row_sparse = true;
  sent.row_ids = std::as_bytes(std::span{rows});
  check_buffer_stays_with_envelope(sent);
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

// ================================================================================================
// Receive credit without a network: the sender's queue and the receiver's window.

BOOST_AUTO_TEST_SUITE(link_credit_alone)

namespace {

std::vector<char> flat_chars(const wire::encoded_frame& frame) {
  auto flat = frame.flatten();
  return {reinterpret_cast<const char*>(flat.data()),
          reinterpret_cast<const char*>(flat.data()) + flat.size()};
}

/// Appends everything the queue has admitted.
std::vector<char> drain(frame_send_queue& queue) {
  std::vector<char> out;
  while (queue.ready())
    queue.append_to(out, std::size_t{1} << 20);
  return out;
}

} // namespace

BOOST_AUTO_TEST_CASE(the_send_queue_waits_for_the_window_and_admits_frames_as_credit_returns) {
  auto values = ramp(4000);
  const std::size_t frame = wire::encode(make_push(1, *values)).size();
  const std::uint64_t window = 4 * frame + 100; // four frames and a little
  frame_send_queue queue;
  std::vector<char> expected;
  for (std::uint64_t id = 1; id <= 10; ++id) {
    auto bytes = flat_chars(wire::encode(make_push(id, *values)));
    expected.insert(expected.end(), bytes.begin(), bytes.end());
    queue.push(wire::encode(make_push(id, *values)), values);
  }
  BOOST_TEST(queue.waiting_frames() == 10u); // nothing before the peer's hello
  queue.open(window);
  BOOST_TEST(queue.waiting_frames() == 6u);
  BOOST_TEST(queue.outstanding() == 4 * frame);
  std::vector<char> out = drain(queue);
  BOOST_TEST(out.size() == 4 * frame);

  // Room for less than a frame, with more than a quantum outstanding: still waiting.
  BOOST_TEST(!queue.credit(frame - 200).has_value());
  BOOST_TEST(queue.waiting_frames() == 6u);
  BOOST_TEST(!queue.ready());
  // Room for exactly one frame.
  BOOST_TEST(!queue.credit(300).has_value());
  BOOST_TEST(queue.waiting_frames() == 5u);
  BOOST_TEST(queue.outstanding() == 4 * frame - 100);

  // A credit of more than is outstanding, or of nothing, breaks the protocol and changes nothing.
  auto excess = queue.credit(10 * frame);
  BOOST_TEST_REQUIRE(excess.has_value());
  BOOST_TEST(excess->find("link credit of " + std::to_string(10 * frame) + " bytes, with " +
                          std::to_string(4 * frame - 100) + " bytes outstanding") !=
                 std::string::npos,
             *excess);
  BOOST_TEST(queue.credit(0).has_value());
  BOOST_TEST(queue.outstanding() == 4 * frame - 100);
  BOOST_TEST(queue.waiting_frames() == 5u);

  // Everything credited, again and again: the rest flows, every byte in order.
  while (!queue.empty()) {
    auto more = drain(queue);
    out.insert(out.end(), more.begin(), more.end());
    BOOST_TEST_REQUIRE(!queue.credit(queue.outstanding()).has_value());
  }
  BOOST_TEST((out == expected));
  BOOST_TEST(queue.credited() == 10 * frame);
}

BOOST_AUTO_TEST_CASE(a_frame_larger_than_the_window_goes_once_less_than_a_quantum_is_outstanding) {
  auto big = ramp(std::size_t{1} << 16); // 256 KiB
  auto tiny = ramp(4);
  const std::uint64_t window = std::uint64_t{64} << 10;
  const std::uint64_t quantum = credit_quantum(window);
  BOOST_TEST(quantum == window / 8);
  const std::size_t big_frame = wire::encode(make_push(1, *big)).size();
  const std::size_t tiny_frame = wire::encode(make_push(1, *tiny)).size();
  frame_send_queue queue;
  queue.open(window);
  queue.push(wire::encode(make_push(1, *tiny)), tiny);
  queue.push(wire::encode(make_push(2, *big)), big); // a tiny frame outstanding: it goes
  queue.push(wire::encode(make_push(3, *tiny)), tiny);
  BOOST_TEST(queue.waiting_frames() == 1u);
  BOOST_TEST(queue.outstanding() == tiny_frame + big_frame);
  BOOST_TEST(!queue.credit(big_frame).has_value()); // a tiny frame outstanding again: it goes
  BOOST_TEST(queue.waiting_frames() == 0u);
  queue.push(wire::encode(make_push(4, *big)), big);
  BOOST_TEST(queue.waiting_frames() == 0u);
  queue.push(wire::encode(make_push(5, *big)), big);
  BOOST_TEST(queue.waiting_frames() == 1u);
  // Exactly a quantum outstanding is too much; one byte less lets the big frame go.
  BOOST_TEST(!queue.credit(queue.outstanding() - quantum).has_value());
  BOOST_TEST(queue.waiting_frames() == 1u);
  BOOST_TEST(!queue.credit(1).has_value());
  BOOST_TEST(queue.waiting_frames() == 0u);
  BOOST_TEST(queue.outstanding() == quantum - 1 + big_frame);
}

BOOST_AUTO_TEST_CASE(link_control_overtakes_frames_waiting_for_credit_but_never_splits_a_frame) {
  auto big = ramp(std::size_t{1} << 16);
  frame_send_queue queue;
  queue.open(std::uint64_t{64} << 10);
  queue.push(wire::encode(make_push(1, *big)), big);
  queue.push(wire::encode(make_push(2, *big)), big);
  BOOST_TEST(queue.waiting_frames() == 1u);
  std::vector<char> out;
  BOOST_TEST(queue.append_to(out, 1000) == 1000u); // the first frame is half written...
  const wire::message hello = wire::link_hello{"host", 0, 4096, {}, std::nullopt};
  queue.push_unmetered(wire::encode(hello)); // ...and the control frame goes behind it
  auto rest = drain(queue);
  out.insert(out.end(), rest.begin(), rest.end());
  auto expected = flat_chars(wire::encode(make_push(1, *big)));
  auto control = flat_chars(wire::encode(hello));
  expected.insert(expected.end(), control.begin(), control.end());
  BOOST_TEST((out == expected));
  BOOST_TEST(queue.waiting_frames() == 1u);
  std::weak_ptr<const void> watch = big;
  big.reset();
  queue.drop_waiting(); // a connection that closes: the waiting frame and its tensor go
  BOOST_TEST(queue.empty());
  BOOST_TEST(queue.queued_bytes() == 0u);
  BOOST_TEST(watch.expired());
}

BOOST_AUTO_TEST_CASE(the_receiver_counts_frames_and_credits_them_once_a_quantum_is_released) {
  auto pool = std::make_shared<receive_buffer_pool>(std::size_t{64} << 20);
  const std::uint64_t window = std::uint64_t{64} << 10;
  auto credit = std::make_shared<receive_credit>(window);
  std::atomic<int> wakes{0};
  credit->on_release([&] { ++wakes; });
  frame_receiver receiver(pool, {}, credit);
  std::vector<char> scribe_buffer;
  auto values = ramp(1000);
  const std::size_t frame = wire::encode(make_push(1, *values)).size();
  const std::size_t ack_frame = wire::encode(wire::ack{9}).size();
  std::vector<envelope> held;
  for (std::uint64_t id = 1; id <= 3; ++id) {
    auto out = feed(receiver, scribe_buffer, wire::encode(make_push(id, *values)).flatten());
    BOOST_TEST_REQUIRE(out.frame.has_value());
    // The keepalive still points at the frame buffer the tensor views.
    const auto* buffer = static_cast<const std::vector<char>*>(out.frame->keepalive.get());
    const auto* data =
        reinterpret_cast<const char*>(std::get<wire::push>(out.frame->msg).tensor.data.data());
    BOOST_TEST((data >= buffer->data() && data < buffer->data() + buffer->size()));
    held.push_back(std::move(*out.frame));
  }
  // A frame without a tensor: its buffer goes back to the pool at once, its bytes stay counted
  // until the envelope goes.
  auto ack = feed(receiver, scribe_buffer, wire::encode(wire::ack{9}).flatten());
  BOOST_TEST_REQUIRE(ack.frame.has_value());
  BOOST_TEST(static_cast<bool>(ack.frame->keepalive));
  BOOST_TEST(pool->stats().cached_buffers == 1u);
  held.push_back(std::move(*ack.frame));
  // A link-control frame is not counted.
  auto control = feed(receiver, scribe_buffer, wire::encode(wire::link_credit{5}).flatten());
  BOOST_TEST_REQUIRE(control.frame.has_value());
  BOOST_TEST(!control.frame->keepalive);

  const std::uint64_t total = 3 * frame + ack_frame;
  BOOST_TEST(total >= credit_quantum(window));
  auto stats = credit->stats();
  BOOST_TEST(stats.outstanding == total);
  BOOST_TEST(stats.unreleased == total);
  BOOST_TEST(credit->take() == 0u); // nothing released yet

  // Released on another thread, as a shard would: one wake for the quantum.
  std::thread([&] { held.clear(); }).join();
  BOOST_TEST(wakes.load() == 1);
  stats = credit->stats();
  BOOST_TEST(stats.unreleased == 0u);
  BOOST_TEST(stats.uncredited == total);
  BOOST_TEST(credit->take() == total);
  BOOST_TEST(credit->take() == 0u);
  BOOST_TEST(credit->stats().outstanding == 0u);
  BOOST_TEST(credit->stats().credited == total);

  // Less than a quantum released waits for more (no wake, no credit)...
  auto out = feed(receiver, scribe_buffer, wire::encode(make_push(7, *values)).flatten());
  BOOST_TEST_REQUIRE(out.frame.has_value());
  out.frame.reset();
  BOOST_TEST(wakes.load() == 1);
  BOOST_TEST(credit->take() == 0u);
  BOOST_TEST(credit->stats().uncredited == frame);
  // ...and once the wake is gone (the connection closed) releases only count.
  credit->on_release({});
  for (int i = 0; i < 10; ++i)
    BOOST_TEST(feed(receiver, scribe_buffer, wire::encode(make_push(8, *values)).flatten())
                   .frame.has_value());
  BOOST_TEST(wakes.load() == 1);
  BOOST_TEST(credit->take() == 11 * frame);
}

BOOST_AUTO_TEST_CASE(a_frame_beyond_the_window_is_fatal_and_refused_from_its_prefix_when_large) {
  auto pool = std::make_shared<receive_buffer_pool>(std::size_t{64} << 20);
  auto values = ramp(3000);
  const std::size_t frame = wire::encode(make_push(1, *values)).size();
  const std::uint64_t window = frame + 16; // one such frame and no ack fit
  auto credit = std::make_shared<receive_credit>(window);
  std::vector<char> scribe_buffer;
  std::optional<envelope> held;
  {
    frame_receiver receiver(pool, {}, credit);
    auto out = feed(receiver, scribe_buffer, wire::encode(make_push(1, *values)).flatten());
    BOOST_TEST_REQUIRE(out.frame.has_value());
    held = std::move(out.frame);
  }
  const auto misses = pool->stats().misses;
  {
    // 256 KiB announced: refused from the prefix, nothing allocated for it.
    frame_receiver receiver(pool, {}, credit);
    std::vector<char> prefix(8, 0);
    prefix[2] = 4;
    auto out = receiver.consume(prefix);
    BOOST_TEST(out.fatal());
    BOOST_TEST_REQUIRE(out.error.has_value());
    BOOST_TEST((out.error->kind == wire::decode_error::code::limit_exceeded));
    BOOST_TEST(out.error->message.find("a frame of 262152 bytes arrived beyond the receive window "
                                       "of " +
                                       std::to_string(window) + " bytes (" + std::to_string(frame) +
                                       " bytes outstanding)") != std::string::npos,
               out.error->message);
    BOOST_TEST(pool->stats().misses == misses);
  }
  {
    // A small frame beyond the window is read, since it might be link control; an ack is not.
    frame_receiver receiver(pool, {}, credit);
    auto out = feed(receiver, scribe_buffer, wire::encode(wire::ack{3}).flatten());
    BOOST_TEST(out.fatal());
    BOOST_TEST(!out.frame.has_value());
    BOOST_TEST_REQUIRE(out.error.has_value());
    BOOST_TEST(out.error->message.find("beyond the receive window") != std::string::npos);
  }
  {
    frame_receiver receiver(pool, {}, credit);
    auto out = feed(receiver, scribe_buffer, wire::encode(wire::link_credit{3}).flatten());
    BOOST_TEST_REQUIRE(out.frame.has_value());
    BOOST_TEST(!out.error.has_value());
    BOOST_TEST(credit->stats().outstanding == frame);
  }
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

  expect_round_trip(self, link, 1, ramp(1000, 0.5f));

  // 64 MiB in 16 MiB chunks: each chunk is a frame, reassembled at the receiver.
  BOOST_TEST(expect_chunked_round_trip(self, link, 2, ramp(std::size_t{16} << 20, 1.0f),
                                       std::size_t{16} << 20) == 4u);
}

BOOST_AUTO_TEST_CASE(both_ends_polling_after_each_frame_serve_round_trips_as_without) {
  // data.io_spin_us above 0 (its default is 0): the multiplexers keep polling after each frame.
  data_server_options server_options;
  server_options.tuning.io_spin = std::chrono::microseconds{50};
  auto server = start_server(std::move(server_options));
  caf::scoped_actor self{*sys};
  data_link_options link_options;
  link_options.tuning.io_spin = std::chrono::microseconds{50};
  auto link = connect(server.port, self, std::move(link_options));
  for (std::uint64_t id = 1; id <= 50; ++id)
    expect_round_trip(self, link, id, ramp(1024, static_cast<float>(id)));
  BOOST_TEST(expect_chunked_round_trip(self, link, 99, ramp(std::size_t{1} << 20, 3.0f),
                                       std::size_t{1} << 20) == 4u);
}

/// Acks `request` as a shard lane answers on the server broker's thread: collected there when a
/// collector is in place, else sent.
void ack_on_this_thread(const envelope& request, std::uint64_t request_id, std::uint64_t round,
                        const reply_sink& sink) {
  envelope answer{wire::ack{request_id, round}, nullptr, request.connection};
  if (!reply_collector::collect_here(caf::actor_cast<caf::abstract_actor*>(sink), answer))
    caf::anon_send(sink, std::move(answer));
}

BOOST_AUTO_TEST_CASE(a_batch_is_taken_message_by_message_and_answers_made_together_go_fused) {
  for (const bool fusing : {true, false}) {
    // Pushes answered on the server broker's thread as they are taken, as a shard lane does.
    auto taken = std::make_shared<std::vector<std::uint64_t>>();
    auto taken_lock = std::make_shared<std::mutex>();
    data_server_options options;
    if (!fusing)
      options.tuning.fuse_frame_bytes = 0;
    options.take_request = [taken, taken_lock](envelope& request, const reply_sink& sink) {
      const auto* push = std::get_if<wire::push>(&request.msg);
      if (push == nullptr)
        return false;
      {
        std::lock_guard hold{*taken_lock};
        taken->push_back(push->request_id);
      }
      ack_on_this_thread(request, push->request_id, 7, sink);
      return true;
    };
    auto server = start_server(std::move(options));
    caf::scoped_actor self{*sys};
    auto link = connect(server.port, self);
    auto values = ramp(256);
    wire::batch requests;
    for (std::uint64_t id = 1; id <= 5; ++id)
      requests.messages.push_back(make_push(id, *values));
    const auto before = process_link_tensor_bytes();
    self->send(link, envelope{requests, values, 0});
    std::vector<std::uint64_t> answered;
    std::size_t frames = 0;
    while (answered.size() < 5) {
      auto reply = next_envelope(self);
      BOOST_TEST_REQUIRE(reply.has_value());
      ++frames;
      if (const auto* fused = std::get_if<wire::batch>(&reply->msg)) {
        for (const auto& one : fused->messages)
          answered.push_back(std::get<wire::ack>(one).request_id);
      } else {
        answered.push_back(std::get<wire::ack>(reply->msg).request_id);
      }
    }
    const std::vector<std::uint64_t> in_order{1, 2, 3, 4, 5};
    BOOST_TEST(answered == in_order);
    // Made while one read was handled: one frame, unless fusion is off.
    BOOST_TEST(frames == (fusing ? 1u : 5u));
    // The fused tensors are counted as socket traffic (both ends are in this process).
    const auto after = process_link_tensor_bytes();
    BOOST_TEST(after.socket_sent - before.socket_sent >= 5 * 256 * sizeof(float));
    BOOST_TEST(after.socket_received - before.socket_received >= 5 * 256 * sizeof(float));
    std::lock_guard hold{*taken_lock};
    BOOST_TEST(*taken == in_order);
  }
}

BOOST_AUTO_TEST_CASE(a_batch_of_small_tensors_goes_through_the_arena_and_its_region_comes_back) {
  // 20 pushes of 4 KiB fused: 80 KiB together, above shm_threshold_bytes, so one region of the
  // client's arena holds them and the frame only references it. 1,000 such batches are 80 MB, more
  // than the 64 MiB arena: every one goes through it only if each region is released once the
  // server is done with the batch.
  auto checked = std::make_shared<std::atomic<std::uint64_t>>(0);
  auto wrong = std::make_shared<std::atomic<std::uint64_t>>(0);
  auto values = ramp(1024);
  data_server_options options;
  options.take_request = [checked, wrong, values](envelope& request, const reply_sink& sink) {
    const auto* push = std::get_if<wire::push>(&request.msg);
    if (push == nullptr)
      return false;
    const bool same =
        push->tensor.shm.has_value() &&
        push->tensor.data.size() == values->size() * sizeof(float) &&
        std::memcmp(push->tensor.data.data(), values->data(), push->tensor.data.size()) == 0;
    // await_connection's push (id 0) is neither: it came before the arena was on.
    if (push->request_id != 0)
      (same ? *checked : *wrong) += 1;
    ack_on_this_thread(request, push->request_id, 1, sink);
    return true;
  };
  auto server = start_server(std::move(options));
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self);
  // What is sent before the server has accepted the arena goes inline.
  await_connection(self, link);
  auto sending = [](const data_link_stats& s) { return s.shm_send; };
  BOOST_TEST_REQUIRE(sending(await_stats([&] { return stats_of(link); }, sending)));
  constexpr std::uint64_t batches = 1000, per_batch = 20;
  const std::uint64_t batch_bytes = per_batch * values->size() * sizeof(float);
  const auto before = process_link_tensor_bytes();
  std::uint64_t answered = 0, id = 0;
  const auto answers_until = [&](std::uint64_t most_unanswered) {
    while (id - answered > most_unanswered) {
      auto reply = next_envelope(self);
      BOOST_TEST_REQUIRE(reply.has_value());
      if (const auto* fused = std::get_if<wire::batch>(&reply->msg))
        answered += fused->messages.size();
      else
        answered += std::holds_alternative<wire::ack>(reply->msg) ? 1 : 0;
    }
  };
  for (std::uint64_t b = 0; b < batches; ++b) {
    wire::batch requests;
    for (std::uint64_t i = 0; i < per_batch; ++i)
      requests.messages.push_back(make_push(++id, *values));
    self->send(link, envelope{requests, values, 0});
    // A few batches in flight at a time: the arena, not the window, is what is tested.
    answers_until(4 * per_batch);
  }
  answers_until(0);
  BOOST_TEST(checked->load() == batches * per_batch);
  BOOST_TEST(wrong->load() == 0u);
  const auto after = process_link_tensor_bytes();
  // (The counters are the process's: a stray frame of another link could only add to them.)
  BOOST_TEST(after.shm_sent - before.shm_sent >= batches * batch_bytes);
  BOOST_TEST(after.shm_received - before.shm_received >= batches * batch_bytes);
  BOOST_TEST(after.socket_sent - before.socket_sent < batch_bytes); // no batch went inline
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
  expect_mixed_echoes_in_order(self, *values, sizes, count);
}

BOOST_AUTO_TEST_CASE(frames_sent_together_or_cut_anywhere_are_each_read_once_in_order) {
  // Small frames are read coalesced (whatever has arrived, cut into frames), large bodies
  // exactly: twenty frames in one write, a frame cut inside its prefix and inside its body, a
  // large frame whose start shares a write with a small one, and one sent byte by byte.
  auto server = start_server();
  raw_peer peer(server.port);
  BOOST_TEST_REQUIRE(peer.connected);
  BOOST_TEST_REQUIRE(peer.handshake().has_value());
  auto values = ramp(std::size_t{1} << 16); // 256 KiB of floats
  auto frame_of = [&](std::uint64_t id, std::size_t floats) {
    return wire::encode(make_push(id, std::span(*values).first(floats))).flatten();
  };
  auto expect_echo = [&](std::uint64_t id, std::size_t floats) {
    auto echoed = peer.receive_reply();
    BOOST_TEST_REQUIRE(echoed.has_value(), "no echo of frame " << id);
    const auto* push = std::get_if<wire::push>(&*echoed);
    BOOST_TEST_REQUIRE(push != nullptr);
    BOOST_TEST((*push == make_push(id, std::span(*values).first(floats))));
  };
  auto append = [](std::vector<std::byte>& to, std::span<const std::byte> bytes) {
    to.insert(to.end(), bytes.begin(), bytes.end());
  };

  std::vector<std::byte> together;
  for (std::uint64_t id = 1; id <= 20; ++id)
    append(together, frame_of(id, 10 * id));
  const auto cut = frame_of(21, 300);
  append(together, std::span(cut).first(5)); // inside its prefix
  BOOST_TEST_REQUIRE(peer.send(together));
  for (std::uint64_t id = 1; id <= 20; ++id)
    expect_echo(id, 10 * id);
  BOOST_TEST_REQUIRE(peer.send(std::span(cut).subspan(5, 100))); // inside its body
  BOOST_TEST_REQUIRE(peer.send(std::span(cut).subspan(105)));
  expect_echo(21, 300);

  // A large body whose first bytes come with a small frame, then more small frames after it.
  std::vector<std::byte> mixed;
  append(mixed, frame_of(22, 7));
  const auto large = frame_of(23, std::size_t{1} << 16);
  append(mixed, std::span(large).first(1000));
  BOOST_TEST_REQUIRE(peer.send(mixed));
  std::vector<std::byte> rest;
  append(rest, std::span(large).subspan(1000));
  append(rest, frame_of(24, 3));
  append(rest, frame_of(25, 5000));
  BOOST_TEST_REQUIRE(peer.send(rest));
  expect_echo(22, 7);
  expect_echo(23, std::size_t{1} << 16);
  expect_echo(24, 3);
  expect_echo(25, 5000);

  // Byte by byte.
  const auto slow = frame_of(26, 40);
  for (std::size_t at = 0; at < slow.size(); ++at)
    BOOST_TEST_REQUIRE(peer.send(std::span(slow).subspan(at, 1)));
  expect_echo(26, 40);
}

BOOST_AUTO_TEST_CASE(a_malformed_frame_gets_an_error_reply_and_the_server_keeps_serving) {
  auto server = start_server();
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self);

  raw_peer hostile(server.port);
  BOOST_TEST_REQUIRE(hostile.connected);
  BOOST_TEST_REQUIRE(hostile.handshake().has_value());
  wire::barrier bad_group;
  bad_group.request_id = 7;
  bad_group.group = 0;
  BOOST_TEST_REQUIRE(hostile.send(wire::encode(bad_group).flatten()));
  auto reply = hostile.receive_reply();
  const auto* error = as_error(reply);
  BOOST_TEST_REQUIRE(error != nullptr);
  BOOST_TEST((error->code == wire::error_code::bad_frame));
  BOOST_TEST(error->message.find("barrier group") != std::string::npos);

  // The same connection still works...
  auto values = ramp(2000);
  BOOST_TEST_REQUIRE(hostile.send(wire::encode(make_push(8, *values)).flatten()));
  auto echoed = hostile.receive_reply();
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
    BOOST_TEST_REQUIRE(hostile.server_hello().has_value());
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
    BOOST_TEST_REQUIRE(liar.server_hello().has_value());
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
  options.route = [](const envelope&) { return request_handler{}; };
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

/// A link whose owner writes through a lane (link_lane), once the lane is open.
caf::actor connect_with_lane(link_fixture& f, std::uint16_t port, const caf::scoped_actor& receiver,
                             const std::shared_ptr<link_lane>& lane,
                             data_link_options options = {}) {
  options.lane = lane;
  auto link = f.connect(port, receiver, std::move(options));
  BOOST_TEST_REQUIRE(troupe::testing::poll_until([&] { return lane->takes_now(); }, patience),
                     "the lane never opened");
  return link;
}

/// The owner's threads (two here, taking turns under one lock as the worker's threads do) write
/// most frames through the lane, small and large, also while the connection is still busy with
/// earlier ones, and hand the others to the broker as messages: the server sees them all, whole,
/// in the order they were made.
BOOST_AUTO_TEST_CASE(frames_taken_through_a_lane_from_two_threads_arrive_in_the_order_made) {
  auto server = start_server();
  caf::scoped_actor self{*sys};
  auto lane = std::make_shared<link_lane>();
  auto link = connect_with_lane(*this, server.port, self, lane);
  auto values = ramp(std::size_t{1} << 18);
  const std::size_t sizes[] = {2, 1025, 70001, std::size_t{1} << 18};
  constexpr std::uint64_t count = 400;
  std::mutex owner;
  std::uint64_t next_id = 1;
  std::size_t taken = 0;
  std::size_t handed = 0;
  auto make_frames = [&] {
    for (;;) {
      bool handed_one = false;
      {
        std::lock_guard hold{owner};
        if (next_id > count)
          break;
        const auto id = next_id++;
        envelope request{make_push(id, std::span(*values).first(sizes[id % 4])), values, 0};
        // Every 25th frame is handed, and so is any made while a handed one is not yet in the
        // connection's queue (takes_now says no).
        if (id % 25 == 0 || !lane->takes_now()) {
          lane->handing();
          caf::anon_send(link, handed_atom::value, std::move(request));
          ++handed;
          handed_one = true;
        } else {
          lane->take(request);
          ++taken;
        }
      }
      link_lane::send_staged();
      // Gives the broker the time a caller's next call would, so that the lane takes frames
      // again after a handed one.
      if (handed_one)
        (void)troupe::testing::poll_until([&] { return lane->takes_now(); }, patience);
    }
  };
  std::thread other{make_frames};
  make_frames();
  other.join();
  // Both ways were taken (the control: the lane wrote frames, and messages came between them).
  BOOST_TEST_MESSAGE(taken << " frames taken through the lane, " << handed << " handed");
  BOOST_TEST(taken >= count / 2);
  BOOST_TEST(handed >= count / 25);
  expect_mixed_echoes_in_order(self, *values, sizes, count);
}

/// take() runs under its owner's lock, so it sends no message, which could block (a message to a
/// broker may wait for the multiplexer's pipe, which only the I/O thread drains): a frame it
/// cannot encode is answered with the broker's error reply only once its thread calls
/// send_staged, holding no lock; and the link goes on serving.
BOOST_AUTO_TEST_CASE(a_frame_a_lane_cannot_encode_is_refused_once_its_thread_holds_no_lock) {
  auto server = start_server();
  caf::scoped_actor self{*sys};
  data_link_options options;
  options.tuning.limits.max_frame_bytes = std::size_t{1} << 20;
  auto lane = std::make_shared<link_lane>();
  auto link = connect_with_lane(*this, server.port, self, lane, options);
  auto values = ramp(std::size_t{1} << 19); // 2 MiB
  envelope request{make_push(77, *values), values, 0};
  lane->take(request);
  // Nothing may come before send_staged: a reply now would be a message sent under the lock.
  bool early = false;
  self->receive([&](envelope&) { early = true; }, caf::after(200ms) >> [] {});
  BOOST_TEST(!early);
  link_lane::send_staged();
  auto reply = next_envelope(self);
  BOOST_TEST_REQUIRE(reply.has_value());
  const auto* error = std::get_if<wire::error_reply>(&reply->msg);
  BOOST_TEST_REQUIRE(error != nullptr);
  BOOST_TEST(error->request_id == 77u);
  BOOST_TEST((error->code == wire::error_code::internal));
  BOOST_TEST(error->message.find("max_frame_bytes") != std::string::npos);
  expect_round_trip(self, link, 78, ramp(1000, 0.5f));
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
  // A port that was free a moment ago.
  const auto port = static_cast<std::uint16_t>(testing::listening_socket{}.port());

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
// The handshake's proof of the job token (actors/logic/link_auth.hpp): who is let in, what an
// unauthenticated peer can make a broker do, and how long it may take.

namespace {

constexpr const char* job_token = "the job's token";

/// Server options of a job with `job_token`.
data_server_options with_token(data_server_options options = {}) {
  options.tuning.secret = link_secret(job_token);
  return options;
}

data_link_options client_with(const std::string& token) {
  data_link_options options;
  options.tuning.secret = link_secret(token);
  return options;
}

/// The next connection to `listener`, as a raw peer the test speaks through by hand.
raw_peer accept_peer(const testing::listening_socket& listener) {
  raw_peer peer;
  peer.fd = listener.accept();
  peer.connected = peer.fd >= 0;
  return peer;
}

std::string next_link_down(caf::scoped_actor& self);

/// A listener that is no troupe server (an impostor on the port a client dials): it accepts the
/// client link, which has a push queued behind its handshake, says hello and reads the client's
/// hello; the test then answers it (refused, below).
struct impostor_listener {
  impostor_listener(caf::actor_system& sys, data_link_options options)
      : self{sys}, link{dial(sys, std::move(options))}, peer{accept_peer(listener)} {
    BOOST_TEST_REQUIRE(peer.connected);
    BOOST_TEST_REQUIRE(peer.send(wire::encode(ours).flatten()));
    auto hello = peer.receive_frame();
    BOOST_TEST_REQUIRE((hello && std::holds_alternative<wire::link_hello>(*hello)));
    theirs = std::get<wire::link_hello>(*hello);
  }

  /// Answers the client's hello with `auth`: the client goes down with a reason naming `named`,
  /// and its push never leaves.
  void refused_after(const wire::link_auth& auth, const std::string& named) {
    BOOST_TEST_REQUIRE(peer.send(wire::encode(auth).flatten()));
    const auto reason = next_link_down(self);
    BOOST_TEST(reason.find(named) != std::string::npos, reason);
    const auto [after, closed] = peer.read_until_closed(patience);
    BOOST_TEST(closed);
    BOOST_TEST(!raw_peer::first_frame(after).has_value()); // the push never left
  }

  /// The client link to the listener, with a push queued behind its handshake.
  caf::actor dial(caf::actor_system& sys, data_link_options options) {
    auto connected =
        connect_data_link(sys, "127.0.0.1", static_cast<std::uint16_t>(listener.port()),
                          caf::actor_cast<caf::actor>(self), std::move(options));
    BOOST_TEST_REQUIRE(connected.has_value());
    self->send(*connected, envelope{make_push(1, *values), values, 0});
    return *connected;
  }

  testing::listening_socket listener;
  caf::scoped_actor self;
  std::shared_ptr<std::vector<float>> values = ramp(1000, 7.0f);
  caf::actor link;
  raw_peer peer;
  wire::link_hello ours{"impostor", 0, 0, fresh_nonce(), std::nullopt};
  wire::link_hello theirs;
};

/// The reason of the next link_down `self` gets; empty when none came in time.
std::string next_link_down(caf::scoped_actor& self) {
  std::string reason;
  bool over = false;
  while (!over)
    self->receive(
        [&](link_down_atom, std::uint64_t, const std::string& why) {
          reason = why;
          over = true;
        },
        [&](envelope&) {}, caf::after(patience) >> [&] { over = true; });
  return reason;
}

/// Sends a push of `count` values with `id` on `peer` (a raw peer of an echoing server) and
/// checks that it comes back unchanged.
void expect_echoed(raw_peer& peer, std::uint64_t id, std::size_t count) {
  auto values = ramp(count);
  BOOST_TEST_REQUIRE(peer.send(wire::encode(make_push(id, *values)).flatten()));
  auto echoed = peer.receive_reply();
  BOOST_TEST_REQUIRE(echoed.has_value());
  BOOST_TEST((std::get<wire::push>(*echoed) == make_push(id, *values)));
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

BOOST_FIXTURE_TEST_SUITE(link_handshake, link_fixture)

BOOST_AUTO_TEST_CASE(a_connector_with_the_token_is_served_and_both_ends_say_authenticated) {
  auto server = start_server(with_token());
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self, client_with(job_token));
  const auto id = await_connection(self, link);
  BOOST_TEST(stats_of(link).authenticated);
  BOOST_TEST(stats_of(server, id).authenticated);

  raw_peer peer(server.port);
  BOOST_TEST_REQUIRE(peer.handshake(0, job_token).has_value());
  expect_echoed(peer, 5, 100);
  peer.close();
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(no_proof_a_wrong_token_or_a_replayed_hello_is_refused_and_reaches_no_actor) {
  auto server = start_server(with_token());
  // A genuine handshake, whose hello a stranger captured.
  raw_peer genuine(server.port);
  auto genuine_server_hello = genuine.server_hello();
  BOOST_TEST_REQUIRE(genuine_server_hello.has_value());
  const auto captured = raw_peer::connector_hello(*genuine_server_hello, job_token);
  BOOST_TEST_REQUIRE(genuine.send(wire::encode(captured).flatten()));
  auto auth = genuine.receive_frame();
  BOOST_TEST_REQUIRE((auth && std::holds_alternative<wire::link_auth>(*auth)));

  struct attempt {
    const char* what;
    std::function<wire::link_hello(const wire::link_hello&)> hello;
    const char* named;
  };
  const attempt attempts[] = {
      {"no proof",
       [](const wire::link_hello& theirs) {
         auto ours = raw_peer::connector_hello(theirs, job_token);
         ours.proof.reset();
         return ours;
       },
       "carries no proof of the job token"},
      {"no token",
       [](const wire::link_hello& theirs) { return raw_peer::connector_hello(theirs, ""); },
       "the job token is wrong (the link_hello's proof of the job token is wrong"},
      {"a wrong token",
       [](const wire::link_hello& theirs) { return raw_peer::connector_hello(theirs, "guess"); },
       "the job token is wrong (the link_hello's proof of the job token is wrong"},
      {"the other connection's hello, replayed", [&](const wire::link_hello&) { return captured; },
       "proof of the job token is wrong"},
      {"a hello whose fields were changed after the proof",
       [](const wire::link_hello& theirs) {
         auto ours = raw_peer::connector_hello(theirs, job_token);
         ours.window_bytes = 12345;
         return ours;
       },
       "proof of the job token is wrong"},
  };
  const auto routed_before = last_connection->load();
  for (const auto& a : attempts) {
    BOOST_TEST_CONTEXT(a.what) {
      raw_peer stranger(server.port);
      auto theirs = stranger.server_hello();
      BOOST_TEST_REQUIRE(theirs.has_value());
      BOOST_TEST(!theirs->proof.has_value());
      BOOST_TEST_REQUIRE(stranger.send(wire::encode(a.hello(*theirs)).flatten()));
      // Whatever follows is not read: a push right behind the hello reaches no actor.
      auto values = ramp(10);
      stranger.send(wire::encode(make_push(9, *values)).flatten());
      auto reply = stranger.receive_frame();
      const auto* error = as_error(reply);
      BOOST_TEST_REQUIRE(error != nullptr);
      // Refused, not malformed: the connector is not admitted.
      BOOST_TEST((error->code == wire::error_code::not_admitted));
      BOOST_TEST(contains(error->message, a.named), error->message);
      BOOST_TEST(!contains(error->message, job_token));
      BOOST_TEST(stranger.sees_close());
      BOOST_TEST(await_disconnects(1).size() == 1u);
    }
  }
  BOOST_TEST(last_connection->load() == routed_before);
  // The genuine connection was not disturbed.
  expect_echoed(genuine, 3, 50);
  genuine.close();
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_client_with_another_token_goes_down_with_the_servers_refusal) {
  auto server = start_server(with_token());
  caf::scoped_actor self{*sys};
  auto link = connect_data_link(*sys, "127.0.0.1", server.port, caf::actor_cast<caf::actor>(self),
                                client_with("another job's token"));
  BOOST_TEST_REQUIRE(link.has_value());
  auto values = ramp(10);
  self->send(*link, envelope{make_push(1, *values), values, 0});
  const auto reason = next_link_down(self);
  BOOST_TEST(contains(reason, "refused by 127.0.0.1:" + std::to_string(server.port) +
                                  ": the job token is wrong"),
             reason);
  BOOST_TEST(contains(reason, "proof of the job token is wrong"), reason);
  BOOST_TEST(!contains(reason, "another job's token"));
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_listener_that_cannot_prove_the_token_gets_nothing_from_the_client) {
  // The client's push waits for the handshake; the impostor must not see it.
  impostor_listener impostor(*sys, client_with(job_token));
  BOOST_TEST(impostor.theirs.proof.has_value());
  // A proof made without the token.
  impostor.refused_after(
      wire::link_auth{link_proof(link_secret("guess"), true, impostor.ours, impostor.theirs)},
      "server's proof of the job token is wrong");
}

BOOST_AUTO_TEST_CASE(before_the_handshake_frames_are_capped_at_a_few_kib) {
  auto server = start_server(with_token());
  raw_peer stranger(server.port);
  BOOST_TEST_REQUIRE(stranger.server_hello().has_value());
  // 64 KiB is an ordinary frame for the job's nodes, but not before the handshake.
  BOOST_TEST_REQUIRE(stranger.send_prefix(std::uint64_t{64} << 10));
  auto reply = stranger.receive_frame();
  const auto* error = as_error(reply);
  BOOST_TEST_REQUIRE(error != nullptr);
  BOOST_TEST(contains(error->message, "frame_too_large"), error->message);
  BOOST_TEST(contains(error->message, std::to_string(max_handshake_frame_bytes)), error->message);
  BOOST_TEST(stranger.sees_close());
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_handshake_not_done_in_time_closes_the_connection_at_either_end) {
  auto options = with_token();
  options.tuning.handshake_timeout = 300ms;
  auto server = start_server(std::move(options));
  {
    raw_peer silent(server.port);
    BOOST_TEST_REQUIRE(silent.server_hello().has_value());
    const auto started = std::chrono::steady_clock::now();
    const auto [bytes, closed] = silent.read_until_closed(patience);
    BOOST_TEST(closed);
    BOOST_TEST((std::chrono::steady_clock::now() - started < 5s));
    BOOST_TEST(await_disconnects(1).size() == 1u);
  }
  // A client whose server never says hello.
  testing::listening_socket mute;
  caf::scoped_actor self{*sys};
  auto client = client_with(job_token);
  client.tuning.handshake_timeout = 300ms;
  auto link = connect_data_link(*sys, "127.0.0.1", static_cast<std::uint16_t>(mute.port()),
                                caf::actor_cast<caf::actor>(self), client);
  BOOST_TEST_REQUIRE(link.has_value());
  auto peer = accept_peer(mute);
  const auto reason = next_link_down(self);
  BOOST_TEST(contains(reason, "no handshake within 300 ms"), reason);
  BOOST_TEST(contains(reason, "did not say hello"), reason);
}

BOOST_AUTO_TEST_CASE(silent_connections_beyond_the_bound_push_out_the_oldest_and_nodes_get_in) {
  auto options = with_token();
  options.max_unauthenticated = 3;
  options.max_connections = 5;
  auto server = start_server(std::move(options));
  std::vector<std::unique_ptr<raw_peer>> silent;
  for (int i = 0; i < 3; ++i) {
    silent.push_back(std::make_unique<raw_peer>(server.port));
    BOOST_TEST_REQUIRE(silent.back()->server_hello().has_value());
  }
  // A fourth pushes out the first (the oldest), not itself.
  silent.push_back(std::make_unique<raw_peer>(server.port));
  BOOST_TEST_REQUIRE(silent.back()->server_hello().has_value());
  BOOST_TEST(silent.front()->sees_close());
  BOOST_TEST(await_disconnects(1).size() == 1u);
  // A node still gets in (pushing out the next oldest): its handshake takes one round trip.
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self, client_with(job_token));
  await_connection(self, link);
  BOOST_TEST(silent[1]->sees_close());
  BOOST_TEST(await_disconnects(1).size() == 1u);
  // Open: 2 silent and the node. Two more authenticated peers reach max_connections...
  std::vector<std::unique_ptr<raw_peer>> members;
  for (int i = 0; i < 2; ++i) {
    members.push_back(std::make_unique<raw_peer>(server.port));
    BOOST_TEST_REQUIRE(members.back()->handshake(0, job_token).has_value());
  }
  // ...and the next connection is closed as it arrives, with nothing sent.
  raw_peer one_too_many(server.port);
  const auto [bytes, closed] = one_too_many.read_until_closed(patience);
  BOOST_TEST(closed);
  BOOST_TEST(bytes.empty());
  silent.clear();
  members.clear();
  BOOST_TEST(await_disconnects(4).size() == 4u);
}

BOOST_AUTO_TEST_SUITE_END()

// ================================================================================================
// Node identity (actors/logic/node_identity.hpp): a server's data port that requires node proofs
// takes only workers proving the key their admission gave them, holds their hellos until it has
// the job secret, and checks every request against the worker its connection proved.

namespace {

/// The job secret of the job these cases run, and one of an earlier job with the same token.
const job_secret this_job{wire::link_digest{0x11, 0x22, 0x33}};
const job_secret earlier_job{wire::link_digest{0x44, 0x55, 0x66}};

wire::node_identity worker(std::uint32_t rank) {
  return {wire::role::worker, rank};
}

/// Worker `rank`'s key in the job whose secret is `secret`.
node_key key_of(std::uint32_t rank, const job_secret& secret = this_job) {
  return derive_node_key(link_secret(job_token), secret, worker(rank));
}

/// What the servers of these cases were told each connection proved, by connection id.
struct proven_nodes {
  std::mutex mutex;
  std::map<std::uint64_t, std::optional<wire::node_identity>> by_connection;

  std::optional<wire::node_identity> of(std::uint64_t id) {
    std::lock_guard lock(mutex);
    auto found = by_connection.find(id);
    return found == by_connection.end() ? std::nullopt : found->second;
  }
};

/// Server options of a job with job_token whose port requires node proofs and reports what each
/// connection proved to `proven`.
data_server_options with_node_proofs(const std::shared_ptr<proven_nodes>& proven,
                                     data_server_options options = {}) {
  options = with_token(std::move(options));
  options.require_node_proof = true;
  options.on_authenticated = [proven](std::uint64_t id, const link_authentication& what) {
    std::lock_guard lock(proven->mutex);
    proven->by_connection[id] = what.node;
  };
  return options;
}

/// A client link's options: the job's token, and the node it is with its key.
data_link_options client_as(const wire::node_identity& who, const node_key& key) {
  auto options = client_with(job_token);
  options.tuning.node = node_credentials{who, key};
  return options;
}

/// A membership table in which worker `lost` is not alive.
wire::membership with_lost_worker(std::uint32_t lost) {
  wire::membership table;
  table.epoch = 2;
  table.num_workers = lost + 1;
  table.num_servers = 1;
  for (std::uint32_t rank = 0; rank <= lost; ++rank)
    table.nodes.push_back(
        wire::node_info{9 + 2 * rank, wire::role::worker, rank, "127.0.0.1", 0, rank != lost});
  return table;
}

/// The refusal `peer` gets for its handshake (sent right after its hello by the caller), after
/// which the server closes; empty when none came.
std::string refusal_of(raw_peer& peer) {
  auto reply = peer.receive_frame();
  const auto* error = as_error(reply);
  if (error == nullptr)
    return {};
  BOOST_TEST((error->code == wire::error_code::not_admitted), error->message);
  BOOST_TEST(peer.sees_close());
  return error->message;
}

} // namespace

BOOST_FIXTURE_TEST_SUITE(node_proofs, link_fixture)

BOOST_AUTO_TEST_CASE(a_worker_proving_its_node_key_is_served_and_its_server_learns_which_it_is) {
  auto proven = std::make_shared<proven_nodes>();
  auto server = start_server(with_node_proofs(proven));
  caf::anon_send(server.broker, this_job);
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self, client_as(worker(1), key_of(1)));
  const auto id = await_connection(self, link);
  BOOST_TEST(stats_of(link).authenticated);
  BOOST_TEST(stats_of(server, id).authenticated);
  BOOST_TEST((proven->of(id) == std::optional{worker(1)}));

  // The raw insider's handshake checks the server's proof of its key too.
  raw_peer peer(server.port);
  BOOST_TEST_REQUIRE(peer.handshake_as(worker(2), key_of(2), job_token).has_value(), peer.refusal);
  expect_echoed(peer, 5, 100);
  peer.close();
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(
    a_wrong_key_another_ranks_key_a_stale_key_no_node_proof_or_a_lost_worker_is_refused) {
  auto proven = std::make_shared<proven_nodes>();
  auto server = start_server(with_node_proofs(proven));
  caf::anon_send(server.broker, this_job);
  caf::anon_send(server.broker, with_lost_worker(3));
  struct attempt {
    const char* what;
    wire::node_identity claims;
    node_key key;
    const char* named;
  };
  const attempt attempts[] = {
      {"a made-up key", worker(1), node_key{fresh_nonce()}, "the node key of worker 1 is wrong"},
      {"worker 2's key, claiming worker 1", worker(1), key_of(2),
       "the node key of worker 1 is wrong"},
      {"worker 1's key of an earlier job (a stale process)", worker(1), key_of(1, earlier_job),
       "the node key of worker 1 is wrong"},
      {"a server's identity with a worker's key",
       {wire::role::server, 0},
       key_of(0),
       "the node key of server 0 is wrong"},
      {"the scheduler's identity",
       {wire::role::scheduler, 0},
       key_of(0),
       "takes only workers and servers"},
      {"a worker the scheduler declared lost", worker(3), key_of(3),
       "worker 3 was declared lost by the scheduler"},
  };
  const auto routed_before = last_connection->load();
  for (const auto& a : attempts) {
    BOOST_TEST_CONTEXT(a.what) {
      raw_peer impostor(server.port);
      BOOST_TEST(!impostor.handshake_as(a.claims, a.key, job_token).has_value());
      BOOST_TEST(contains(impostor.refusal, a.named), impostor.refusal);
      BOOST_TEST(!contains(impostor.refusal, job_token));
      BOOST_TEST(impostor.sees_close());
      BOOST_TEST(await_disconnects(1).size() == 1u);
    }
  }
  {
    // The token alone, a push right behind the hello: refused, and the push reaches no actor.
    raw_peer stranger(server.port);
    auto theirs = stranger.server_hello();
    BOOST_TEST_REQUIRE(theirs.has_value());
    BOOST_TEST_REQUIRE(
        stranger.send(wire::encode(raw_peer::connector_hello(*theirs, job_token)).flatten()));
    auto values = ramp(10);
    stranger.send(wire::encode(make_push(9, *values)).flatten());
    BOOST_TEST(contains(refusal_of(stranger), "proves no node key"));
    BOOST_TEST(await_disconnects(1).size() == 1u);
  }
  BOOST_TEST(last_connection->load() == routed_before);
  // The control: worker 1 with its own key gets in.
  raw_peer genuine(server.port);
  BOOST_TEST(genuine.handshake_as(worker(1), key_of(1), job_token).has_value(), genuine.refusal);
  expect_echoed(genuine, 3, 50);
  genuine.close();
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_worker_holds_at_most_its_connections_and_a_closed_one_frees_its_place) {
  auto proven = std::make_shared<proven_nodes>();
  auto options = with_node_proofs(proven);
  options.max_connections_per_worker = 2;
  auto server = start_server(std::move(options));
  caf::anon_send(server.broker, this_job);
  std::vector<std::unique_ptr<raw_peer>> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(std::make_unique<raw_peer>(server.port));
    BOOST_TEST_REQUIRE(held.back()->handshake_as(worker(1), key_of(1), job_token).has_value(),
                       held.back()->refusal);
  }
  // A third of worker 1's is refused naming the bound; an impostor's refused one took no place.
  raw_peer third(server.port);
  BOOST_TEST(!third.handshake_as(worker(1), key_of(1), job_token).has_value());
  BOOST_TEST(contains(third.refusal, "worker 1 holds 2 connections to this server already"),
             third.refusal);
  BOOST_TEST(contains(third.refusal, "max_connections_per_worker 2"), third.refusal);
  BOOST_TEST(await_disconnects(1).size() == 1u);
  // Another worker is not held back by worker 1's connections.
  raw_peer other(server.port);
  BOOST_TEST(other.handshake_as(worker(2), key_of(2), job_token).has_value(), other.refusal);
  expect_echoed(other, 1, 10);
  // Once one of worker 1's connections closes, its place is free again.
  held.front()->close();
  BOOST_TEST(await_disconnects(1).size() == 1u);
  raw_peer again(server.port);
  BOOST_TEST(again.handshake_as(worker(1), key_of(1), job_token).has_value(), again.refusal);
  expect_echoed(again, 2, 10);
}

BOOST_AUTO_TEST_CASE(a_worker_declared_lost_loses_the_connections_it_holds_and_others_keep_theirs) {
  auto proven = std::make_shared<proven_nodes>();
  auto server = start_server(with_node_proofs(proven));
  caf::anon_send(server.broker, this_job);
  raw_peer lost(server.port);
  raw_peer live(server.port);
  BOOST_TEST_REQUIRE(lost.handshake_as(worker(3), key_of(3), job_token).has_value(), lost.refusal);
  BOOST_TEST_REQUIRE(live.handshake_as(worker(1), key_of(1), job_token).has_value(), live.refusal);
  expect_echoed(lost, 1, 10);
  // The scheduler's table says worker 3 is lost: its connection goes (a reset: it may read
  // nothing), and a new one of its is refused; worker 1 is served as before.
  caf::anon_send(server.broker, with_lost_worker(3));
  BOOST_TEST(await_disconnects(1).size() == 1u);
  BOOST_TEST(lost.read_until_closed(patience).second);
  raw_peer again(server.port);
  BOOST_TEST(!again.handshake_as(worker(3), key_of(3), job_token).has_value());
  BOOST_TEST(contains(again.refusal, "worker 3 was declared lost by the scheduler"), again.refusal);
  BOOST_TEST(await_disconnects(1).size() == 1u);
  expect_echoed(live, 2, 10);
}

BOOST_AUTO_TEST_CASE(a_worker_whose_key_is_refused_goes_down_with_the_servers_words) {
  auto proven = std::make_shared<proven_nodes>();
  auto server = start_server(with_node_proofs(proven));
  caf::anon_send(server.broker, this_job);
  caf::scoped_actor self{*sys};
  // A worker process left over from an earlier job with the same token.
  auto link = connect(server.port, self, client_as(worker(1), key_of(1, earlier_job)));
  const auto reason = next_link_down(self);
  BOOST_TEST(contains(reason, "refused by 127.0.0.1:" + std::to_string(server.port) + ": "),
             reason);
  const auto words = handshake_refusal(reason);
  BOOST_TEST_REQUIRE(words.has_value(), reason);
  BOOST_TEST(words->starts_with("the node key of worker 1 is wrong"), *words);
  // Other reasons are no refusal.
  BOOST_TEST(!handshake_refusal("data link to 127.0.0.1:1 closed by the peer").has_value());
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_hello_waits_for_the_job_secret_and_is_answered_when_it_arrives) {
  auto proven = std::make_shared<proven_nodes>();
  data_server_options options;
  options.max_unauthenticated = 2;
  auto server = start_server(with_node_proofs(proven, std::move(options)));
  // Processes start in any order: this worker's hello reaches the server before its admission.
  raw_peer early(server.port);
  auto theirs = early.server_hello();
  BOOST_TEST_REQUIRE(theirs.has_value());
  const auto ours = raw_peer::node_hello(*theirs, job_token, worker(1), key_of(1));
  BOOST_TEST_REQUIRE(early.send(wire::encode(ours).flatten()));
  // The first connection of a server is its connection 1.
  const auto held = await_stats([&] { return stats_of(server, 1); },
                                [](const data_link_stats& s) { return s.held; });
  BOOST_TEST(held.held);
  BOOST_TEST(!held.authenticated);
  // A client link waits the same way, its push queued.
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self, client_as(worker(0), key_of(0)));
  BOOST_TEST(await_stats([&] { return stats_of(server, 2); },
                         [](const data_link_stats& s) { return s.held; })
                 .held);
  // Strangers' silent connections beyond max_unauthenticated push out the oldest of their own,
  // not a hello that proved the token and waits.
  std::vector<std::unique_ptr<raw_peer>> silent;
  for (int i = 0; i < 3; ++i) {
    silent.push_back(std::make_unique<raw_peer>(server.port));
    BOOST_TEST_REQUIRE(silent.back()->server_hello().has_value());
  }
  BOOST_TEST(silent.front()->sees_close());
  BOOST_TEST(await_disconnects(1).size() == 1u);
  BOOST_TEST(stats_of(server, 1).held);
  BOOST_TEST(stats_of(server, 2).held);

  caf::anon_send(server.broker, this_job);
  auto answer = early.receive_frame();
  BOOST_TEST_REQUIRE((answer && std::holds_alternative<wire::link_auth>(*answer)));
  const auto& auth = std::get<wire::link_auth>(*answer);
  BOOST_TEST(same_digest(auth.proof, link_proof(link_secret(job_token), true, *theirs, ours)));
  BOOST_TEST_REQUIRE(auth.node_proof.has_value());
  BOOST_TEST(same_digest(*auth.node_proof, node_proof(key_of(1), true, *theirs, ours)));
  expect_echoed(early, 4, 20);
  BOOST_TEST((proven->of(1) == std::optional{worker(1)}));
  const auto id = await_connection(self, link);
  BOOST_TEST(id == 2u);
  BOOST_TEST((proven->of(2) == std::optional{worker(0)}));
  early.close();
  silent.clear();
  BOOST_TEST(await_disconnects(3).size() == 3u);
}

BOOST_AUTO_TEST_CASE(a_hello_whose_job_secret_never_comes_is_closed_at_the_handshake_timeout) {
  auto proven = std::make_shared<proven_nodes>();
  data_server_options options;
  options.tuning.handshake_timeout = 300ms;
  auto server = start_server(with_node_proofs(proven, std::move(options)));
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self, client_as(worker(0), key_of(0)));
  const auto reason = next_link_down(self);
  BOOST_TEST(contains(reason, "closed by the peer"), reason);
  BOOST_TEST(await_disconnects(1).size() == 1u);
  BOOST_TEST(!proven->of(1).has_value());
}

BOOST_AUTO_TEST_CASE(a_server_that_cannot_prove_the_workers_node_key_gets_nothing_from_it) {
  // A listener that knows the token but not this job's secret: a token holder posing as a server.
  for (const bool with_proof : {false, true}) {
    BOOST_TEST_CONTEXT((with_proof ? "a wrong proof of the node key" : "no proof of it")) {
      impostor_listener impostor(*sys, client_as(worker(1), key_of(1)));
      const auto& hello = impostor.theirs;
      BOOST_TEST((hello.identity == std::optional{worker(1)}));
      wire::link_auth auth{link_proof(link_secret(job_token), true, impostor.ours, hello)};
      if (with_proof)
        auth.node_proof = node_proof(key_of(1, earlier_job), true, impostor.ours, hello);
      impostor.refused_after(auth, with_proof
                                       ? "server's proof of the node key of worker 1 is wrong"
                                       : "server did not prove the node key of worker 1");
    }
  }
}

BOOST_AUTO_TEST_CASE(
    requests_acting_as_another_worker_or_for_the_job_are_refused_and_change_nothing) {
  // A server of a dist_sync job of 2 workers without an optimizer (a round's value is its sum)
  // behind a port that proves nodes and checks each request against the proven one.
  server_node_options node_options;
  node_options.num_workers = 2;
  node_options.shards = 2;
  server_node node(*sys, node_options);
  auto proven = std::make_shared<proven_nodes>();
  auto options = with_node_proofs(proven);
  options.route = node.router();
  options.authorize = request_refusal;
  auto server = start_server(std::move(options));
  caf::anon_send(server.broker, this_job);
  raw_peer rank_0(server.port);
  raw_peer rank_1(server.port);
  BOOST_TEST_REQUIRE(rank_0.handshake_as(worker(0), key_of(0), job_token).has_value());
  BOOST_TEST_REQUIRE(rank_1.handshake_as(worker(1), key_of(1), job_token).has_value());
  auto ask = [](raw_peer& peer, const wire::message& request) {
    BOOST_TEST_REQUIRE(peer.send(wire::encode(request).flatten()));
    auto reply = peer.receive_reply();
    BOOST_TEST_REQUIRE(reply.has_value());
    return *reply;
  };
  constexpr std::uint64_t key = 5;
  const std::vector<float> initial{1, 2, 3, 4}, of_rank_0(4, 100.0f), of_rank_1(4, 10.0f),
      forged(4, 1e6f);
  BOOST_TEST_REQUIRE(
      std::holds_alternative<wire::ack>(ask(rank_0, wire::init{1, key, tensor_view(initial)})));

  // Worker 1's connection, acting as worker 0 or for the whole job.
  const std::vector<std::pair<wire::message, const char*>> forgeries = {
      {wire::push{2, key, 0, 0, tensor_view(forged)}, "as worker 0 on a connection that proved"},
      {wire::push{3, key, 0, 2, tensor_view(forged)}, "as worker 0 on a connection that proved"},
      {wire::pull_request{4, key, 0, 1, 0}, "as worker 0 on a connection that proved"},
      {wire::pushpull{5, key, 0, 0, tensor_view(forged), 0},
       "as worker 0 on a connection that proved"},
      {wire::set_optimizer{6, "sgd", {{"learning_rate", 1e6}}}, "only worker rank 0"},
      {wire::sync_settings{7, wire::consistency_mode::async, 1, false, -1, 2},
       "only worker rank 0"},
      {wire::command{8, wire::command_kind::load_checkpoint, "states"}, "only worker rank 0"},
      {wire::init{9, key + 1, tensor_view(forged)}, "only worker rank 0"},
  };
  for (const auto& [request, named] : forgeries) {
    BOOST_TEST_CONTEXT(wire::kind_name(request) << " " << wire::request_id_of(request)) {
      const auto reply = ask(rank_1, request);
      const auto* error = std::get_if<wire::error_reply>(&reply);
      BOOST_TEST_REQUIRE(error != nullptr);
      BOOST_TEST((error->code == wire::error_code::not_permitted), error->message);
      BOOST_TEST(error->request_id == wire::request_id_of(request));
      BOOST_TEST(contains(error->message, named), error->message);
      BOOST_TEST(contains(error->message, "proved worker 1"), error->message);
    }
  }
  // The connection goes on: worker 1 pulls the value as itself, unchanged, and pushes round 0.
  auto value = ask(rank_1, wire::pull_request{10, key, 1, 0, 0});
  BOOST_TEST_REQUIRE(std::holds_alternative<wire::pull_reply>(value));
  BOOST_TEST((std::get<wire::pull_reply>(value).tensor == tensor_view(initial)));
  BOOST_TEST(std::holds_alternative<wire::ack>(
      ask(rank_1, wire::push{11, key, 1, 0, tensor_view(of_rank_1)})));
  // Worker 0 completes round 0: the value is the two workers' sum, neither the forged pushes nor
  // the forged optimizer (a learning rate of 10^6) in it; no key was declared by worker 1.
  BOOST_TEST(std::holds_alternative<wire::ack>(
      ask(rank_0, wire::push{12, key, 0, 0, tensor_view(of_rank_0)})));
  value = ask(rank_0, wire::pull_request{13, key, 0, 1, 0});
  BOOST_TEST_REQUIRE(std::holds_alternative<wire::pull_reply>(value));
  const std::vector<float> sum(4, 110.0f);
  BOOST_TEST((std::get<wire::pull_reply>(value).tensor == tensor_view(sum)));
  const auto undeclared = ask(rank_0, wire::pull_request{14, key + 1, 0, 0, 0});
  BOOST_TEST_REQUIRE(std::holds_alternative<wire::error_reply>(undeclared));
  BOOST_TEST((std::get<wire::error_reply>(undeclared).code == wire::error_code::unknown_key));
  rank_0.close();
  rank_1.close();
  BOOST_TEST(await_disconnects(2).size() == 2u);
}

BOOST_AUTO_TEST_SUITE_END()

// ================================================================================================
// The same-host fast path (actors/logic/shm_arena.hpp): the ring and the mappings alone, the
// codec's checks of a reference, then both brokers over loopback, which share this host.

namespace {

data_link_tuning shm_tuning(std::size_t arena_bytes) {
  data_link_tuning tuning;
  tuning.shm_arena_bytes = arena_bytes;
  return tuning;
}

/// What compute_host_identity() says in a child process that first unshares `namespaces` (0:
/// none; CLONE_NEWPID applies to the child's own child, which then answers): the identity, or
/// "refused: <why>" where the namespace cannot be made here. Only async-signal-safe calls run
/// between fork and the computation, which a process with no other thread may follow with any.
std::string identity_in_child(int namespaces) {
  int fds[2];
  BOOST_REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    auto say = [&](const std::string& text) {
      const ssize_t written = ::write(fds[1], text.data(), text.size());
      ::_exit(written == static_cast<ssize_t>(text.size()) ? 0 : 1);
    };
    if (namespaces != 0 && ::unshare(namespaces) != 0)
      say("refused: unshare: " + std::string(std::strerror(errno)));
    if ((namespaces & CLONE_NEWPID) != 0) {
      // Only the children of a process that unshared its PID namespace are in the new one.
      const pid_t grandchild = ::fork();
      if (grandchild < 0)
        say("refused: fork: " + std::string(std::strerror(errno)));
      if (grandchild == 0)
        say(compute_host_identity());
      int status = 0;
      ::waitpid(grandchild, &status, 0);
      ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
    }
    say(compute_host_identity());
  }
  ::close(fds[1]);
  std::string said;
  char buffer[256];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) != 0;) {
    if (n < 0 && errno == EINTR)
      continue;
    BOOST_REQUIRE(n > 0);
    said.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  BOOST_REQUIRE(::waitpid(child, &status, 0) == child);
  BOOST_REQUIRE_MESSAGE(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                        "the child failed: " << said);
  return said;
}

std::string namespace_link(const char* kind) {
  return std::filesystem::read_symlink(std::string("/proc/self/ns/") + kind).string();
}

} // namespace

BOOST_AUTO_TEST_SUITE(host_identity_of_a_process)

BOOST_AUTO_TEST_CASE(it_names_the_boot_the_namespaces_and_the_hostname_within_its_bound) {
  const std::string id = compute_host_identity();
  BOOST_TEST_REQUIRE(!id.empty());
  BOOST_TEST(id == host_identity());
  BOOST_TEST(id.size() <= 151u, id);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  // readlink shows "net:[4026531840]"; the identity "net:4026531840".
  auto inode_of = [](std::string link) {
    return link.substr(link.find('[') + 1, link.size() - link.find('[') - 2);
  };
  const std::string prefix = boot_id + "/net:" + inode_of(namespace_link("net")) +
                             "/pid:" + inode_of(namespace_link("pid")) + "/";
  BOOST_TEST(id.starts_with(prefix), id << " does not start with " << prefix);
}

BOOST_AUTO_TEST_CASE(a_child_in_the_same_namespaces_shares_the_host_one_in_its_own_does_not) {
  const std::string ours = compute_host_identity();
  BOOST_TEST(identity_in_child(0) == ours);
  const std::string in_new_net = identity_in_child(CLONE_NEWNET);
  if (in_new_net.starts_with("refused: ")) {
    BOOST_TEST_MESSAGE("skipped: no network namespace can be made here (" << in_new_net << ")");
    return;
  }
  BOOST_TEST(!in_new_net.empty());
  BOOST_TEST(in_new_net != ours);
  // Only the network namespace differs.
  BOOST_TEST(in_new_net.substr(0, in_new_net.find("/net:")) == ours.substr(0, ours.find("/net:")));
  BOOST_TEST(in_new_net.substr(in_new_net.find("/pid:")) == ours.substr(ours.find("/pid:")));

  const std::string in_new_pid = identity_in_child(CLONE_NEWPID);
  if (in_new_pid.starts_with("refused: ")) {
    BOOST_TEST_MESSAGE("skipped: no PID namespace can be made here (" << in_new_pid << ")");
    return;
  }
  BOOST_TEST(in_new_pid != ours);
  BOOST_TEST(in_new_pid.substr(0, in_new_pid.find("/pid:")) == ours.substr(0, ours.find("/pid:")));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(shm_arena_alone)

BOOST_AUTO_TEST_CASE(
    the_ring_reclaims_only_the_released_prefix_and_wraps_early_when_the_start_has_room) {
  auto created = shm_send_arena::create(std::size_t{1} << 20);
  BOOST_TEST_REQUIRE(created.has_value());
  auto& ring = **created;
  BOOST_TEST(is_arena_name(ring.name()), ring.name());
  BOOST_TEST(std::filesystem::exists(ring.name()));
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
  BOOST_TEST(ring.release(0));
  // Many small regions in flight and the first one back: the end of the arena is used before the
  // start, whose room would hold only one of them (wrapping there refused the next ones).
  constexpr std::size_t small = 64 * 1024;
  for (std::size_t i = 0; i < 4; ++i)
    BOOST_TEST((ring.allocate(small) == std::optional<std::size_t>{i * small}));
  BOOST_TEST(ring.release(0));
  for (std::size_t i = 4; i < 16; ++i)
    BOOST_TEST((ring.allocate(small) == std::optional<std::size_t>{i * small}), i);
  BOOST_TEST((ring.allocate(small) == std::optional<std::size_t>{0})); // the end is reached
  BOOST_TEST(!ring.allocate(small).has_value());
  ring.unlink();
  BOOST_TEST(!std::filesystem::exists(ring.name()));
}

BOOST_AUTO_TEST_CASE(only_a_memory_file_sealed_against_shrinking_is_mapped) {
  // The owner of a sealed arena cannot shrink it under a reader's mapping, nor grow it.
  auto created = shm_send_arena::create(std::size_t{64} << 10);
  BOOST_TEST_REQUIRE(created.has_value());
  const int owner = ::open((*created)->name().c_str(), O_RDWR);
  BOOST_TEST_REQUIRE(owner >= 0);
  BOOST_TEST(::ftruncate(owner, 4096) != 0);
  BOOST_TEST(errno == EPERM);
  BOOST_TEST(::ftruncate(owner, std::size_t{1} << 20) != 0);
  ::close(owner);
  BOOST_TEST(shm_peer_arena::open((*created)->name(), (*created)->size()).has_value());

  // An unsealed memory file, which its owner could cut short, is refused.
  const int unsealed = ::memfd_create("troupe-arena", MFD_CLOEXEC);
  BOOST_TEST_REQUIRE(unsealed >= 0);
  BOOST_TEST_REQUIRE(::ftruncate(unsealed, std::size_t{64} << 10) == 0);
  const auto unsealed_path =
      "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(unsealed);
  auto refused = shm_peer_arena::open(unsealed_path, std::size_t{64} << 10);
  BOOST_TEST_REQUIRE(!refused.has_value());
  BOOST_TEST(refused.error().message().find("sealed") != std::string::npos,
             refused.error().message());
  ::close(unsealed);

  // So is a plain file, and anything not named /proc/<pid>/fd/<fd>.
  const int plain = ::open("/proc/self/exe", O_RDONLY);
  BOOST_TEST_REQUIRE(plain >= 0);
  auto not_memory = shm_peer_arena::open(
      "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(plain), 4096);
  BOOST_TEST(!not_memory.has_value());
  ::close(plain);
  for (const char* name :
       {"/troupe-0123456789abcdef0123456789abcdef", "/proc/self/fd/3", "/proc/01/fd/3",
        "/proc/1/fd/3/..", "/proc/1234567890/fd/3", "/proc/1/fd/"})
    BOOST_TEST(!is_arena_name(name), name);
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
  ring.unlink(); // the mappings outlive the descriptor

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
        return {[=](envelope& request, const reply_sink& reply_to) {
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
  const auto before = testing::arena_descriptors();
  data_server_options server_options;
  auto echo = spawn_tagging_echo(*sys, spawned);
  server_options.route = [echo](const envelope&) { return caf::actor_cast<request_handler>(echo); };
  server_options.tuning = shm_tuning(std::size_t{1} << 20);
  auto server = start_server(std::move(server_options));
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self, {shm_tuning(std::size_t{1} << 20)});
  const auto id = await_connection(self, link);
  auto both_ways = [](const data_link_stats& s) { return s.shm_send && s.shm_receive; };
  BOOST_TEST_REQUIRE(both_ways(await_stats([&] { return stats_of(link); }, both_ways)));
  BOOST_TEST_REQUIRE(both_ways(await_stats([&] { return stats_of(server, id); }, both_ways)));
  // Both arenas are mapped by both ends now: no descriptor of them is left open.
  BOOST_TEST((testing::arena_descriptors() == before));

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
  BOOST_TEST((testing::arena_descriptors() == before));
}

BOOST_AUTO_TEST_CASE(with_the_arena_off_at_either_end_tensors_go_through_the_socket) {
  const auto before = testing::arena_descriptors();
  for (bool client_off : {true, false}) {
    data_server_options server_options;
    auto echo = spawn_tagging_echo(*sys, spawned);
    server_options.route = [echo](const envelope&) {
      return caf::actor_cast<request_handler>(echo);
    };
    server_options.tuning = shm_tuning(client_off ? std::size_t{1} << 20 : 0);
    auto server = start_server(std::move(server_options));
    caf::scoped_actor self{*sys};
    auto link = connect(server.port, self, {shm_tuning(client_off ? 0 : std::size_t{1} << 20)});
    auto values = ramp(std::size_t{1} << 16);
    for (std::uint64_t id = 1; id <= 20; ++id) {
      self->send(link, envelope{make_push(id, *values), values, 0});
      auto reply = next_envelope(self);
      BOOST_TEST_REQUIRE(reply.has_value());
      const auto& push = std::get<wire::push>(reply->msg);
      BOOST_TEST_REQUIRE((push == tagged(make_push(id, *values), 0)));
      BOOST_TEST_REQUIRE(!push.tensor.shm);
    }
    BOOST_TEST((testing::arena_descriptors() == before));
    self->send(link, stop_atom::value);
    BOOST_TEST(await_disconnects(1).size() == 1u);
  }
}

BOOST_AUTO_TEST_CASE(an_arena_its_owner_could_shrink_is_refused_and_the_peer_goes_on_over_tcp) {
  auto server = start_server();
  raw_peer peer(server.port);
  BOOST_TEST_REQUIRE(peer.handshake(0, "", host_identity(), 1 << 20).has_value());
  auto offer = peer.receive_frame();
  BOOST_TEST_REQUIRE((offer && std::holds_alternative<wire::arena_offer>(*offer)));
  // A memory file without seals: its owner could truncate it under the server's mapping.
  const int unsealed = ::memfd_create("troupe-arena", MFD_CLOEXEC);
  BOOST_TEST_REQUIRE(unsealed >= 0);
  BOOST_TEST_REQUIRE(::ftruncate(unsealed, 1 << 20) == 0);
  const auto path = "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(unsealed);
  BOOST_TEST_REQUIRE(peer.send(wire::encode(wire::arena_offer{path, 1 << 20}).flatten()));
  auto accept = peer.receive_frame();
  ::close(unsealed);
  BOOST_TEST_REQUIRE((accept && std::holds_alternative<wire::arena_accept>(*accept)));
  BOOST_TEST(!std::get<wire::arena_accept>(*accept).ok);
  BOOST_TEST(std::get<wire::arena_accept>(*accept).detail.find("not sealed against shrinking") !=
                 std::string::npos,
             std::get<wire::arena_accept>(*accept).detail);
  expect_echoed(peer, 4, 1 << 16); // inline, as without an arena
  peer.close();
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_reference_outside_the_arena_gets_bad_frame_naming_it_and_serving_goes_on) {
  auto server = start_server();
  raw_peer peer(server.port);
  BOOST_TEST_REQUIRE(peer.connected);
  // The handshake by hand: the hellos and the server's link_auth, the server's offer, our offer
  // and its accept.
  auto hello = peer.handshake(0, "", host_identity(), 1 << 20);
  BOOST_TEST_REQUIRE(hello.has_value());
  BOOST_TEST(hello->host_id == host_identity());
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

// ================================================================================================
// Receive credit through both brokers over loopback, each case with the same-host arena off and
// on (the tensors here stay below its threshold or above its size unless said otherwise, so that
// frame sizes are known).

BOOST_FIXTURE_TEST_SUITE(link_credit_brokers, link_fixture)

namespace {

constexpr std::size_t arena_settings[] = {0, std::size_t{1} << 20};

data_link_tuning credit_tuning(std::size_t window, std::size_t arena_bytes) {
  auto tuning = shm_tuning(arena_bytes);
  tuning.receive_window_bytes = window;
  return tuning;
}

data_server_options server_tuned(data_link_tuning tuning) {
  data_server_options options;
  options.tuning = std::move(tuning);
  return options;
}

/// An actor that keeps every request it gets and never answers (a consumer that holds frames).
caf::actor spawn_holder(caf::actor_system& sys, std::vector<caf::actor>& spawned) {
  auto holder = sys.spawn(
      [](caf::event_based_actor*, int) -> caf::behavior {
        auto kept = std::make_shared<std::vector<envelope>>();
        return {
            [kept](envelope& request, const reply_sink&) { kept->push_back(std::move(request)); }};
      },
      0);
  spawned.push_back(holder);
  return holder;
}

} // namespace

BOOST_AUTO_TEST_CASE(
    a_receiver_holding_its_envelopes_stops_the_sender_and_releasing_them_resumes_it) {
  for (std::size_t arena : arena_settings) {
    BOOST_TEST_CONTEXT("arena " << arena) {
      auto server = start_server(server_tuned(credit_tuning(64 << 20, arena)));
      caf::scoped_actor self{*sys};
      auto values = ramp(4000); // 16000 bytes: below the arena threshold, inline either way
      const std::size_t frame = wire::encode(make_push(1, *values)).size();
      const std::size_t window = 4 * frame + frame / 2;
      auto link = connect(server.port, self, {credit_tuning(window, arena)});
      const auto id = await_connection(self, link);

      constexpr std::uint64_t count = 12;
      for (std::uint64_t i = 1; i <= count; ++i)
        self->send(link, envelope{make_push(i, *values), values, 0});
      // A window's worth arrives, and is held here...
      std::vector<envelope> held;
      for (std::uint64_t i = 1; i <= 4; ++i) {
        auto reply = next_envelope(self);
        BOOST_TEST_REQUIRE(reply.has_value());
        BOOST_TEST_REQUIRE((std::get<wire::push>(reply->msg) == make_push(i, *values)));
        held.push_back(std::move(*reply));
      }
      // ...and the rest waits at the server, uncopied, until credit comes back.
      auto stalled = await_stats([&] { return stats_of(server, id); },
                                 [&](const data_link_stats& s) { return s.waiting_frames == 8; });
      BOOST_TEST(stalled.waiting_frames == 8u);
      BOOST_TEST(stalled.peer_window == window);
      BOOST_TEST(stalled.outstanding >= 4 * frame);
      BOOST_TEST(stalled.outstanding <= window);
      BOOST_TEST(stats_of(link).unreleased == 4 * frame);
      bool more = false;
      self->receive([&](envelope&) { more = true; }, caf::after(100ms) >> [] {});
      BOOST_TEST(!more);

      held.clear();
      for (std::uint64_t i = 5; i <= count; ++i) {
        auto reply = next_envelope(self);
        BOOST_TEST_REQUIRE(reply.has_value());
        BOOST_TEST_REQUIRE((std::get<wire::push>(reply->msg) == make_push(i, *values)));
      }
      const auto client = stats_of(link);
      BOOST_TEST(client.credit_sent >= 8 * frame);
      auto settled = await_stats(
          [&] { return stats_of(server, id); },
          [&](const data_link_stats& s) { return s.credit_received == client.credit_sent; });
      BOOST_TEST(settled.credit_received == client.credit_sent);
      BOOST_TEST(settled.waiting_frames == 0u);
      self->send(link, stop_atom::value);
      BOOST_TEST(await_disconnects(1).size() == 1u);
    }
  }
}

BOOST_AUTO_TEST_CASE(
    a_single_frame_larger_than_the_window_goes_through_when_nothing_is_outstanding) {
  for (std::size_t arena : arena_settings) {
    BOOST_TEST_CONTEXT("arena " << arena) {
      auto server = start_server(server_tuned(credit_tuning(64 << 20, arena)));
      caf::scoped_actor self{*sys};
      // 2 MiB: above the window and above the 1 MiB arena, so inline either way.
      auto big = ramp(std::size_t{1} << 19, 2.0f);
      auto link = connect(server.port, self, {credit_tuning(std::size_t{64} << 10, arena)});
      const auto id = await_connection(self, link);
      self->send(link, envelope{make_push(1, *big), big, 0});
      self->send(link, envelope{make_push(2, *big), big, 0});
      auto first = next_envelope(self);
      BOOST_TEST_REQUIRE(first.has_value());
      BOOST_TEST_REQUIRE((std::get<wire::push>(first->msg) == make_push(1, *big)));
      // While the first is held, the second waits.
      auto stalled = await_stats([&] { return stats_of(server, id); },
                                 [](const data_link_stats& s) { return s.waiting_frames == 1; });
      BOOST_TEST(stalled.waiting_frames == 1u);
      first.reset();
      auto second = next_envelope(self);
      BOOST_TEST_REQUIRE(second.has_value());
      BOOST_TEST((std::get<wire::push>(second->msg) == make_push(2, *big)));
    }
  }
}

BOOST_AUTO_TEST_CASE(
    a_peer_beyond_its_window_gets_bad_frame_and_is_closed_while_others_are_served) {
  for (std::size_t arena : arena_settings) {
    BOOST_TEST_CONTEXT("arena " << arena) {
      constexpr std::uint64_t window = 64 << 10;
      auto holder = spawn_holder(*sys, spawned);
      auto echo = spawn_echo();
      auto options = server_tuned(credit_tuning(window, arena));
      // The hostile peer's pushes are held, so it gets no credit back.
      options.route = [holder, echo](const envelope& e) {
        const auto* push = std::get_if<wire::push>(&e.msg);
        return caf::actor_cast<request_handler>(push != nullptr && push->sender_rank == 99 ? holder
                                                                                           : echo);
      };
      auto server = start_server(std::move(options));
      caf::scoped_actor self{*sys};
      auto link = connect(server.port, self, {credit_tuning(window, arena)});

      raw_peer hostile(server.port);
      BOOST_TEST_REQUIRE(hostile.connected);
      auto hello = hostile.handshake();
      BOOST_TEST_REQUIRE(hello.has_value());
      BOOST_TEST(hello->window_bytes == window);
      auto values = ramp(4000);
      auto push = make_push(1, *values);
      push.sender_rank = 99;
      const auto flat = wire::encode(push).flatten();
      BOOST_TEST_REQUIRE(4 * flat.size() <= window);
      BOOST_TEST_REQUIRE(5 * flat.size() > window);
      for (int i = 0; i < 5; ++i)
        BOOST_TEST_REQUIRE(hostile.send(flat));
      auto reply = hostile.receive_reply();
      const auto* error = as_error(reply);
      BOOST_TEST_REQUIRE(error != nullptr);
      BOOST_TEST((error->code == wire::error_code::bad_frame));
      BOOST_TEST(error->message.find("a frame of " + std::to_string(flat.size()) +
                                     " bytes arrived beyond the receive window of " +
                                     std::to_string(window) + " bytes (" +
                                     std::to_string(4 * flat.size()) + " bytes outstanding)") !=
                     std::string::npos,
                 error->message);
      BOOST_TEST(hostile.sees_close());
      BOOST_TEST(await_disconnects(1).size() == 1u);

      self->send(link, envelope{make_push(7, *values), values, 0});
      auto other = next_envelope(self);
      BOOST_TEST_REQUIRE(other.has_value());
      BOOST_TEST((std::get<wire::push>(other->msg) == make_push(7, *values)));
    }
  }
}

BOOST_AUTO_TEST_CASE(no_hello_first_a_second_hello_or_an_excess_credit_closes_the_connection) {
  auto server = start_server();
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self);
  auto values = ramp(100);
  struct breach {
    const char* what;
    bool hello_first;
    wire::message frame;
    const char* named;
  };
  const breach breaches[] = {
      {"a push before the hello", false, make_push(1, *values),
       "the first frame must be a link_hello, not a push"},
      {"a second hello", true, wire::link_hello{"raw peer", 0, 0, {}, std::nullopt},
       "a second link_hello"},
      {"a credit for bytes never sent", true, wire::link_credit{1000},
       "a link credit of 1000 bytes, with 0 bytes outstanding"},
  };
  for (const auto& b : breaches) {
    BOOST_TEST_CONTEXT(b.what) {
      raw_peer peer(server.port);
      BOOST_TEST_REQUIRE(peer.connected);
      if (b.hello_first)
        BOOST_TEST_REQUIRE(peer.handshake().has_value());
      else
        BOOST_TEST_REQUIRE(peer.server_hello().has_value());
      BOOST_TEST_REQUIRE(peer.send(wire::encode(b.frame).flatten()));
      auto reply = peer.receive_reply();
      const auto* error = as_error(reply);
      BOOST_TEST_REQUIRE(error != nullptr);
      BOOST_TEST((error->code == wire::error_code::bad_frame));
      BOOST_TEST(error->message.find(b.named) != std::string::npos, error->message);
      BOOST_TEST(peer.sees_close());
      BOOST_TEST(await_disconnects(1).size() == 1u);
    }
  }
  self->send(link, envelope{make_push(3, *values), values, 0});
  auto reply = next_envelope(self);
  BOOST_TEST_REQUIRE(reply.has_value());
  BOOST_TEST(std::get<wire::push>(reply->msg).request_id == 3u);
}

BOOST_AUTO_TEST_CASE(link_credits_flow_both_ways_and_never_reach_an_actor) {
  for (std::size_t arena : arena_settings) {
    BOOST_TEST_CONTEXT("arena " << arena) {
      constexpr std::size_t window = 32 << 10;
      auto kinds = std::make_shared<std::pair<std::mutex, std::set<std::string>>>();
      auto echo = spawn_echo();
      auto options = server_tuned(credit_tuning(window, arena));
      options.route = [kinds, echo](const envelope& e) {
        std::lock_guard<std::mutex> guard{kinds->first};
        kinds->second.emplace(wire::kind_name(e.msg));
        return caf::actor_cast<request_handler>(echo);
      };
      auto server = start_server(std::move(options));
      caf::scoped_actor self{*sys};
      auto link = connect(server.port, self, {credit_tuning(window, arena)});
      // Up to 64 KiB: bigger than both windows, and (with the arena on) through the arena.
      auto values = ramp(std::size_t{1} << 14);
      const std::size_t sizes[] = {2, 1025, 4000, std::size_t{1} << 14};
      constexpr std::uint64_t count = 200;
      for (std::uint64_t id = 1; id <= count; ++id)
        self->send(link,
                   envelope{make_push(id, std::span(*values).first(sizes[id % 4])), values, 0});
      for (std::uint64_t id = 1; id <= count; ++id) {
        auto reply = next_envelope(self);
        BOOST_TEST_REQUIRE(reply.has_value());
        BOOST_TEST_REQUIRE(std::holds_alternative<wire::push>(reply->msg),
                           wire::kind_name(reply->msg));
        BOOST_TEST_REQUIRE((std::get<wire::push>(reply->msg) ==
                            make_push(id, std::span(*values).first(sizes[id % 4]))));
      }
      {
        std::lock_guard<std::mutex> guard{kinds->first};
        BOOST_TEST((kinds->second == std::set<std::string>{"push"}));
      }
      const auto client = stats_of(link);
      const auto id = last_connection->load();
      const auto served = stats_of(server, id);
      BOOST_TEST(client.credit_sent > 0u);
      BOOST_TEST(client.credit_received > 0u);
      BOOST_TEST(served.credit_sent > 0u);
      BOOST_TEST(served.credit_received > 0u);
      BOOST_TEST(client.shm_send == (arena != 0));
      self->send(link, stop_atom::value);
      BOOST_TEST(await_disconnects(1).size() == 1u);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

// ================================================================================================
// TLS on the links (actors/logic/link_tls.hpp): a worker of the job gets in; a peer with another
// CA's certificate, none, one of another role, or speaking plaintext does not, and reaches no
// actor; and the bytes on the wire do not show a tensor's values.

namespace {

using testing::job_certs;
using testing::other_certs;
using testing::tls_certs;

std::shared_ptr<const tls_credentials> credentials_of(const tls_certs& certs, node_role role) {
  const std::string name(to_string(role));
  auto loaded = tls_credentials::load(certs.ca(), certs.cert(name), certs.key(name), role);
  BOOST_TEST_REQUIRE(loaded.has_value(), (loaded ? std::string() : loaded.error().message()));
  return *loaded;
}

/// A server's data port of the job: TLS with a server's certificate, taking workers, the job
/// token, no shared-memory arena (so tensors travel on the wire even on one host).
data_server_options tls_data_port() {
  auto options = with_token();
  options.tuning.tls = {credentials_of(job_certs(), node_role::server), {node_role::worker}};
  options.tuning.shm_arena_bytes = 0;
  return options;
}

/// A worker's link to a data port: TLS with the certificate of `role` from `certs`, expecting a
/// server; the job token; no arena.
data_link_options tls_link(const tls_certs& certs, node_role role = node_role::worker) {
  auto options = client_with(job_token);
  options.tuning.tls = {credentials_of(certs, role), {node_role::server}};
  options.tuning.shm_arena_bytes = 0;
  return options;
}

/// A TCP proxy on 127.0.0.1 that forwards one connection to 127.0.0.1:`target` and records
/// every byte each way, until a side closes or stop(). Each wait is bounded.
class recording_proxy {
public:
  explicit recording_proxy(std::uint16_t target)
      : target_(target), thread_([this] { forward(); }) {}
  ~recording_proxy() { stop(); }
  recording_proxy(const recording_proxy&) = delete;
  recording_proxy& operator=(const recording_proxy&) = delete;

  std::uint16_t port() const { return static_cast<std::uint16_t>(listener_.port()); }
  /// Ends the forwarding; afterwards the records are complete.
  void stop() {
    stopping_ = true;
    if (thread_.joinable())
      thread_.join();
  }
  /// What went from the connector to the target, and back.
  const std::vector<char>& upstream() const { return upstream_; }
  const std::vector<char>& downstream() const { return downstream_; }

private:
  void forward() {
    const int client =
        listener_.accept(std::chrono::duration_cast<std::chrono::milliseconds>(patience));
    if (client < 0)
      return;
    const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(target_);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(server, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0) {
      std::vector<char> buffer(1 << 16);
      bool open = true;
      while (open && !stopping_) {
        pollfd both[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
        if (::poll(both, 2, 20) <= 0)
          continue;
        for (int side = 0; side < 2 && open; ++side) {
          if ((both[side].revents & (POLLIN | POLLHUP | POLLERR)) == 0)
            continue;
          const int from = side == 0 ? client : server;
          const int into = side == 0 ? server : client;
          const ssize_t n = ::recv(from, buffer.data(), buffer.size(), 0);
          if (n <= 0) {
            open = false;
            break;
          }
          auto& record = side == 0 ? upstream_ : downstream_;
          record.insert(record.end(), buffer.data(), buffer.data() + n);
          for (ssize_t sent = 0; sent < n && open;) {
            const ssize_t step = ::send(into, buffer.data() + sent,
                                        static_cast<std::size_t>(n - sent), MSG_NOSIGNAL);
            open = step > 0;
            sent += std::max<ssize_t>(step, 0);
          }
        }
      }
    }
    ::close(server);
    ::close(client);
  }

  testing::listening_socket listener_;
  std::uint16_t target_;
  std::atomic<bool> stopping_{false};
  std::vector<char> upstream_;
  std::vector<char> downstream_;
  std::thread thread_;
};

/// The float32 whose bits are 0x5A17C0DE: a pattern neither the codec nor a cipher writes by
/// chance, repeated through a tensor.
float marker_value() {
  const std::uint32_t bits = 0x5A17C0DE;
  float value = 0;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

/// Whether `bytes` hold four marker values in a row, as a tensor of them lays them out.
bool holds_marker(const std::vector<char>& bytes) {
  std::vector<float> run(4, marker_value());
  const auto* needle = reinterpret_cast<const char*>(run.data());
  return std::search(bytes.begin(), bytes.end(), needle, needle + run.size() * sizeof(float)) !=
         bytes.end();
}

} // namespace

BOOST_FIXTURE_TEST_SUITE(link_tls, link_fixture)

BOOST_AUTO_TEST_CASE(a_worker_of_the_job_is_served_over_tls_and_both_ends_say_so) {
  auto certified = std::make_shared<std::vector<std::pair<std::uint64_t, node_role>>>();
  auto certified_mutex = std::make_shared<std::mutex>();
  auto options = tls_data_port();
  options.on_certified = [certified, certified_mutex](std::uint64_t id, node_role role) {
    std::lock_guard lock(*certified_mutex);
    certified->emplace_back(id, role);
  };
  auto server = start_server(std::move(options));
  caf::scoped_actor self{*sys};
  auto link = connect(server.port, self, tls_link(job_certs()));
  const auto id = await_connection(self, link);
  const auto client_side = stats_of(link);
  BOOST_TEST(client_side.tls);
  BOOST_TEST(client_side.authenticated);
  const auto server_side = stats_of(server, id);
  BOOST_TEST(server_side.tls);
  BOOST_TEST(server_side.authenticated);
  {
    std::lock_guard lock(*certified_mutex);
    BOOST_TEST_REQUIRE(certified->size() == 1u);
    BOOST_TEST(certified->front().first == id);
    BOOST_TEST((certified->front().second == node_role::worker));
  }

  // Frames of every size cross intact: small, larger than a TLS record, and chunked.
  auto values = ramp(std::size_t{3} << 20, 0.25f);
  const std::size_t sizes[] = {3, 5000, 70001, std::size_t{1} << 20};
  for (std::uint64_t request = 1; request <= 4; ++request) {
    const auto part = std::span(*values).first(sizes[request - 1]);
    self->send(link, envelope{make_push(request, part), values, 0});
  }
  for (std::uint64_t request = 1; request <= 4; ++request) {
    auto reply = next_envelope(self);
    BOOST_TEST_REQUIRE(reply.has_value());
    BOOST_TEST_REQUIRE((std::get<wire::push>(reply->msg) ==
                        make_push(request, std::span(*values).first(sizes[request - 1]))));
  }
  BOOST_TEST(expect_chunked_round_trip(self, link, 9, values, std::size_t{1} << 20) == 12u);
}

BOOST_AUTO_TEST_CASE(
    another_ca_no_certificate_another_role_or_plaintext_is_refused_and_reaches_no_actor) {
  // The port waits longer for a handshake than the plaintext link below, so that the link's own
  // deadline, which says why, comes first.
  auto options = tls_data_port();
  options.tuning.handshake_timeout = 3s;
  auto server = start_server(std::move(options));
  caf::scoped_actor self{*sys};
  auto genuine = connect(server.port, self, tls_link(job_certs()));
  await_connection(self, genuine);
  const auto routed_before = last_connection->load();
  const auto port_text = "127.0.0.1:" + std::to_string(server.port);

  BOOST_TEST_CONTEXT("a worker of another job's CA") {
    caf::scoped_actor receiver{*sys};
    auto link = connect_data_link(*sys, "127.0.0.1", server.port,
                                  caf::actor_cast<caf::actor>(receiver), tls_link(other_certs()));
    BOOST_TEST_REQUIRE(link.has_value());
    auto values = ramp(10);
    receiver->send(*link, envelope{make_push(1, *values), values, 0});
    const auto reason = next_link_down(receiver);
    BOOST_TEST(contains(reason, port_text), reason);
    BOOST_TEST(contains(reason, "not from the CA of " + other_certs().ca()), reason);
    BOOST_TEST(await_disconnects(1).size() == 1u);
  }
  // Raw TLS peers, which trust the job's CA: the data port checks what they present.
  for (const auto& stranger : testing::tls_strangers()) {
    BOOST_TEST_CONTEXT(stranger.what) {
      raw_peer peer(server.port);
      BOOST_TEST_REQUIRE(peer.connected);
      BOOST_TEST(peer.refused_over_tls(job_certs().ca(), stranger.cert, stranger.key));
      BOOST_TEST(contains(peer.tls_failure, stranger.alert), peer.tls_failure);
      BOOST_TEST(await_disconnects(1).size() == 1u);
    }
  }
  BOOST_TEST_CONTEXT("a link that presents a server's certificate") {
    caf::scoped_actor receiver{*sys};
    auto link =
        connect_data_link(*sys, "127.0.0.1", server.port, caf::actor_cast<caf::actor>(receiver),
                          tls_link(job_certs(), node_role::server));
    BOOST_TEST_REQUIRE(link.has_value());
    const auto reason = next_link_down(receiver);
    BOOST_TEST(contains(reason, "refused this node's certificate"), reason);
    BOOST_TEST(await_disconnects(1).size() == 1u);
  }
  BOOST_TEST_CONTEXT("a plaintext troupe link") {
    caf::scoped_actor receiver{*sys};
    auto plain = client_with(job_token);
    plain.tuning.handshake_timeout = 300ms;
    auto link = connect_data_link(*sys, "127.0.0.1", server.port,
                                  caf::actor_cast<caf::actor>(receiver), plain);
    BOOST_TEST_REQUIRE(link.has_value());
    const auto reason = next_link_down(receiver);
    BOOST_TEST(contains(reason, "did not say hello"), reason);
    BOOST_TEST(contains(reason, "without TLS"), reason);
    BOOST_TEST(await_disconnects(1).size() == 1u);
  }
  BOOST_TEST_CONTEXT("plaintext frames") {
    raw_peer stranger(server.port);
    auto values = ramp(10);
    BOOST_TEST_REQUIRE(stranger.send(wire::encode(make_push(1, *values)).flatten()));
    const auto [bytes, closed] = stranger.read_until_closed(patience);
    BOOST_TEST(closed);
    BOOST_TEST(!raw_peer::first_frame(bytes).has_value());
    BOOST_TEST(await_disconnects(1).size() == 1u);
  }
  BOOST_TEST(last_connection->load() == routed_before);

  // The genuine worker was not disturbed.
  expect_round_trip(self, genuine, 2, ramp(5000, 3.0f));
}

BOOST_AUTO_TEST_CASE(a_tls_link_to_a_plaintext_port_goes_down_saying_the_port_does_not_speak_tls) {
  auto options = with_token();
  auto server = start_server(std::move(options));
  caf::scoped_actor self{*sys};
  auto link = connect_data_link(*sys, "127.0.0.1", server.port, caf::actor_cast<caf::actor>(self),
                                tls_link(job_certs()));
  BOOST_TEST_REQUIRE(link.has_value());
  const auto reason = next_link_down(self);
  BOOST_TEST(contains(reason, "does not speak TLS"), reason);
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_marker_tensor_never_shows_on_the_wire_under_tls_and_does_in_plaintext) {
  // A worker's link reaches the data port through a proxy that records both directions; the
  // tensor goes up in a push and comes back in the echo (as a pull reply would).
  auto markers = std::make_shared<std::vector<float>>(std::size_t{64} << 10, marker_value());
  for (const bool tls : {false, true}) {
    BOOST_TEST_CONTEXT((tls ? "TLS" : "plaintext")) {
      auto server_options = tls ? tls_data_port() : with_token();
      auto link_options = tls ? tls_link(job_certs()) : client_with(job_token);
      server_options.tuning.shm_arena_bytes = 0;
      link_options.tuning.shm_arena_bytes = 0;
      auto server = start_server(std::move(server_options));
      recording_proxy proxy(server.port);
      caf::scoped_actor self{*sys};
      auto link = connect(proxy.port(), self, link_options);
      expect_round_trip(self, link, 1, markers);
      self->send(link, stop_atom::value);
      BOOST_TEST(await_disconnects(1).size() == 1u);
      proxy.stop();
      const std::size_t tensor_bytes = markers->size() * sizeof(float);
      BOOST_TEST(proxy.upstream().size() > tensor_bytes);
      BOOST_TEST(proxy.downstream().size() > tensor_bytes);
      BOOST_TEST(holds_marker(proxy.upstream()) == !tls);
      BOOST_TEST(holds_marker(proxy.downstream()) == !tls);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

// ================================================================================================
// Bounds per node and per peer: the receive budget over all of a server's connections, stalled
// frames, and the send queue of a peer that does not read its replies.

namespace {

/// Keeps every request it gets (a consumer that holds frames) until told (release_atom) to drop
/// them all; (get_atom) -> how many it has had in total.
using release_atom = caf::atom_constant<caf::atom("release")>;

caf::actor spawn_keeper(caf::actor_system& sys, std::vector<caf::actor>& spawned) {
  auto keeper = sys.spawn(
      [](caf::event_based_actor*, int) -> caf::behavior {
        auto kept = std::make_shared<std::vector<envelope>>();
        auto total = std::make_shared<std::size_t>(0);
        return {
            [kept, total](envelope& request, const reply_sink&) {
              kept->push_back(std::move(request));
              ++*total;
            },
            [kept](release_atom) { kept->clear(); },
            [total](caf::get_atom) { return *total; },
        };
      },
      0);
  spawned.push_back(keeper);
  return keeper;
}

/// A push of `values` from a raw peer, encoded whole.
std::vector<std::byte> push_bytes(std::uint64_t id, const std::vector<float>& values) {
  return wire::encode(make_push(id, values)).flatten();
}

/// The receiver's reads of `frame` after its prefix was consumed into `out`, in the sizes it asks
/// for, until it has decoded the frame or refused it (or waits for the budget); `at` is where the
/// next read starts.
receive_outcome feed_rest(frame_receiver& receiver, std::vector<char>& scribe_buffer,
                          std::span<const std::byte> frame, std::size_t& at, receive_outcome out) {
  while (!out.frame && !out.error && !out.waits_for_budget && at < frame.size()) {
    scribe_buffer.resize(out.next_read);
    std::memcpy(scribe_buffer.data(), frame.data() + at, out.next_read);
    at += out.next_read;
    out = receiver.consume(scribe_buffer);
  }
  return out;
}

/// The prefix of `frame`, read by `receiver` into `scribe_buffer`.
receive_outcome feed_prefix(frame_receiver& receiver, std::vector<char>& scribe_buffer,
                            std::span<const std::byte> frame) {
  scribe_buffer.resize(wire::frame_prefix_bytes);
  std::memcpy(scribe_buffer.data(), frame.data(), wire::frame_prefix_bytes);
  return receiver.consume(scribe_buffer);
}

/// The local port of socket `fd`.
std::uint16_t local_port_of(int fd) {
  sockaddr_in address{};
  socklen_t size = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  return ntohs(address.sin_port);
}

/// The kernel's rows of the server's end of the connection from local port `peer_port` to the
/// server on `server_port` (this process holds both ends).
std::vector<testing::tcp_row> server_ends(std::uint16_t server_port, std::uint16_t peer_port) {
  std::vector<testing::tcp_row> found;
  for (const auto& row : testing::tcp_rows())
    if (row.local_port == server_port && row.remote_port == peer_port)
      found.push_back(row);
  return found;
}

/// The lines of `text` that contain `part`.
std::vector<std::string> lines_with(const std::string& text, const std::string& part) {
  std::vector<std::string> found;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.find(part) != std::string::npos)
      found.push_back(line);
  return found;
}

} // namespace

BOOST_FIXTURE_TEST_SUITE(node_bounds, link_fixture)

BOOST_AUTO_TEST_CASE(a_frame_beyond_the_budget_waits_for_a_release_and_one_frame_always_goes) {
  auto budget = std::make_shared<receive_budget>(1000);
  auto woken = std::make_shared<std::atomic<int>>(0);
  budget->on_room([woken] { ++*woken; });
  auto pool = std::make_shared<receive_buffer_pool>(std::size_t{1} << 20);
  frame_receiver first(pool, {});
  frame_receiver second(pool, {});
  first.set_budget(budget);
  second.set_budget(budget);
  auto values = ramp(150); // a frame of about 700 bytes
  const auto frame = wire::encode(make_push(1, *values)).flatten();
  BOOST_TEST_REQUIRE(frame.size() < 1000u);
  BOOST_TEST_REQUIRE(frame.size() > 500u);

  std::vector<char> buffer;
  auto held = feed(first, buffer, frame);
  BOOST_TEST_REQUIRE(held.frame.has_value());
  BOOST_TEST(budget->stats().in_use == frame.size());

  // The second frame's prefix is read; its body is not allocated while the first is held.
  std::vector<char> other(8);
  std::memcpy(other.data(), frame.data(), 8);
  auto wait = second.consume(other);
  BOOST_TEST(wait.waits_for_budget);
  BOOST_TEST(!wait.fatal());
  BOOST_TEST(second.waits_for_budget());
  BOOST_TEST(second.body_bytes() == 0u);
  BOOST_TEST(budget->stats().waits == 1u);
  BOOST_TEST(second.resume(&other).waits_for_budget); // still no room: waits again
  BOOST_TEST(woken->load() == 0);

  held.frame.reset(); // the release wakes whoever waits, once
  BOOST_TEST(woken->load() == 1);
  BOOST_TEST(budget->stats().in_use == 0u);
  auto go = second.resume(&other);
  BOOST_TEST_REQUIRE(!go.waits_for_budget);
  BOOST_TEST_REQUIRE(go.next_read == frame.size() - 8);
  std::memcpy(other.data(), frame.data() + 8, frame.size() - 8);
  auto done = second.consume(other);
  BOOST_TEST_REQUIRE(done.frame.has_value());
  BOOST_TEST((std::get<wire::push>(done.frame->msg) == make_push(1, *values)));
  BOOST_TEST(budget->stats().in_use == frame.size());
  done.frame.reset();

  // A frame larger than the whole budget still goes when nothing else is held.
  auto big = ramp(1000);
  auto alone = feed(first, buffer, wire::encode(make_push(2, *big)).flatten());
  BOOST_TEST_REQUIRE(alone.frame.has_value());
  BOOST_TEST(budget->stats().in_use > 1000u);
  BOOST_TEST(budget->stats().peak > 1000u);
  alone.frame.reset();
  BOOST_TEST(budget->stats().in_use == 0u);
}

BOOST_AUTO_TEST_CASE(connections_beyond_the_node_budget_stop_being_read_and_resume_on_release) {
  for (const bool tls : {false, true}) {
    BOOST_TEST_CONTEXT("tls " << tls) {
      auto keeper = spawn_keeper(*sys, spawned);
      auto options = tls ? tls_data_port() : data_server_options{};
      options.route = [keeper](const envelope&) {
        return caf::actor_cast<request_handler>(keeper);
      };
      options.tuning.limits.max_frame_bytes = 64 << 10;
      options.receive_budget_bytes = 160 << 10; // four frames of 40 KiB
      options.max_send_queue_bytes = 64 << 10;
      auto server = start_server(std::move(options));
      caf::scoped_actor self{*sys};
      auto values = ramp(10'000); // a frame of about 40 KiB
      constexpr int links = 3;
      constexpr std::uint64_t per_link = 4;
      std::vector<caf::actor> clients;
      for (int i = 0; i < links; ++i) {
        auto link_options = tls ? tls_link(testing::job_certs()) : data_link_options{};
        link_options.tuning.limits.max_frame_bytes = 64 << 10;
        link_options.tag = static_cast<std::uint64_t>(i);
        clients.push_back(connect(server.port, self, std::move(link_options)));
      }
      for (auto& link : clients)
        for (std::uint64_t r = 1; r <= per_link; ++r)
          self->send(link, envelope{make_push(r, *values), values, 0});
      auto count = [&] {
        std::size_t n = 0;
        self->request(keeper, patience, caf::get_atom::value)
            .receive([&](std::size_t got) { n = got; }, [](const caf::error&) {});
        return n;
      };
      // Four frames fit; the others wait at their connections, which stay open and unread.
      auto held = await_stats([&] { return stats_of(server, 1); },
                              [&](const data_link_stats& s) { return s.budget_waits > 0; });
      BOOST_TEST(held.budget == (160u << 10));
      BOOST_TEST(held.budget_waits > 0u);
      const auto until = std::chrono::steady_clock::now() + patience;
      while (count() < 4u && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(10ms);
      // And no more than four, however long the others wait.
      std::this_thread::sleep_for(100ms);
      const std::size_t first = count();
      BOOST_TEST(first == 4u);
      const auto now = stats_of(server, 1);
      BOOST_TEST(now.budget_in_use <= (160u << 10));
      BOOST_TEST(now.budget_peak <= (160u << 10));
      BOOST_TEST(await_disconnects(0).empty());
      // Releasing lets every waiting frame in, in turn.
      std::size_t total = first;
      const auto all_in = std::chrono::steady_clock::now() + patience;
      while (total < links * per_link && std::chrono::steady_clock::now() < all_in) {
        self->send(keeper, release_atom::value);
        std::this_thread::sleep_for(20ms);
        total = count();
      }
      BOOST_TEST(total == links * per_link);
      self->send(keeper, release_atom::value);
      const auto after =
          await_stats([&] { return stats_of(server, 1); },
                      [&](const data_link_stats& s) { return s.budget_in_use == 0; });
      BOOST_TEST(after.budget_in_use == 0u);
      BOOST_TEST(after.budget_peak <= (160u << 10));
      for (auto& link : clients)
        self->send(link, stop_atom::value);
      BOOST_TEST(await_disconnects(links).size() == static_cast<std::size_t>(links));
    }
  }
}

BOOST_AUTO_TEST_CASE(
    a_peer_that_stalls_inside_a_frame_is_closed_and_one_idle_between_frames_is_not) {
  stderr_capture log;
  auto options = with_token();
  options.stalled_frame_timeout = 200ms;
  options.tuning.log = logger("bounds test", 1);
  auto server = start_server(std::move(options));
  raw_peer in_prefix(server.port);
  raw_peer in_body(server.port);
  raw_peer idle(server.port);
  for (auto* peer : {&in_prefix, &in_body, &idle})
    BOOST_TEST_REQUIRE(peer->handshake(0, job_token).has_value());
  auto values = ramp(1000);
  const auto frame = push_bytes(1, *values);
  expect_echoed(idle, 1, 1000);
  const auto started = std::chrono::steady_clock::now();
  BOOST_TEST_REQUIRE(in_prefix.send(std::span(frame).first(3)));
  BOOST_TEST_REQUIRE(in_body.send(std::span(frame).first(frame.size() / 2)));
  const auto closed = await_disconnects(2);
  const auto waited = std::chrono::steady_clock::now() - started;
  BOOST_TEST(closed.size() == 2u);
  // The kernel's clock has a few ms of grain, and the bytes arrived just before `started`.
  BOOST_TEST(waited >= 150ms);
  // Closed for its stall, not at the end of some other wait (a generous bound).
  BOOST_TEST(waited < 20s);
  BOOST_TEST(in_prefix.read_until_closed(patience).second);
  BOOST_TEST(in_body.read_until_closed(patience).second);
  // The idle peer, silent between frames far longer than the timeout, is still served.
  std::this_thread::sleep_for(300ms);
  expect_echoed(idle, 2, 1000);
  const auto text = log.text();
  log.restore();
  BOOST_TEST(contains(text, "began a frame and sent nothing more"), text);
  BOOST_TEST(contains(text, "the peer 127.0.0.1:"), text);
  idle.close();
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(
    a_peer_that_does_not_read_its_replies_loses_its_socket_at_once_and_nobody_else) {
  stderr_capture log;
  auto options = with_token();
  options.max_send_queue_bytes = 1 << 20;
  options.stalled_frame_timeout = std::chrono::milliseconds{300};
  options.tuning.limits.max_frame_bytes = 256 << 10;
  options.tuning.max_bytes_in_flight = 256 << 10;
  options.tuning.log = logger("bounds test", 1);
  auto server = start_server(std::move(options));
  caf::scoped_actor self{*sys};
  auto good_options = client_with(job_token);
  good_options.tuning.limits.max_frame_bytes = 256 << 10;
  auto good = connect(server.port, self, std::move(good_options));
  auto small = ramp(100);
  expect_round_trip(self, good, 1, small);

  raw_peer flooder(server.port);
  BOOST_TEST_REQUIRE(flooder.handshake(0, job_token).has_value()); // window 0: no credit needed
  const std::uint16_t flooder_port = local_port_of(flooder.fd);
  // The server's end of the flooder's connection: one established socket, held by this process.
  const auto server_end = server_ends(server.port, flooder_port);
  BOOST_TEST_REQUIRE(server_end.size() == 1u);
  BOOST_TEST(server_end.front().state == testing::tcp_established);
  BOOST_TEST_REQUIRE(testing::socket_inodes().count(server_end.front().inode) == 1u);
  // Echoed pushes of 128 KiB, never read: 25 MiB, within the server's window (64 MiB). The
  // kernel's buffers fill, then the server's queue; beyond max_send_queue_bytes the requests
  // wait unrouted (or, when they were routed before their replies came, the replies queue beyond
  // the bound), and as the socket takes none of the queue, the peer is closed.
  auto values = ramp(32 << 10);
  const auto frame = push_bytes(7, *values);
  for (std::size_t sent = 0; sent < 200; ++sent)
    if (!flooder.send(frame))
      break;
  const auto closed = await_disconnects(1);
  BOOST_TEST(closed.size() == 1u);
  // Gone at once: the server's socket (the kernel forgot it) and its descriptor; the flooder,
  // which has still not read a byte of its replies, sees a reset. (A graceful close kept both
  // until the flooder read what the server had queued for it, or left.)
  const auto until = std::chrono::steady_clock::now() + patience;
  while (!server_ends(server.port, flooder_port).empty() &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(2ms);
  BOOST_TEST(server_ends(server.port, flooder_port).empty());
  BOOST_TEST(testing::socket_inodes().count(server_end.front().inode) == 0u);
  int error = 0;
  socklen_t size = sizeof error;
  BOOST_TEST(::getsockopt(flooder.fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0);
  BOOST_TEST(error == ECONNRESET, "SO_ERROR " << error);
  // The well-behaved link goes on.
  expect_round_trip(self, good, 2, small);
  const auto text = log.text();
  log.restore();
  BOOST_TEST(contains(text, "is not reading its replies"), text);
  BOOST_TEST(contains(text, "bytes queued (max_send_queue_bytes 1048576), none taken for"), text);
  flooder.close();
  self->send(good, stop_atom::value);
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_worker_pulling_more_than_the_send_queue_at_once_is_slowed_not_cut_off) {
  auto options = with_token();
  options.max_send_queue_bytes = 1 << 20;
  options.stalled_frame_timeout = std::chrono::milliseconds{2000};
  options.tuning.limits.max_frame_bytes = 256 << 10;
  options.tuning.max_bytes_in_flight = 256 << 10;
  auto server = start_server(std::move(options));
  caf::scoped_actor self{*sys};
  auto client_options = client_with(job_token);
  client_options.tuning.limits.max_frame_bytes = 256 << 10;
  client_options.tuning.receive_window_bytes = 512 << 10;
  auto link = connect(server.port, self, std::move(client_options));
  // 40 requests of 128 KiB at once: 5 MiB of replies, five times the send queue's bound and ten
  // times the client's window. The client reads them slowly (75 ms each, 3 s in all, longer than
  // the stall timeout of 2 s, whose margin over one pause covers a loaded machine) but steadily:
  // every reply arrives, in order, and nobody is closed.
  constexpr std::uint64_t requests = 40;
  auto values = ramp(32 << 10);
  for (std::uint64_t id = 1; id <= requests; ++id)
    self->send(link, envelope{make_push(id, *values), values, 0});
  for (std::uint64_t id = 1; id <= requests; ++id) {
    std::this_thread::sleep_for(std::chrono::milliseconds{75});
    auto reply = next_envelope(self);
    BOOST_TEST_REQUIRE(reply.has_value());
    BOOST_TEST_REQUIRE(std::holds_alternative<wire::push>(reply->msg));
    BOOST_TEST_REQUIRE((std::get<wire::push>(reply->msg) == make_push(id, *values)));
  }
  BOOST_TEST(await_disconnects(1, std::chrono::milliseconds{500}).empty());
  self->send(link, stop_atom::value);
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_budget_or_send_queue_below_the_frame_cap_is_a_caller_error) {
  for (auto set : {+[](data_server_options& o) { o.receive_budget_bytes = 1000; },
                   +[](data_server_options& o) { o.max_send_queue_bytes = 1000; }}) {
    data_server_options options;
    options.route = [](const envelope&) { return request_handler{}; };
    options.tuning.limits.max_frame_bytes = 4096;
    set(options);
    auto server = spawn_data_server(*sys, "127.0.0.1", 0, options);
    BOOST_TEST_REQUIRE(!server.has_value());
    BOOST_TEST((server.error().code() == errc::invalid_argument));
    BOOST_TEST(contains(server.error().message(), "below limits.max_frame_bytes"));
  }
}

BOOST_AUTO_TEST_CASE(a_body_above_the_step_reserves_one_step_at_a_time_as_its_bytes_arrive) {
  constexpr std::size_t step = 4096;
  auto pool = std::make_shared<receive_buffer_pool>(std::size_t{1} << 20);
  auto values = ramp(20'000); // a body of about 80 KiB: 20 steps
  const auto frame = push_bytes(4, *values);
  BOOST_TEST_REQUIRE(frame.size() > 16 * step);
  // An ample budget, and one smaller than the frame, which then goes alone.
  for (const std::uint64_t limit : {std::uint64_t{1} << 20, std::uint64_t{16} << 10}) {
    BOOST_TEST_CONTEXT("budget " << limit) {
      auto budget = std::make_shared<receive_budget>(limit);
      frame_receiver receiver(pool, {});
      receiver.set_budget(budget);
      receiver.set_receive_step(step);
      std::vector<char> scribe_buffer;
      auto out = feed_prefix(receiver, scribe_buffer, frame);
      // The prefix and the first step are reserved, not the body; the body is committed.
      BOOST_TEST_REQUIRE(out.next_read == step);
      BOOST_TEST(budget->stats().in_use == wire::frame_prefix_bytes + step);
      BOOST_TEST(budget->stats().committed == frame.size());
      BOOST_TEST(receiver.body_bytes() == frame.size() - wire::frame_prefix_bytes);
      std::size_t at = wire::frame_prefix_bytes;
      std::size_t steps = 0;
      while (!out.frame) {
        BOOST_TEST_REQUIRE(!out.error.has_value());
        BOOST_TEST_REQUIRE(!out.waits_for_budget);
        scribe_buffer.resize(out.next_read);
        std::memcpy(scribe_buffer.data(), frame.data() + at, out.next_read);
        at += out.next_read;
        out = receiver.consume(scribe_buffer);
        ++steps;
        if (out.frame)
          break;
        // Reserved: what arrived, and the step being read; nothing more.
        BOOST_TEST(receiver.body_bytes_arrived() == at - wire::frame_prefix_bytes);
        BOOST_TEST(budget->stats().in_use == at + out.next_read);
        BOOST_TEST(out.next_read <= step);
      }
      BOOST_TEST(steps == (frame.size() - wire::frame_prefix_bytes + step - 1) / step);
      BOOST_TEST(at == frame.size());
      BOOST_TEST((std::get<wire::push>(out.frame->msg) == make_push(4, *values)));
      // The whole frame is reserved now, until it is released; the commitment is spent; the
      // scribe reads the next prefix into a small buffer again.
      BOOST_TEST(budget->stats().in_use == frame.size());
      BOOST_TEST(budget->stats().committed == 0u);
      BOOST_TEST(budget->stats().peak == frame.size());
      BOOST_TEST(scribe_buffer.size() == wire::frame_prefix_bytes);
      BOOST_TEST(receiver.frames_read() == 1u);
      out.frame.reset();
      BOOST_TEST(budget->stats().in_use == 0u);
    }
  }
}

BOOST_AUTO_TEST_CASE(claims_that_wait_are_served_in_turn_and_new_claims_queue_behind_them) {
  auto pool = std::make_shared<receive_buffer_pool>(std::size_t{1} << 20);
  auto small_values = ramp(150);
  auto large_values = ramp(300);
  const auto small = push_bytes(1, *small_values);
  const auto large = push_bytes(2, *large_values);
  // The large frame does not fit beside a small one; two small ones fit.
  const std::uint64_t limit = small.size() + large.size() - 1;
  BOOST_TEST_REQUIRE(2 * small.size() <= limit);
  auto budget = std::make_shared<receive_budget>(limit);
  auto woken = std::make_shared<std::atomic<int>>(0);
  budget->on_room([woken] { ++*woken; });
  frame_receiver holder(pool, {});
  frame_receiver first(pool, {});
  frame_receiver second(pool, {});
  for (auto* receiver : {&holder, &first, &second})
    receiver->set_budget(budget);
  std::vector<char> holder_buffer, first_buffer, second_buffer;

  auto held = feed(holder, holder_buffer, small);
  BOOST_TEST_REQUIRE(held.frame.has_value());
  BOOST_TEST_REQUIRE(feed_prefix(first, first_buffer, large).waits_for_budget);
  // The second's frame would fit beside the held one, but the first waits: it queues behind.
  BOOST_TEST(budget->stats().in_use + small.size() <= limit);
  BOOST_TEST_REQUIRE(feed_prefix(second, second_buffer, small).waits_for_budget);
  BOOST_TEST(budget->stats().queued == 2u);
  BOOST_TEST(budget->stats().waits == 2u);

  held.frame.reset();
  BOOST_TEST(woken->load() == 1);
  // In turn: the first goes; the second, which does not fit beside it now, keeps its place.
  auto go = first.resume(&first_buffer);
  BOOST_TEST_REQUIRE(!go.waits_for_budget);
  BOOST_TEST(second.resume(&second_buffer).waits_for_budget);
  BOOST_TEST(budget->stats().queued == 1u);
  std::size_t at = wire::frame_prefix_bytes;
  auto done = feed_rest(first, first_buffer, large, at, go);
  BOOST_TEST_REQUIRE(done.frame.has_value());
  done.frame.reset();
  BOOST_TEST(woken->load() == 2);
  go = second.resume(&second_buffer);
  BOOST_TEST_REQUIRE(!go.waits_for_budget);
  BOOST_TEST(budget->stats().queued == 0u);
  at = wire::frame_prefix_bytes;
  done = feed_rest(second, second_buffer, small, at, go);
  BOOST_TEST_REQUIRE(done.frame.has_value());
  BOOST_TEST((std::get<wire::push>(done.frame->msg) == make_push(1, *small_values)));
  // Waits counted claims that had to wait, not their turns.
  BOOST_TEST(budget->stats().waits == 2u);
}

BOOST_AUTO_TEST_CASE(a_frame_waiting_to_commit_its_size_holds_up_no_other_read) {
  constexpr std::size_t step = 1024;
  auto pool = std::make_shared<receive_buffer_pool>(std::size_t{1} << 20);
  auto big_values = ramp(2000);
  auto other_values = ramp(1000);
  auto small_values = ramp(150);
  const auto big = push_bytes(1, *big_values);     // about 8 KiB: read in steps
  const auto other = push_bytes(2, *other_values); // about 4 KiB: read in steps
  const auto small = push_bytes(3, *small_values); // below the step: read whole
  const std::uint64_t limit = big.size() + other.size() - 1;
  auto budget = std::make_shared<receive_budget>(limit);
  frame_receiver reading(pool, {});
  frame_receiver committing(pool, {});
  frame_receiver whole(pool, {});
  for (auto* receiver : {&reading, &committing, &whole}) {
    receiver->set_budget(budget);
    receiver->set_receive_step(step);
  }
  std::vector<char> reading_buffer, committing_buffer, whole_buffer;
  auto in_big = feed_prefix(reading, reading_buffer, big);
  BOOST_TEST_REQUIRE(in_big.next_read == step);
  // Both frames' sizes do not fit the budget together: the second waits for its commitment...
  BOOST_TEST_REQUIRE(feed_prefix(committing, committing_buffer, other).waits_for_budget);
  BOOST_TEST(committing.waits_for_commitment());
  BOOST_TEST(budget->stats().committed == big.size());
  // ... while a frame read whole goes, though the budget has a claim waiting.
  auto went = feed(whole, whole_buffer, small);
  BOOST_TEST_REQUIRE(went.frame.has_value());
  BOOST_TEST((std::get<wire::push>(went.frame->msg) == make_push(3, *small_values)));
  went.frame.reset();
  // The first frame read to its end gives its commitment back: the second commits in its turn.
  std::size_t at = wire::frame_prefix_bytes;
  auto done = feed_rest(reading, reading_buffer, big, at, in_big);
  BOOST_TEST_REQUIRE(done.frame.has_value());
  BOOST_TEST(budget->stats().committed == 0u);
  done.frame.reset(); // held, the first frame would leave too little room for the second
  auto go = committing.resume(&committing_buffer);
  BOOST_TEST_REQUIRE(!go.waits_for_budget);
  BOOST_TEST(go.next_read == step);
  BOOST_TEST(budget->stats().committed == other.size());
  at = wire::frame_prefix_bytes;
  auto second = feed_rest(committing, committing_buffer, other, at, go);
  BOOST_TEST_REQUIRE(second.frame.has_value());
  BOOST_TEST((std::get<wire::push>(second.frame->msg) == make_push(2, *other_values)));
}

BOOST_AUTO_TEST_CASE(prefixes_announcing_big_frames_on_many_connections_starve_no_real_frames) {
  constexpr std::size_t step = 256 << 10;
  constexpr std::size_t budget_bytes = 8 << 20;
  auto options = with_token();
  options.tuning.limits.max_frame_bytes = budget_bytes;
  options.receive_budget_bytes = budget_bytes;
  options.receive_step_bytes = step;
  auto server = start_server(std::move(options));
  caf::scoped_actor self{*sys};
  auto good = connect(server.port, self, client_with(job_token));
  const auto good_id = await_connection(self, good);
  // 16 members announce frames and send nothing more: 8 frames as big as the budget, read in
  // steps, and 8 just below the step, read whole. Before, each prefix reserved its whole frame:
  // the first frame alone took the whole budget.
  std::vector<raw_peer> attackers;
  attackers.reserve(16);
  for (int i = 0; i < 16; ++i) {
    attackers.emplace_back(server.port);
    BOOST_TEST_REQUIRE(attackers.back().handshake(0, job_token).has_value());
    const std::size_t body = i % 2 == 0 ? budget_bytes - 8 : step - 64;
    BOOST_TEST_REQUIRE(attackers.back().send_prefix(body));
  }
  // The attack is in place: one big frame committed the whole budget and reads its first step,
  // the 7 other big ones wait for a commitment, and the 8 small ones each hold their frame.
  constexpr std::uint64_t small_frames = 8 * (step - 64 + 8);
  const auto held =
      await_stats([&] { return stats_of(server, good_id); },
                  [&](const data_link_stats& s) {
                    return s.budget_waits >= 7 && s.budget_in_use == 8 + step + small_frames;
                  });
  BOOST_TEST(held.budget_committed == budget_bytes);
  BOOST_TEST(held.budget_waits >= 7u);
  BOOST_TEST(held.budget_in_use == 8 + step + small_frames);
  // Real frames of 128 KiB go and come back, one after the other, each within the patience.
  auto values = ramp(32 << 10);
  const auto started = std::chrono::steady_clock::now();
  for (std::uint64_t id = 1; id <= 20; ++id)
    expect_round_trip(self, good, id, values);
  BOOST_TEST_MESSAGE("20 round trips of 128 KiB under the attack: "
                     << std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - started)
                            .count()
                     << " ms");
  BOOST_TEST(stats_of(server, good_id).budget_in_use <= 8 + step + small_frames);
  attackers.clear();
  BOOST_TEST(await_disconnects(16).size() == 16u);
  const auto after = await_stats(
      [&] { return stats_of(server, good_id); },
      [](const data_link_stats& s) { return s.budget_in_use == 0 && s.budget_committed == 0; });
  BOOST_TEST(after.budget_in_use == 0u);
  BOOST_TEST(after.budget_committed == 0u);
  self->send(good, stop_atom::value);
  BOOST_TEST(await_disconnects(1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(frames_above_the_step_arrive_whole_from_every_link_with_tls_and_without) {
  for (const bool tls : {false, true}) {
    BOOST_TEST_CONTEXT("tls " << tls) {
      // No shared-memory arena: the tensors travel in the frames.
      auto options = tls ? tls_data_port() : data_server_options{};
      options.tuning.shm_arena_bytes = 0;
      options.tuning.limits.max_frame_bytes = 1 << 20;
      options.receive_budget_bytes = 1 << 20;
      options.receive_step_bytes = 64 << 10;
      auto server = start_server(std::move(options));
      caf::scoped_actor self{*sys};
      constexpr int links = 3;
      constexpr std::uint64_t per_link = 4;
      std::vector<caf::actor> clients;
      for (int i = 0; i < links; ++i) {
        auto link_options = tls ? tls_link(testing::job_certs()) : data_link_options{};
        link_options.tag = static_cast<std::uint64_t>(i);
        clients.push_back(connect(server.port, self, std::move(link_options)));
      }
      // 400 KB frames: 7 steps each, two of them committed at once at most.
      std::vector<std::shared_ptr<std::vector<float>>> sent;
      for (int i = 0; i < links; ++i)
        sent.push_back(ramp(100'000, static_cast<float>(i)));
      for (int i = 0; i < links; ++i)
        for (std::uint64_t r = 1; r <= per_link; ++r)
          self->send(clients[static_cast<std::size_t>(i)],
                     envelope{make_push(r, *sent[static_cast<std::size_t>(i)]),
                              sent[static_cast<std::size_t>(i)], 0});
      std::vector<std::uint64_t> next(links, 1);
      for (std::uint64_t n = 0; n < links * per_link; ++n) {
        auto reply = next_envelope(self);
        BOOST_TEST_REQUIRE(reply.has_value());
        BOOST_TEST_REQUIRE(reply->connection < static_cast<std::uint64_t>(links));
        const auto link = static_cast<std::size_t>(reply->connection);
        // In order per link, byte-identical.
        BOOST_TEST_REQUIRE(std::holds_alternative<wire::push>(reply->msg));
        BOOST_TEST((std::get<wire::push>(reply->msg) == make_push(next[link]++, *sent[link])));
      }
      const auto after = await_stats(
          [&] { return stats_of(server, 1); },
          [](const data_link_stats& s) { return s.budget_in_use == 0 && s.budget_committed == 0; });
      BOOST_TEST(after.budget_in_use == 0u);
      BOOST_TEST(after.budget_committed == 0u);
      BOOST_TEST(after.budget_peak <= (1u << 20));
      BOOST_TEST(after.budget_peak > (64u << 10)); // the frames went through the budget
      for (auto& link : clients)
        self->send(link, stop_atom::value);
      BOOST_TEST(await_disconnects(links).size() == static_cast<std::size_t>(links));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_trickled_frame_is_closed_at_its_rate_deadline_and_a_steady_one_is_not) {
  stderr_capture log;
  auto options = with_token();
  // The stalled-frame timeout (30 s) alone would never close the trickle: a byte every 50 ms.
  // The steady frame goes at 16 times the minimum rate, a margin for a loaded machine.
  options.min_frame_rate = 256 << 10;
  options.frame_grace = std::chrono::milliseconds{400};
  options.receive_step_bytes = 256 << 10;
  options.tuning.log = logger("bounds test", 0); // the default verbosity
  auto server = start_server(std::move(options));
  raw_peer trickler(server.port);
  raw_peer steady(server.port);
  for (auto* peer : {&trickler, &steady})
    BOOST_TEST_REQUIRE(peer->handshake(0, job_token).has_value());
  const std::uint16_t trickler_port = local_port_of(trickler.fd);
  auto values = ramp(1 << 20);
  const auto frame = push_bytes(1, *values); // 4 MiB, 16 steps
  BOOST_TEST_REQUIRE(trickler.send(std::span(frame).first(wire::frame_prefix_bytes)));
  const auto started = std::chrono::steady_clock::now();
  // The same frame at about 4 MiB/s, 16 times the rate and longer than the grace: it goes.
  std::thread steady_sender([&] {
    constexpr std::size_t piece = 64 << 10;
    for (std::size_t at = 0; at < frame.size(); at += piece) {
      if (!steady.send(std::span(frame).subspan(at, std::min(piece, frame.size() - at))))
        return;
      std::this_thread::sleep_for(std::chrono::milliseconds{16});
    }
  });
  std::atomic<bool> trickling{true};
  std::thread trickle([&] {
    for (std::size_t at = wire::frame_prefix_bytes; trickling && at < frame.size(); ++at) {
      if (!trickler.send(std::span(frame).subspan(at, 1)))
        return;
      std::this_thread::sleep_for(std::chrono::milliseconds{50});
    }
  });
  const auto closed = await_disconnects(1);
  const auto waited = std::chrono::steady_clock::now() - started;
  trickling = false;
  trickle.join();
  steady_sender.join();
  BOOST_TEST_REQUIRE(closed.size() == 1u);
  BOOST_TEST(closed.front() == 1u); // the trickler's connection, the first
  BOOST_TEST(waited >= std::chrono::milliseconds{400});
  // Closed at its deadline, not at the end of some other wait (a generous bound).
  BOOST_TEST(waited < std::chrono::seconds{20});
  auto echoed = steady.receive_reply();
  BOOST_TEST_REQUIRE(echoed.has_value());
  BOOST_TEST((std::get<wire::push>(*echoed) == make_push(1, *values)));
  BOOST_TEST(trickler.read_until_closed(patience).second);
  // Everything the trickle held is back.
  const auto after = await_stats(
      [&] { return stats_of(server, 2); },
      [](const data_link_stats& s) { return s.budget_in_use == 0 && s.budget_committed == 0; });
  BOOST_TEST(after.budget_in_use == 0u);
  BOOST_TEST(after.budget_committed == 0u);
  steady.close();
  BOOST_TEST(await_disconnects(1).size() == 1u);
  const auto text = log.text();
  log.restore();
  // A warning at the default verbosity, naming the peer and the numbers; the other connection's
  // ordinary events print nothing.
  const auto warned =
      lines_with(text, "closed the peer 127.0.0.1:" + std::to_string(trickler_port) + " ");
  BOOST_TEST_REQUIRE(warned.size() == 1u, text);
  BOOST_TEST(contains(warned.front(), " W troupe bounds test: "), text);
  BOOST_TEST(contains(warned.front(), "it sends its frame too slowly: "), text);
  BOOST_TEST(contains(warned.front(), "(4194" /* body bytes announced */), text);
  BOOST_TEST(contains(warned.front(), "min_frame_rate 262144 bytes/s after frame_grace 400 ms"),
             text);
  BOOST_TEST(lines_with(text, "data server").size() == 1u, text);
}

BOOST_AUTO_TEST_CASE(closures_print_at_the_default_verbosity_and_a_flood_of_them_is_summed_up) {
  stderr_capture log;
  auto server = start_server([] {
    auto options = with_token();
    options.tuning.log = logger("bounds test", 0);
    return options;
  }());
  // Peers that break the framing after their handshake (a length above the cap), closed one
  // after the other until a line has summed up those not shown.
  const std::string closure = "data server: closed the peer 127.0.0.1:";
  const std::string summed = " more peers closed since the last such line;";
  std::size_t closed = 0;
  for (; closed < 200; ++closed) {
    raw_peer breaker(server.port);
    BOOST_TEST_REQUIRE(breaker.handshake(0, job_token).has_value());
    BOOST_TEST_REQUIRE(breaker.send_prefix(std::uint64_t{1} << 40));
    BOOST_TEST_REQUIRE(breaker.read_until_closed(patience).second);
    BOOST_TEST_REQUIRE(await_disconnects(1).size() == 1u);
    // After a burst of lines, one a second at most: pace the last ones so that one gets through.
    if (closed >= 20) {
      if (!lines_with(log.text(), summed).empty())
        break;
      std::this_thread::sleep_for(50ms);
    }
  }
  ++closed;
  const auto text = log.text();
  log.restore();
  const auto shown = lines_with(text, closure);
  BOOST_TEST(contains(text, summed), text);
  BOOST_TEST(shown.size() < closed, text);
  // Every closure was shown, or counted in the next line shown; the last line shown just now
  // took the count of all before it.
  std::size_t counted = 0;
  for (const auto& line : shown) {
    BOOST_TEST(contains(line, " W troupe bounds test: "), line);
    BOOST_TEST(contains(line, "it sent a frame that breaks the framing or the link protocol: "
                              "frame_too_large: "),
               line);
    if (const auto at = line.find("(and "); at != std::string::npos)
      counted += std::stoul(line.substr(at + 5));
  }
  BOOST_TEST(shown.size() + counted == closed, text);
  // Ordinary connection events print nothing at the default verbosity.
  BOOST_TEST(lines_with(text, "data server").size() == shown.size(), text);
}

BOOST_AUTO_TEST_SUITE_END()

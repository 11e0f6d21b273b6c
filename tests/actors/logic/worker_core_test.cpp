// A KVStore worker's rules driven call by call and reply by reply, with no network, no actors and
// a clock the test moves: sync credit, the order of one ps-key's requests, the reassembly of a
// key split over servers, replies nobody asked for, timeouts, the resend after a server restarts
// from its checkpoint, and the failure of everything under way.

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/logic/wire_conversions.hpp"
#include "actors/logic/worker_core.hpp"
#include "engine/gradient_compression.hpp"
#include "schema/chunking.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

/// Runs a worker_core and is its output: what it sends is kept in order, per server; copies
/// handed elsewhere, reports of lost links and relinks wait until the test runs them.
struct worker_driver : worker_core::output {
  worker_clock::time_point now{};
  struct frame {
    std::uint32_t server = 0;
    envelope request;
    send_receipt receipt;
  };
  std::vector<frame> sent;
  std::vector<std::pair<std::uint64_t, std::function<std::pair<chunk_copy, std::string>()>>> copies;
  std::vector<std::string> lost_reports;
  std::vector<wire::node_info> relinks;
  std::unique_ptr<worker_core> core;

  explicit worker_driver(worker_core_options options) {
    options.clock = [this] { return now; };
    const auto servers = options.num_servers;
    core = std::make_unique<worker_core>(std::move(options), *this);
    // The servers' names, given once the core exists (on_links), as the actor does.
    std::vector<std::string> names;
    for (std::uint32_t s = 0; s < servers; ++s)
      names.push_back("server " + std::to_string(s) + " (node " + std::to_string(8 + 2 * s) + ")");
    core->on_links(std::move(names));
  }

  void send(std::uint32_t server, envelope request, send_receipt receipt) override {
    sent.push_back({server, std::move(request), receipt});
  }
  /// Frame `index` of those sent has left its link.
  void left(std::size_t index) { core->frame_left(sent.at(index).receipt); }
  void copy_elsewhere(std::uint64_t id,
                      std::function<std::pair<chunk_copy, std::string>()> copy) override {
    copies.emplace_back(id, std::move(copy));
  }
  void report_lost_later(std::uint64_t, std::string why) override {
    lost_reports.push_back(std::move(why));
  }
  void relink(const wire::node_info& server) override { relinks.push_back(server); }

  /// One key of a call: its index, the value it sends (init, push, pushpull) and where its value
  /// goes (pull, pushpull).
  static kv_key_work key(std::int64_t index, const ndarray& value,
                         std::vector<ndarray> outputs = {}) {
    kv_key_work work;
    work.index = index;
    work.name = std::to_string(index);
    work.shape = value.shape();
    work.type = value.dtype();
    if (outputs.empty() || !value.is_none())
      work.value = value;
    work.outputs = std::move(outputs);
    return work;
  }
  /// A pull of `index` into `output`.
  static kv_key_work pull_key(std::int64_t index, const ndarray& output) {
    kv_key_work work;
    work.index = index;
    work.name = std::to_string(index);
    work.shape = output.shape();
    work.type = output.dtype();
    work.outputs = {output};
    return work;
  }

  completion<status> call(kv_call kind, std::vector<kv_key_work> keys, int priority = 0) {
    kv_operation op;
    op.call = kind;
    op.keys = std::move(keys);
    op.what = kind == kv_call::pull ? "pull" : kind == kv_call::push ? "push" : "pushpull";
    op.priority = priority;
    core->on_call(op);
    return op.done;
  }

  /// The messages sent so far of kind T, in order.
  template <class T>
  std::vector<T> sent_of() const {
    std::vector<T> out;
    for (const auto& f : sent)
      if (const auto* m = std::get_if<T>(&f.request.msg))
        out.push_back(*m);
    return out;
  }

  void reply(wire::message msg, std::uint32_t server = 0) {
    envelope e{std::move(msg), nullptr, server + 1};
    core->on_reply(e);
  }
  void ack(std::uint64_t id, std::uint64_t completed, std::uint64_t durable = 0) {
    reply(wire::ack{id, completed, false, durable});
  }
  /// Answers pull `id` of ps-key `key` with `value` (float32, whole shape `shape`), cut in chunks
  /// of `chunk_bytes`.
  void answer_pull(const wire::pull_request& pull, const ndarray& value, std::size_t chunk_bytes,
                   std::uint32_t server, std::vector<std::int64_t> shape = {}) {
    wire::tensor_chunk tensor;
    tensor.type = to_wire(value.dtype());
    if (shape.empty())
      tensor.shape.assign(value.shape().begin(), value.shape().end());
    else
      tensor.shape.assign(shape.begin(), shape.end());
    tensor.total_bytes = value.nbytes();
    tensor.data = {static_cast<const std::byte*>(value.raw_data()), value.nbytes()};
    wire::chunker chunks{wire::pull_reply{pull.request_id, pull.key, pull.round + 1, tensor},
                         chunk_bytes};
    for (std::size_t c = 0; c < chunks.chunk_count(); ++c)
      reply(chunks.chunk(c), server);
  }
};

worker_core_options one_server(std::uint32_t max_rounds_ahead = 2) {
  worker_core_options options;
  options.send_window_bytes = 0; // the send queue has tests of its own
  options.num_servers = 1;
  options.max_rounds_ahead = max_rounds_ahead;
  options.request_timeout = 1000ms;
  return options;
}

/// `options` for a worker whose servers may restart from their checkpoints: a lost server's
/// requests wait up to `rejoin` for it, and the worker links to it again.
worker_core_options with_restarts(worker_core_options options,
                                  std::chrono::milliseconds rejoin = 5000ms) {
  options.server_rejoin = rejoin;
  options.can_relink = true;
  return options;
}

std::unique_ptr<worker_driver> driver_for(worker_core_options options) {
  return std::make_unique<worker_driver>(std::move(options));
}

std::vector<float> floats(const ndarray& array) {
  std::vector<float> values(static_cast<std::size_t>(array.size()));
  std::memcpy(values.data(), array.raw_data(), values.size() * sizeof(float));
  return values;
}

bool delivered_ok(const completion<status>& done) {
  auto got = done.peek();
  return got && got->has_value();
}

std::optional<error> delivered_error(const completion<status>& done) {
  auto got = done.peek();
  if (!got || got->has_value())
    return std::nullopt;
  return got->error();
}

} // namespace

BOOST_AUTO_TEST_SUITE(worker_rules)

BOOST_AUTO_TEST_CASE(a_push_beyond_max_rounds_ahead_waits_until_an_ack_brings_credit) {
  auto d = driver_for(one_server(2));
  auto value = ndarray::full({4}, 1.0);
  auto first = d->call(kv_call::push, {worker_driver::key(3, value)});
  auto second = d->call(kv_call::push, {worker_driver::key(3, value)});
  auto third = d->call(kv_call::push, {worker_driver::key(3, value)});
  // Rounds 0 and 1 go (0 < 0 + 2, 1 < 0 + 2); round 2 waits for credit, holding its tensor.
  auto pushes = d->sent_of<wire::push>();
  BOOST_TEST_REQUIRE(pushes.size() == 2u);
  BOOST_TEST(pushes[0].round == 0u);
  BOOST_TEST(pushes[1].round == 1u);
  BOOST_TEST(d->core->waiting_for_credit(pushes[0].key) == 1u);
  BOOST_TEST(!third.ready());

  // The server completed round 1 (its ack of round 0 says so): round 2 may go.
  d->ack(pushes[0].request_id, 1);
  BOOST_TEST(delivered_ok(first));
  pushes = d->sent_of<wire::push>();
  BOOST_TEST_REQUIRE(pushes.size() == 3u);
  BOOST_TEST(pushes[2].round == 2u);
  BOOST_TEST(d->core->waiting_for_credit(pushes[0].key) == 0u);
  d->ack(pushes[1].request_id, 1);
  d->ack(pushes[2].request_id, 1);
  BOOST_TEST(delivered_ok(second));
  BOOST_TEST(delivered_ok(third));
  BOOST_TEST(d->core->under_way() == 0u);
}

BOOST_AUTO_TEST_CASE(a_pull_behind_a_push_without_credit_waits_and_leaves_after_it) {
  auto d = driver_for(one_server(1));
  auto value = ndarray::full({2}, 5.0);
  auto out = ndarray::zeros({2});
  d->call(kv_call::push, {worker_driver::key(0, value)});
  d->call(kv_call::push, {worker_driver::key(0, value)});
  auto pulled = d->call(kv_call::pull, {worker_driver::pull_key(0, out)});
  // A pull needs no credit, but the push before it has none: the pull keeps its place.
  BOOST_TEST(d->sent_of<wire::push>().size() == 1u);
  BOOST_TEST(d->sent_of<wire::pull_request>().empty());
  d->ack(d->sent_of<wire::push>()[0].request_id, 1);
  // Now the second push, then the pull of its round, in that order.
  BOOST_TEST_REQUIRE(d->sent.size() == 3u);
  const auto* push = std::get_if<wire::push>(&d->sent[1].request.msg);
  const auto* pull = std::get_if<wire::pull_request>(&d->sent[2].request.msg);
  BOOST_TEST_REQUIRE(push != nullptr);
  BOOST_TEST_REQUIRE(pull != nullptr);
  BOOST_TEST(push->round == 1u);
  BOOST_TEST(pull->round == 2u); // the value after both pushes
  BOOST_TEST(!pulled.ready());
}

BOOST_AUTO_TEST_CASE(a_key_split_over_servers_is_reassembled_from_chunks_into_every_output) {
  auto options = one_server();
  options.num_servers = 2;
  options.bigarray_bound = 8; // 10 elements: split, 5 on each server
  auto d = driver_for(options);
  auto first = ndarray::zeros({10}), second = ndarray::zeros({10});
  kv_key_work work = worker_driver::pull_key(7, first);
  work.outputs.push_back(second);
  auto pulled = d->call(kv_call::pull, {work});
  auto pulls = d->sent_of<wire::pull_request>();
  BOOST_TEST_REQUIRE(pulls.size() == 2u);
  BOOST_TEST(d->sent[0].server == 0u);
  BOOST_TEST(d->sent[1].server == 1u);

  // Each server answers its slice of 5 floats in chunks of 8 bytes (3 chunks), the second first.
  auto low = ndarray::from_values({1, 2, 3, 4, 5}, {5});
  auto high = ndarray::from_values({6, 7, 8, 9, 10}, {5});
  d->answer_pull(pulls[1], high, 8, 1);
  BOOST_TEST(!pulled.ready());
  BOOST_TEST(floats(first) == std::vector<float>(10, 0.0f)); // staged until every slice is in
  d->answer_pull(pulls[0], low, 8, 0);
  BOOST_TEST_REQUIRE(delivered_ok(pulled));
  const std::vector<float> expected{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  BOOST_TEST(floats(first) == expected);
  BOOST_TEST(floats(second) == expected);
}

BOOST_AUTO_TEST_CASE(keys_are_placed_over_the_key_ranges_and_sent_to_the_servers_holding_them) {
  // Two servers, four key ranges (job.max_servers 4): ranges 0 and 2 on server 0, 1 and 3 on 1.
  auto options = one_server();
  options.num_servers = 2;
  options.range_owner = {0, 1, 0, 1};
  options.bigarray_bound = 8;
  auto d = driver_for(options);
  const auto range_size = max_key / 4;
  // Key 2 of 3 elements lives whole in range (2 * 9973) % 4 = 2, held by server 0.
  auto small = ndarray::zeros({3});
  auto pulled = d->call(kv_call::pull, {worker_driver::pull_key(2, small)});
  auto pulls = d->sent_of<wire::pull_request>();
  BOOST_TEST_REQUIRE(pulls.size() == 1u);
  BOOST_TEST(d->sent[0].server == 0u);
  BOOST_TEST(pulls[0].key == range_size * 2 + 2);
  // Key 7 of 12 elements is split over the four ranges, 3 elements each, two parts per server.
  auto large = ndarray::zeros({12});
  d->sent.clear();
  auto split = d->call(kv_call::pull, {worker_driver::pull_key(7, large)});
  pulls = d->sent_of<wire::pull_request>();
  BOOST_TEST_REQUIRE(pulls.size() == 4u);
  for (std::size_t range = 0; range < 4; ++range) {
    BOOST_TEST(d->sent[range].server == options.range_owner[range]);
    BOOST_TEST(pulls[range].key == range_size * range + 7);
  }
  for (std::size_t range = 0; range < 4; ++range) {
    const float base = static_cast<float>(range * 3);
    d->answer_pull(pulls[range], ndarray::from_values({base, base + 1, base + 2}, {3}), 64,
                   options.range_owner[range]);
  }
  BOOST_TEST_REQUIRE(delivered_ok(split));
  std::vector<float> expected(12);
  std::iota(expected.begin(), expected.end(), 0.0f);
  BOOST_TEST(floats(large) == expected);
}

BOOST_AUTO_TEST_CASE(requests_of_a_key_range_that_moved_go_again_once_to_its_new_server) {
  // Two servers, two key ranges; key 1 lives in range (1 * 9973) % 2 = 1, on server 1.
  auto options = one_server();
  options.num_servers = 2;
  options.range_owner = {0, 1};
  auto d = driver_for(options);
  auto gradient = ndarray::full({2}, 3.0), out = ndarray::zeros({2});
  auto pushed = d->call(kv_call::push, {worker_driver::key(1, gradient)});
  auto pulled = d->call(kv_call::pull, {worker_driver::pull_key(1, out)});
  auto pushes = d->sent_of<wire::push>();
  auto pulls = d->sent_of<wire::pull_request>();
  BOOST_TEST_REQUIRE(pushes.size() == 1u);
  BOOST_TEST_REQUIRE(pulls.size() == 1u);
  BOOST_TEST(d->sent[0].server == 1u);
  // Server 1 handed the range over: it refuses the push as moved and never answers the pull.
  d->reply(wire::error_reply{pushes[0].request_id, pushes[0].key, wire::error_code::moved,
                             "key range 1 has left server 1"},
           1);
  BOOST_TEST(!pushed.ready());
  BOOST_TEST(d->core->under_way() == 2u);
  d->sent.clear();
  const auto range_size = max_key / 2;
  d->core->on_membership(
      wire::membership{2, 1, 2, {}, {{0, range_size, 0, 0}, {range_size, max_key, 0, 0}}});
  // Both go again to server 0, in the order they first left, with their rounds.
  BOOST_TEST_REQUIRE(d->sent.size() == 2u);
  BOOST_TEST(d->sent[0].server == 0u);
  BOOST_TEST(d->sent[1].server == 0u);
  const auto* again = std::get_if<wire::push>(&d->sent[0].request.msg);
  const auto* pull_again = std::get_if<wire::pull_request>(&d->sent[1].request.msg);
  BOOST_TEST_REQUIRE(again != nullptr);
  BOOST_TEST_REQUIRE(pull_again != nullptr);
  BOOST_TEST(again->resent);
  BOOST_TEST(again->round == pushes[0].round);
  BOOST_TEST(again->key == pushes[0].key);
  BOOST_TEST(pull_again->round == pulls[0].round);
  BOOST_TEST(again->request_id != pushes[0].request_id);
  // A late answer of the old server changes nothing; the new server's answers end the calls.
  d->ack(pushes[0].request_id, 1);
  d->answer_pull(pulls[0], ndarray::full({2}, 9.0), 64, 1);
  BOOST_TEST(!pushed.ready());
  BOOST_TEST(!pulled.ready());
  d->reply(wire::ack{again->request_id, 1, false, 0}, 0);
  BOOST_TEST(delivered_ok(pushed));
  d->answer_pull(*pull_again, ndarray::full({2}, 4.0), 64, 0);
  BOOST_TEST(delivered_ok(pulled));
  BOOST_TEST(floats(out) == std::vector<float>(2, 4.0f));
  // Later requests of the range go to its new server.
  d->sent.clear();
  auto later = d->call(kv_call::push, {worker_driver::key(1, gradient)});
  BOOST_TEST_REQUIRE(d->sent.size() == 1u);
  BOOST_TEST(d->sent[0].server == 0u);
  BOOST_TEST(!std::get<wire::push>(d->sent[0].request.msg).resent);
}

BOOST_AUTO_TEST_CASE(a_large_reply_is_copied_elsewhere_and_completes_when_the_copy_reports_back) {
  auto d = driver_for(one_server());
  const std::int64_t elements = copy_off_thread_bytes / sizeof(float);
  auto out = ndarray::zeros({elements});
  auto pulled = d->call(kv_call::pull, {worker_driver::pull_key(1, out)});
  auto pulls = d->sent_of<wire::pull_request>();
  BOOST_TEST_REQUIRE(pulls.size() == 1u);
  auto value = ndarray::full({elements}, 2.0);
  d->answer_pull(pulls[0], value, copy_off_thread_bytes / 2, 0);
  // Nothing is copied on the core's thread: two jobs wait.
  BOOST_TEST_REQUIRE(d->copies.size() == 2u);
  BOOST_TEST(floats(out)[0] == 0.0f);
  for (auto& [id, copy] : d->copies) {
    auto [how, problem] = copy();
    d->core->on_copied(id, how, problem);
  }
  BOOST_TEST(delivered_ok(pulled));
  BOOST_TEST(floats(out) == std::vector<float>(elements, 2.0f));
}

BOOST_AUTO_TEST_CASE(a_reply_to_a_request_nobody_made_changes_nothing) {
  auto d = driver_for(one_server());
  auto out = ndarray::full({2}, -1.0);
  auto pulled = d->call(kv_call::pull, {worker_driver::pull_key(0, out)});
  auto pull = d->sent_of<wire::pull_request>().at(0);
  auto other = ndarray::full({2}, 9.0);
  // Unknown ids: an ack, a value (which must not land in any output), an error.
  d->ack(pull.request_id + 100, 3);
  d->answer_pull(wire::pull_request{pull.request_id + 101, pull.key, 0, 0}, other, 8, 0);
  d->reply(wire::error_reply{pull.request_id + 102, pull.key, wire::error_code::unknown_key, "x"});
  d->reply(wire::error_reply{0, 0, wire::error_code::bad_frame, "a frame was refused"});
  BOOST_TEST(!pulled.ready());
  BOOST_TEST(d->core->under_way() == 1u);
  BOOST_TEST(floats(out) == std::vector<float>(2, -1.0f));
  // The real answer still completes the pull.
  d->answer_pull(pull, ndarray::full({2}, 4.0), 8, 0);
  BOOST_TEST(delivered_ok(pulled));
  BOOST_TEST(floats(out) == std::vector<float>(2, 4.0f));
}

BOOST_AUTO_TEST_CASE(an_overdue_request_times_out_and_fails_the_requests_of_its_key_behind_it) {
  auto d = driver_for(one_server(1));
  auto value = ndarray::full({2}, 1.0);
  auto sent = d->call(kv_call::push, {worker_driver::key(0, value)});
  auto behind = d->call(kv_call::push, {worker_driver::key(0, value)}); // no credit: waits
  auto other_key = d->call(kv_call::push, {worker_driver::key(1, value)});
  d->now += 999ms;
  d->core->on_tick();
  BOOST_TEST(!sent.ready()); // not overdue yet
  d->now += 2ms;
  d->core->on_tick();
  auto failed = delivered_error(sent);
  BOOST_TEST_REQUIRE(failed.has_value());
  BOOST_TEST((failed->code() == errc::timeout));
  BOOST_TEST(failed->message().find("push of key 0 to server 0 (node 8) not answered within 1 s") !=
                 std::string::npos,
             failed->message());
  auto waiting = delivered_error(behind);
  BOOST_TEST_REQUIRE(waiting.has_value());
  BOOST_TEST(waiting->message().find("waiting behind a request that failed") != std::string::npos,
             waiting->message());
  // Key 1's push was sent at the same time, so it is overdue as well, on its own account.
  auto own = delivered_error(other_key);
  BOOST_TEST_REQUIRE(own.has_value());
  BOOST_TEST(own->message().find("push of key 1") != std::string::npos, own->message());
  BOOST_TEST(d->core->under_way() == 0u);
}

BOOST_AUTO_TEST_CASE(after_a_restart_kept_pushes_go_again_in_round_order_marked_resent) {
  auto d = driver_for(with_restarts(one_server(4)));
  auto value = ndarray::full({2}, 1.0);
  auto acked = d->call(kv_call::push, {worker_driver::key(0, value)});
  auto unanswered = d->call(kv_call::push, {worker_driver::key(0, value)});
  auto pushes = d->sent_of<wire::push>();
  BOOST_TEST_REQUIRE(pushes.size() == 2u);
  d->ack(pushes[0].request_id, 1, /*durable*/ 0); // acked, not yet in a checkpoint: kept
  BOOST_TEST(delivered_ok(acked));

  // The link goes down: nothing fails, requests wait for the server.
  d->core->on_link_down(1, "connection reset", true);
  BOOST_TEST(d->lost_reports.empty());
  auto later = d->call(kv_call::push, {worker_driver::key(0, value)});
  d->now += 3000ms;
  d->core->on_tick();
  BOOST_TEST(!unanswered.ready()); // its timeout stops while the server is down
  const auto before = d->sent.size();
  BOOST_TEST(d->sent_of<wire::push>().size() == 2u); // the later push did not leave

  // The scheduler lists it lost, then alive at a new address: the worker relinks.
  wire::node_info server{8, wire::role::server, 0, "127.0.0.1", 4000, false};
  d->core->on_membership(wire::membership{1, 1, 1, {server}, {}});
  BOOST_TEST(d->relinks.empty());
  server.alive = true;
  server.data_port = 4001;
  d->core->on_membership(wire::membership{2, 1, 1, {server}, {}});
  BOOST_TEST_REQUIRE(d->relinks.size() == 1u);
  BOOST_TEST(d->relinks[0].data_port == 4001u);
  BOOST_TEST((d->core->on_relink(0, true, "server 0 (node 8) at 127.0.0.1:4001", "") ==
              worker_core::relink_step::install));
  d->core->server_back(0, "server 0 (node 8) at 127.0.0.1:4001");

  // Rounds 0 (acked, kept), 1 (unanswered) and 2 (made while the server was down, kept as it
  // "left") go again marked resent, in round order.
  std::vector<wire::push> again;
  for (std::size_t i = before; i < d->sent.size(); ++i)
    if (const auto* p = std::get_if<wire::push>(&d->sent[i].request.msg))
      again.push_back(*p);
  BOOST_TEST_REQUIRE(again.size() == 3u);
  BOOST_TEST(again[0].round == 0u);
  BOOST_TEST(again[0].resent);
  BOOST_TEST(again[1].round == 1u);
  BOOST_TEST(again[1].resent);
  BOOST_TEST(again[2].round == 2u);
  BOOST_TEST(again[2].resent);
  // The replay of round 0 belongs to no call; acking round 1 and 2 completes theirs.
  d->ack(again[0].request_id, 1, 1);
  d->ack(again[1].request_id, 2, 1);
  d->ack(again[2].request_id, 3, 1);
  BOOST_TEST(delivered_ok(unanswered));
  BOOST_TEST(delivered_ok(later));
}

BOOST_AUTO_TEST_CASE(fail_everything_fails_calls_under_way_waiting_and_later_naming_the_reason) {
  auto d = driver_for(one_server(1));
  auto value = ndarray::full({2}, 1.0);
  auto out = ndarray::zeros({2});
  auto under_way = d->call(kv_call::push, {worker_driver::key(0, value)});
  auto waiting = d->call(kv_call::pushpull, {worker_driver::key(0, value, {out})});
  d->core->fail_everything(error{errc::peer_lost, "server 0 (node 8) was lost: reset"});
  for (const auto* done : {&under_way, &waiting}) {
    auto failed = delivered_error(*done);
    BOOST_TEST_REQUIRE(failed.has_value());
    BOOST_TEST((failed->code() == errc::peer_lost));
    BOOST_TEST(failed->message().find("server 0 (node 8) was lost: reset") != std::string::npos,
               failed->message());
  }
  const auto sent = d->sent.size();
  auto later = d->call(kv_call::push, {worker_driver::key(1, value)});
  auto refused = delivered_error(later);
  BOOST_TEST_REQUIRE(refused.has_value());
  BOOST_TEST(refused->message() == "push: server 0 (node 8) was lost: reset");
  BOOST_TEST(d->sent.size() == sent); // nothing more leaves
  // A late ack changes nothing.
  d->ack(d->sent_of<wire::push>().at(0).request_id, 1);
  BOOST_TEST(d->core->under_way() == 0u);
}

BOOST_AUTO_TEST_CASE(a_lost_link_is_reported_after_the_grace_and_a_refusal_at_once) {
  auto d = driver_for(one_server());
  auto value = ndarray::full({2}, 1.0);
  auto pushed = d->call(kv_call::push, {worker_driver::key(0, value)});
  d->core->on_link_down(1, "connection reset", true);
  BOOST_TEST_REQUIRE(d->lost_reports.size() == 1u);
  BOOST_TEST(d->lost_reports[0] == "server 0 (node 8) was lost: connection reset");
  BOOST_TEST(!pushed.ready()); // the scheduler's notice may still name the real culprit
  d->core->on_refused(1, "the job token is wrong");
  auto failed = delivered_error(pushed);
  BOOST_TEST_REQUIRE(failed.has_value());
  BOOST_TEST((failed->code() == errc::invalid_argument));
  BOOST_TEST(
      failed->message().find("server 0 (node 8) refused this worker: the job token is wrong") !=
          std::string::npos,
      failed->message());
}

BOOST_AUTO_TEST_CASE(a_compressed_pull_offers_its_rule_and_unpacks_the_packed_reply) {
  auto d = driver_for(one_server());
  auto rule = gradient_compression::make("2bit", 0.5).value();
  rule.pulls = true;
  auto call_with = [&](kv_call kind, const ndarray& out, const gradient_compression& with) {
    kv_operation op;
    op.call = kind;
    op.keys = {worker_driver::pull_key(4, out)};
    op.what = "pull";
    op.compression = with;
    d->core->on_call(op);
    return op.done;
  };
  auto out = ndarray::zeros({20});
  auto done = call_with(kv_call::pull, out, rule);
  auto pulls = d->sent_of<wire::pull_request>();
  BOOST_TEST_REQUIRE(pulls.size() == 1u);
  BOOST_TEST(
      (pulls[0].reply_compression == wire::reply_packing{wire::compression_type::two_bit, 0.5f}));
  // 20 elements packed 2bit: +0.5 for elements 0 and 17, -0.5 for element 5, 0 elsewhere.
  std::vector<float> values(20, 0.0f);
  values[0] = 0.5f;
  values[17] = 0.5f;
  values[5] = -0.5f;
  std::vector<float> residual(20, 0.0f);
  std::vector<std::byte> packed(packed_bytes(compression_type::two_bit, 20));
  quantize(rule, dtype::float32, values.data(), residual.data(), packed.data(), 20);
  wire::tensor_chunk tensor{wire::dtype::float32,
                            {20},
                            80,
                            0,
                            packed,
                            std::nullopt,
                            wire::tensor_compression{wire::compression_type::two_bit, 0.5f, 20}};
  d->reply(wire::pull_reply{pulls[0].request_id, pulls[0].key, 1, tensor});
  BOOST_TEST(delivered_ok(done));
  BOOST_TEST(floats(out) == values);

  // A packed reply to a pull that offered none (or another rule) fails the call, naming it.
  auto plain = call_with(kv_call::pull, out, {});
  pulls = d->sent_of<wire::pull_request>();
  BOOST_TEST_REQUIRE(pulls.size() == 2u);
  BOOST_TEST((pulls[1].reply_compression.type == wire::compression_type::none));
  d->reply(wire::pull_reply{pulls[1].request_id, pulls[1].key, 1, tensor});
  auto failure = delivered_error(plain);
  BOOST_TEST_REQUIRE(failure.has_value());
  BOOST_TEST(failure->message().find("a dense value was asked for") != std::string::npos,
             failure->message());
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

/// One server, chunks of 4 KiB, a window of two chunks.
worker_core_options windowed() {
  auto options = one_server(8);
  options.chunk_bytes = 4096;
  options.send_window_bytes = 2 * 4096;
  return options;
}

/// (request id, chunk offset) of each frame sent, in order.
std::vector<std::pair<std::uint64_t, std::uint64_t>> frames_of(const worker_driver& d) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  for (const auto& f : d.sent) {
    const auto* tensor = wire::tensor_of(f.request.msg);
    out.emplace_back(wire::request_id_of(f.request.msg), tensor ? tensor->offset : 0);
  }
  return out;
}

} // namespace

BOOST_AUTO_TEST_SUITE(worker_send_queue)

BOOST_AUTO_TEST_CASE(a_small_urgent_push_overtakes_the_remaining_chunks_of_a_large_one) {
  auto d = driver_for(windowed());
  auto large = ndarray::full({8 * 1024}, 1.0); // 32 KiB: 8 chunks
  auto small = ndarray::full({4}, 2.0);
  auto slow = d->call(kv_call::push, {worker_driver::key(9, large)}, -9);
  // The window holds two chunks: the rest of the large push waits in the send queue.
  BOOST_TEST_REQUIRE(d->sent.size() == 2u);
  BOOST_TEST(d->core->bytes_with_link(0) == 2 * 4096u);
  auto urgent = d->call(kv_call::push, {worker_driver::key(0, small)}, 0);
  BOOST_TEST(d->sent.size() == 2u); // the window is full: even the urgent one waits
  d->left(0);
  // The first chunk left: the small push goes next, ahead of the large one's six chunks.
  BOOST_TEST_REQUIRE(d->sent.size() >= 3u);
  const auto frames = frames_of(*d);
  const auto large_id = frames[0].first;
  const auto* next = std::get_if<wire::push>(&d->sent[2].request.msg);
  BOOST_TEST_REQUIRE(next != nullptr);
  BOOST_TEST(next->key != d->sent_of<wire::push>()[0].key);
  BOOST_TEST(next->tensor.data.size() == 16u);
  // `next` points into d->sent, which the frames below may move.
  const auto urgent_id = next->request_id;
  // Then the large push's chunks resume, in offset order, one per frame that leaves.
  for (std::size_t i = 1; d->sent.size() < 9; ++i)
    d->left(i);
  const auto all = frames_of(*d);
  BOOST_TEST_REQUIRE(all.size() == 9u);
  for (std::size_t i = 3, chunk = 2; i < all.size(); ++i, ++chunk) {
    BOOST_TEST(all[i].first == large_id);
    BOOST_TEST(all[i].second == chunk * 4096);
  }
  d->ack(urgent_id, 1);
  d->ack(large_id, 1);
  BOOST_TEST(delivered_ok(urgent));
  BOOST_TEST(delivered_ok(slow));
}

BOOST_AUTO_TEST_CASE(without_a_higher_priority_the_queue_keeps_call_order) {
  // The control case of the test above: the same calls at equal priority leave in call order,
  // so the overtaking there is the priority's doing.
  auto d = driver_for(windowed());
  auto large = ndarray::full({8 * 1024}, 1.0);
  auto small = ndarray::full({4}, 2.0);
  d->call(kv_call::push, {worker_driver::key(9, large)}, 0);
  d->call(kv_call::push, {worker_driver::key(0, small)}, 0);
  for (std::size_t i = 0; i < d->sent.size() && i < 16; ++i)
    d->left(i);
  const auto all = frames_of(*d);
  BOOST_TEST_REQUIRE(all.size() == 9u);
  for (std::size_t i = 0; i < 8; ++i)
    BOOST_TEST(all[i].first == all[0].first);
  BOOST_TEST(all[8].first != all[0].first);
}

BOOST_AUTO_TEST_CASE(requests_of_one_ps_key_keep_their_order_whatever_their_priority) {
  auto d = driver_for(windowed());
  auto large = ndarray::full({8 * 1024}, 1.0);
  auto out = ndarray::zeros({8 * 1024});
  d->call(kv_call::push, {worker_driver::key(5, large)}, -5);
  // A pull of the same key at a high priority must still see the push: it waits for its last
  // chunk to be handed over.
  auto pulled = d->call(kv_call::pull, {worker_driver::pull_key(5, out)}, 100);
  for (std::size_t i = 0; i < d->sent.size() && i < 16; ++i)
    d->left(i);
  BOOST_TEST_REQUIRE(d->sent.size() == 9u);
  for (std::size_t i = 0; i < 8; ++i)
    BOOST_TEST(std::holds_alternative<wire::push>(d->sent[i].request.msg));
  const auto* pull = std::get_if<wire::pull_request>(&d->sent[8].request.msg);
  BOOST_TEST_REQUIRE(pull != nullptr);
  BOOST_TEST(pull->round == 1u);
  BOOST_TEST(!pulled.ready());
}

BOOST_AUTO_TEST_CASE(a_keyless_request_leaves_after_everything_queued_before_it) {
  auto d = driver_for(windowed());
  auto large = ndarray::full({8 * 1024}, 1.0);
  d->call(kv_call::push, {worker_driver::key(9, large)}, -9);
  kv_operation command;
  command.call = kv_call::every_server;
  command.what = "set_optimizer sgd";
  command.message_for = [](std::uint64_t id, std::uint32_t) -> wire::message {
    return wire::set_optimizer{id, "sgd", {}};
  };
  d->core->on_call(command);
  auto small = ndarray::full({4}, 2.0);
  d->call(kv_call::push, {worker_driver::key(0, small)}, 100); // after the command
  for (std::size_t i = 0; i < d->sent.size() && i < 16; ++i)
    d->left(i);
  BOOST_TEST_REQUIRE(d->sent.size() == 10u);
  BOOST_TEST(std::holds_alternative<wire::set_optimizer>(d->sent[8].request.msg));
  const auto* last = std::get_if<wire::push>(&d->sent[9].request.msg);
  BOOST_TEST_REQUIRE(last != nullptr);
  BOOST_TEST(last->tensor.data.size() == 16u);
}

BOOST_AUTO_TEST_CASE(receipts_of_a_replaced_link_do_not_open_the_new_links_window) {
  auto d = driver_for(with_restarts(windowed()));
  auto large = ndarray::full({8 * 1024}, 1.0);
  auto pushed = d->call(kv_call::push, {worker_driver::key(9, large)});
  BOOST_TEST_REQUIRE(d->sent.size() == 2u);
  d->core->on_link_down(1, "connection reset", true);
  d->core->server_back(0, "server 0 (node 8) at 127.0.0.1:4001");
  // The push goes again from its first chunk, on the new link, within its window.
  BOOST_TEST_REQUIRE(d->sent.size() == 4u);
  BOOST_TEST(std::get<wire::push>(d->sent[2].request.msg).tensor.offset == 0u);
  BOOST_TEST(std::get<wire::push>(d->sent[2].request.msg).resent);
  // The old link's frames let go: nothing more may leave on their account.
  d->left(0);
  d->left(1);
  BOOST_TEST(d->sent.size() == 4u);
  BOOST_TEST(d->core->bytes_with_link(0) == 2 * 4096u);
  d->left(2);
  BOOST_TEST(d->sent.size() == 5u);
  BOOST_TEST(!pushed.ready());
}

/// The operation of one call, as the facade makes it, for sends_at_once.
kv_operation operation(kv_call kind, kv_key_work key) {
  kv_operation op;
  op.call = kind;
  op.keys.push_back(std::move(key));
  return op;
}

constexpr std::size_t small_bytes = std::size_t{64} << 10;

BOOST_AUTO_TEST_CASE(a_small_call_is_sent_at_once_only_while_nothing_is_queued_for_its_server) {
  auto d = driver_for(windowed());
  auto large = ndarray::full({8 * 1024}, 1.0); // 32 KiB: 8 chunks of 4 KiB
  auto small = ndarray::full({4}, 2.0);
  const auto small_push = operation(kv_call::push, worker_driver::key(0, small));
  // The control: on an idle server a small push would leave at once.
  BOOST_TEST(d->core->sends_at_once(small_push, small_bytes));
  d->call(kv_call::push, {worker_driver::key(9, large)});
  BOOST_TEST_REQUIRE(d->sent.size() == 2u); // a window's worth; six chunks wait in the queue
  BOOST_TEST(!d->core->sends_at_once(small_push, small_bytes));
  // Run anyway, it keeps its place behind the queued chunks (equal priority, call order).
  d->call(kv_call::push, {worker_driver::key(0, small)});
  for (std::size_t i = 0; i < d->sent.size() && i < 16; ++i)
    d->left(i);
  BOOST_TEST_REQUIRE(d->sent.size() == 9u);
  const auto* last = std::get_if<wire::push>(&d->sent.back().request.msg);
  BOOST_TEST_REQUIRE(last != nullptr);
  BOOST_TEST(last->tensor.data.size() == 16u); // the small push, after the large one's 8 chunks
  // Everything has left: small calls go at once again; a large one never does.
  BOOST_TEST(d->core->sends_at_once(small_push, small_bytes));
  BOOST_TEST(
      !d->core->sends_at_once(operation(kv_call::push, worker_driver::key(9, large)), 16 << 10));
}

BOOST_AUTO_TEST_CASE(a_small_call_behind_a_waiting_request_of_its_ps_key_is_not_sent_at_once) {
  auto d = driver_for(one_server(1));
  auto value = ndarray::full({4}, 1.0);
  auto out = ndarray::zeros({4});
  const auto pull = operation(kv_call::pull, worker_driver::pull_key(3, out));
  d->call(kv_call::push, {worker_driver::key(3, value)});
  BOOST_TEST(d->core->sends_at_once(pull, small_bytes)); // the control: the push went
  // The second push has no credit (one round ahead at most): it waits, and so must the pull.
  d->call(kv_call::push, {worker_driver::key(3, value)});
  BOOST_TEST_REQUIRE(d->core->waiting_for_credit(d->sent_of<wire::push>()[0].key) == 1u);
  BOOST_TEST(!d->core->sends_at_once(pull, small_bytes));
  BOOST_TEST(
      !d->core->sends_at_once(operation(kv_call::push, worker_driver::key(3, value)), small_bytes));
  // Another key of the same server is not held up.
  BOOST_TEST(
      d->core->sends_at_once(operation(kv_call::push, worker_driver::key(4, value)), small_bytes));
  d->ack(d->sent_of<wire::push>()[0].request_id, 1);
  BOOST_TEST(d->core->sends_at_once(pull, small_bytes));
}

BOOST_AUTO_TEST_CASE(nothing_is_sent_at_once_by_a_failed_worker_or_to_a_server_held_for_recovery) {
  auto d = driver_for(with_restarts(one_server(), 1000ms));
  auto value = ndarray::full({4}, 1.0);
  const auto push = operation(kv_call::push, worker_driver::key(3, value));
  BOOST_TEST(d->core->sends_at_once(push, small_bytes));
  d->core->on_link_down(1, "reset", true);
  BOOST_TEST(!d->core->sends_at_once(push, small_bytes));
  auto failed = driver_for(one_server());
  failed->core->fail_everything(error{errc::peer_lost, "gone"});
  BOOST_TEST(!failed->core->sends_at_once(push, small_bytes));
}

BOOST_AUTO_TEST_CASE(the_server_a_call_is_sent_at_once_to_is_the_one_its_frame_goes_to) {
  auto options = one_server();
  options.num_servers = 2;
  auto d = driver_for(options);
  auto value = ndarray::full({4}, 1.0);
  std::set<std::uint32_t> servers;
  for (std::int64_t key = 0; key < 8; ++key) {
    const auto to =
        d->core->sends_at_once_to(operation(kv_call::push, worker_driver::key(key, value)), 64);
    BOOST_TEST_REQUIRE(to.has_value());
    d->call(kv_call::push, {worker_driver::key(key, value)});
    BOOST_TEST_REQUIRE(d->sent.size() == static_cast<std::size_t>(key + 1));
    BOOST_TEST(d->sent.back().server == *to);
    servers.insert(*to);
  }
  // The control: both servers were named, so the answer is not a constant.
  BOOST_TEST(servers.size() == 2u);
  // A key split over both servers goes at once to neither.
  options.bigarray_bound = 2;
  auto split = driver_for(options);
  BOOST_TEST(
      !split->core->sends_at_once_to(operation(kv_call::push, worker_driver::key(3, value)), 64)
           .has_value());
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

/// One server, keys of 32 floats cut into 8 slices of 4 (16 bytes), `credit` slice credits.
worker_core_options sliced(std::uint32_t credit) {
  auto options = one_server(2);
  options.num_workers = 4;
  options.slice_bytes = 16;
  options.slice_credit = credit;
  return options;
}

/// A worker of sliced(credit) and the tensors these tests call with: 32 floats of 1 pushed, 32
/// zeros pulled into.
struct sliced_job {
  explicit sliced_job(std::uint32_t credit) : d(driver_for(sliced(credit))) {}
  /// A pushpull of `key` (8 slices) from `value` into `out`.
  completion<status> pushpull(std::int64_t key = 3) {
    return d->call(kv_call::pushpull, {worker_driver::key(key, value, {out})});
  }
  std::unique_ptr<worker_driver> d;
  ndarray value = ndarray::full({32}, 1.0);
  ndarray out = ndarray::zeros({32});
};

/// The slot (slice index) of ps-key `ps_key` of key `key` on the only server.
std::uint64_t slot_of(std::uint64_t ps_key, std::uint64_t key) {
  return (ps_key - key) / slot_stride;
}

/// The slots of the pushpulls of `key` sent so far, in the order they left.
std::vector<std::uint64_t> pushpull_slots(const worker_driver& d, std::uint64_t key) {
  std::vector<std::uint64_t> slots;
  for (const auto& pp : d.sent_of<wire::pushpull>())
    if (pp.key >= key && (pp.key - key) % slot_stride == 0)
      slots.push_back(slot_of(pp.key, key));
  return slots;
}

/// Answers pushpull `pp` of a 4-float slice with `value` (the round it closed).
void answer_pushpull(worker_driver& d, const wire::pushpull& pp, float value) {
  d.answer_pull(wire::pull_request{pp.request_id, pp.key, 0, pp.round, 0},
                ndarray::full({4}, value), 1024, 0);
}

/// A worker of `options` pushes key 3 (8 slices) once: every slice leaves at once, taking no
/// slice credit.
void expect_every_slice_pushed_without_credit(worker_core_options options) {
  auto d = driver_for(std::move(options));
  auto value = ndarray::full({32}, 1.0);
  d->call(kv_call::push, {worker_driver::key(3, value)});
  BOOST_TEST(d->sent_of<wire::push>().size() == 8u);
  BOOST_TEST(d->core->slice_credits_taken(3, 0) == 0u);
}

} // namespace

BOOST_AUTO_TEST_SUITE(worker_slice_credit)

BOOST_AUTO_TEST_CASE(a_keys_next_slice_is_pushed_only_once_an_earlier_slices_round_has_closed) {
  sliced_job job{3};
  auto& d = job.d;
  auto& out = job.out;
  auto done = job.pushpull();
  // Three of the eight slices leave; the others wait for the rounds of the first to close.
  BOOST_TEST(pushpull_slots(*d, 3) == (std::vector<std::uint64_t>{0, 1, 2}));
  BOOST_TEST(d->core->slice_credits_taken(3, 0) == 3u);
  // Slice 1's round closes first: its credit goes to slice 3, the next in order.
  auto sent = d->sent_of<wire::pushpull>();
  answer_pushpull(*d, sent[1], 2.0f);
  BOOST_TEST(pushpull_slots(*d, 3) == (std::vector<std::uint64_t>{0, 1, 2, 3}));
  answer_pushpull(*d, sent[0], 2.0f);
  answer_pushpull(*d, sent[2], 2.0f);
  BOOST_TEST(pushpull_slots(*d, 3) == (std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5}));
  // Each answer lets one more go, until every slice has been pushed and answered.
  for (std::size_t answered = 3; answered < 8; ++answered)
    answer_pushpull(*d, d->sent_of<wire::pushpull>().at(answered), 2.0f);
  BOOST_TEST(pushpull_slots(*d, 3) == (std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  BOOST_TEST_REQUIRE(delivered_ok(done));
  BOOST_TEST(floats(out) == std::vector<float>(32, 2.0f));
  BOOST_TEST(d->core->slice_credits_taken(3, 0) == 0u);
}

BOOST_AUTO_TEST_CASE(without_slice_credit_every_slice_of_a_key_is_pushed_at_once) {
  // The control case of the test above: the same call with slice_credit 0 (today's default)
  // sends all eight slices before any answer, so the holding back there is the credit's doing.
  sliced_job job{0};
  auto& d = job.d;
  job.pushpull();
  BOOST_TEST(pushpull_slots(*d, 3) == (std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

BOOST_AUTO_TEST_CASE(slice_credit_goes_in_call_order_then_slice_order_across_calls_of_a_key) {
  auto d = driver_for(sliced(2));
  auto value = ndarray::full({32}, 1.0);
  auto first_out = ndarray::zeros({32}), second_out = ndarray::zeros({32});
  auto first = d->call(kv_call::pushpull, {worker_driver::key(3, value, {first_out})});
  auto second = d->call(kv_call::pushpull, {worker_driver::key(3, value, {second_out})});
  BOOST_TEST(pushpull_slots(*d, 3) == (std::vector<std::uint64_t>{0, 1}));
  // Slice 0's round 0 closes: the second call's slice 0 has sync credit and its ps-key is free,
  // but the first call's slice 2 asked for slice credit before it and goes first.
  auto sent = d->sent_of<wire::pushpull>();
  answer_pushpull(*d, sent[0], 2.0f);
  sent = d->sent_of<wire::pushpull>();
  BOOST_TEST_REQUIRE(sent.size() == 3u);
  BOOST_TEST(slot_of(sent[2].key, 3) == 2u);
  BOOST_TEST(sent[2].round == 0u);
  // Answering in order, every push of the first call leaves before any of the second.
  for (std::size_t answered = 1; answered < 16; ++answered)
    answer_pushpull(*d, d->sent_of<wire::pushpull>().at(answered), 2.0f);
  sent = d->sent_of<wire::pushpull>();
  BOOST_TEST_REQUIRE(sent.size() == 16u);
  for (std::size_t i = 0; i < 16; ++i) {
    BOOST_TEST(sent[i].round == i / 8);
    BOOST_TEST(slot_of(sent[i].key, 3) == i % 8);
  }
  BOOST_TEST(delivered_ok(first));
  BOOST_TEST(delivered_ok(second));
}

BOOST_AUTO_TEST_CASE(a_pull_behind_a_push_waiting_for_slice_credit_keeps_its_place) {
  sliced_job job{1};
  auto& d = job.d;
  d->call(kv_call::push, {worker_driver::key(3, job.value)});
  auto pulled = d->call(kv_call::pull, {worker_driver::pull_key(3, job.out)});
  // Slice 0's push left; the pulls of slices 1-7 wait behind their pushes (the pull must see
  // them), and slice 0's pull follows its push at once.
  BOOST_TEST(d->sent_of<wire::push>().size() == 1u);
  auto pulls = d->sent_of<wire::pull_request>();
  BOOST_TEST_REQUIRE(pulls.size() == 1u);
  BOOST_TEST(slot_of(pulls[0].key, 3) == 0u);
  BOOST_TEST(pulls[0].round == 1u);
  // Each ack gives the credit to the next slice's push, then its pull goes, of round 1.
  for (std::size_t acked = 0; acked < 8; ++acked)
    d->ack(d->sent_of<wire::push>().at(acked).request_id, 0);
  pulls = d->sent_of<wire::pull_request>();
  BOOST_TEST_REQUIRE(pulls.size() == 8u);
  for (const auto& pull : pulls)
    BOOST_TEST(pull.round == 1u);
  BOOST_TEST(!pulled.ready());
}

BOOST_AUTO_TEST_CASE(a_push_that_fails_or_times_out_gives_its_slice_credit_back) {
  auto d = driver_for(sliced(2));
  auto value = ndarray::full({32}, 1.0);
  auto pushed = d->call(kv_call::push, {worker_driver::key(3, value)});
  auto pushes = d->sent_of<wire::push>();
  BOOST_TEST_REQUIRE(pushes.size() == 2u);
  // The server refuses slice 0: the call fails, its waiting slices go nowhere, and slice 0's
  // credit is free again.
  d->reply(wire::error_reply{pushes[0].request_id, pushes[0].key, wire::error_code::unknown_key,
                             "no such key"});
  BOOST_TEST_REQUIRE(delivered_error(pushed).has_value());
  BOOST_TEST(d->sent_of<wire::push>().size() == 2u);
  BOOST_TEST(d->core->slice_credits_taken(3, 0) == 1u);
  // Nobody answers slice 1: it times out, and its credit is free too.
  d->now += 1001ms;
  d->core->on_tick();
  BOOST_TEST(d->core->slice_credits_taken(3, 0) == 0u);
  // A later call of the key gets both credits.
  d->call(kv_call::push, {worker_driver::key(3, value)});
  BOOST_TEST(d->sent_of<wire::push>().size() == 4u);
  BOOST_TEST(d->core->slice_credits_taken(3, 0) == 2u);
}

BOOST_AUTO_TEST_CASE(a_pushpull_dropped_after_its_round_closed_without_it_gives_its_credit_back) {
  // A straggler under a quorum: its push of slice 0 came after the round closed with the other
  // workers. The server answers at once with the closed round's value (dropped); the credit goes
  // to slice 1.
  sliced_job job{1};
  auto& d = job.d;
  job.pushpull();
  auto sent = d->sent_of<wire::pushpull>();
  BOOST_TEST_REQUIRE(sent.size() == 1u);
  // The value of round 2: the server is two rounds ahead of this worker's push of round 0.
  d->answer_pull(wire::pull_request{sent[0].request_id, sent[0].key, 0, 1, 0},
                 ndarray::full({4}, 7.0), 1024, 0);
  BOOST_TEST(pushpull_slots(*d, 3) == (std::vector<std::uint64_t>{0, 1}));
  BOOST_TEST(d->core->slice_credits_taken(3, 0) == 1u);
}

BOOST_AUTO_TEST_CASE(a_cancelled_call_gives_its_slice_credit_back_and_its_waiting_slices_stay) {
  sliced_job job{2};
  auto& d = job.d;
  auto cancelled = job.pushpull();
  auto later = job.pushpull(5);
  BOOST_TEST(pushpull_slots(*d, 3) == (std::vector<std::uint64_t>{0, 1}));
  cancelled.cancel();
  d->core->on_tick();
  // The cancelled call's slices went nowhere; its credits are free again.
  BOOST_TEST(d->core->slice_credits_taken(3, 0) == 0u);
  BOOST_TEST(d->sent_of<wire::pushpull>().size() == 4u); // key 5's first two, its own group
  // A new call of key 3 gets the credits.
  auto again = job.pushpull();
  BOOST_TEST(d->core->slice_credits_taken(3, 0) == 2u);
  BOOST_TEST(!again.ready());
  BOOST_TEST(!later.ready());
}

BOOST_AUTO_TEST_CASE(dist_async_takes_no_slice_credit) {
  auto options = sliced(2);
  options.sync = false;
  expect_every_slice_pushed_without_credit(options);
}

BOOST_AUTO_TEST_CASE(a_worker_alone_in_its_job_takes_no_slice_credit) {
  // Nobody to keep in step with: the credit would only leave its links idle.
  auto options = sliced(2);
  options.num_workers = 1;
  expect_every_slice_pushed_without_credit(options);
}

BOOST_AUTO_TEST_CASE(a_key_of_one_slice_per_server_takes_no_slice_credit) {
  auto options = sliced(1);
  auto d = driver_for(options);
  auto value = ndarray::full({4}, 1.0); // no larger than a slice: one ps-key
  d->call(kv_call::push, {worker_driver::key(3, value)});
  d->call(kv_call::push, {worker_driver::key(3, value)});
  // Sync credit alone decides: two rounds ahead.
  BOOST_TEST(d->sent_of<wire::push>().size() == 2u);
}

BOOST_AUTO_TEST_CASE(after_a_restart_pushes_under_way_go_again_holding_their_slice_credit) {
  auto d = driver_for(with_restarts(sliced(2)));
  auto value = ndarray::full({32}, 1.0);
  auto pushed = d->call(kv_call::push, {worker_driver::key(3, value)});
  BOOST_TEST_REQUIRE(d->sent_of<wire::push>().size() == 2u);
  d->core->on_link_down(1, "connection reset", true);
  d->core->server_back(0, "server 0 (node 8) at 127.0.0.1:4001");
  // Slices 0 and 1 go again marked resent; slices 2-7 still wait for their credit.
  auto pushes = d->sent_of<wire::push>();
  BOOST_TEST_REQUIRE(pushes.size() == 4u);
  BOOST_TEST(pushes[2].resent);
  BOOST_TEST(pushes[3].resent);
  BOOST_TEST(slot_of(pushes[2].key, 3) + slot_of(pushes[3].key, 3) == 1u);
  BOOST_TEST(d->core->slice_credits_taken(3, 0) == 2u);
  // Their acks free the credits; the rest follow in slice order and the call completes.
  d->ack(pushes[2].request_id, 1, 1);
  d->ack(pushes[3].request_id, 1, 1);
  for (std::size_t acked = 4; acked < 10; ++acked)
    d->ack(d->sent_of<wire::push>().at(acked).request_id, 1, 1);
  pushes = d->sent_of<wire::push>();
  BOOST_TEST_REQUIRE(pushes.size() == 10u);
  for (std::size_t i = 4; i < 10; ++i) {
    BOOST_TEST(!pushes[i].resent);
    BOOST_TEST(slot_of(pushes[i].key, 3) == i - 2);
  }
  BOOST_TEST(delivered_ok(pushed));
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

/// The messages of frame `index` sent: a batch's, or the frame's own.
std::vector<wire::message> messages_of(const worker_driver& d, std::size_t index) {
  const auto& msg = d.sent.at(index).request.msg;
  std::vector<wire::message> out;
  if (const auto* fused = std::get_if<wire::batch>(&msg)) {
    for (auto one : fused->messages)
      out.push_back(wire::unbatched(std::move(one)));
  } else {
    out.push_back(msg);
  }
  return out;
}

std::vector<kv_key_work> small_keys(std::int64_t first, std::int64_t count, std::int64_t elements,
                                    std::vector<ndarray>* outputs = nullptr) {
  std::vector<kv_key_work> keys;
  for (std::int64_t k = first; k < first + count; ++k) {
    auto value = ndarray::full({elements}, static_cast<double>(k));
    if (outputs == nullptr) {
      keys.push_back(worker_driver::key(k, value));
    } else {
      outputs->push_back(ndarray::zeros({elements}));
      keys.push_back(worker_driver::key(k, value, {outputs->back()}));
    }
  }
  return keys;
}

/// A worker of `options` just called to push keys 0 to count - 1, of 4 floats each.
std::unique_ptr<worker_driver> after_small_pushes(worker_core_options options, std::int64_t count) {
  auto d = driver_for(std::move(options));
  d->call(kv_call::push, small_keys(0, count, 4));
  return d;
}

} // namespace

BOOST_AUTO_TEST_SUITE(worker_fusion)

BOOST_AUTO_TEST_CASE(the_keys_of_one_call_leave_in_one_frame_and_each_answer_completes_its_key) {
  auto d = driver_for(one_server());
  std::vector<ndarray> outputs;
  auto done = d->call(kv_call::pushpull, small_keys(0, 5, 4, &outputs));
  // One frame: a batch of the five pushpulls in call order, its receipt counting their tensors.
  BOOST_TEST_REQUIRE(d->sent.size() == 1u);
  BOOST_TEST_REQUIRE(std::holds_alternative<wire::batch>(d->sent[0].request.msg));
  BOOST_TEST(d->sent[0].receipt.bytes == 5 * 16u);
  const auto requests = messages_of(*d, 0);
  BOOST_TEST_REQUIRE(requests.size() == 5u);
  wire::batch answers;
  for (std::size_t k = 0; k < requests.size(); ++k) {
    const auto& request = std::get<wire::pushpull>(requests[k]);
    BOOST_TEST(request.key == k);
    BOOST_TEST(request.round == 0u);
    BOOST_TEST(request.tensor.data.size() == 16u);
    // The server answers in one batch too, in another order: each answer finds its request.
    answers.messages.insert(answers.messages.begin(),
                            wire::pull_reply{request.request_id, request.key, 1, request.tensor});
  }
  BOOST_TEST(!done.ready());
  d->reply(std::move(answers));
  BOOST_TEST(delivered_ok(done));
  for (std::size_t k = 0; k < outputs.size(); ++k)
    BOOST_TEST(floats(outputs[k]) == std::vector<float>(4, static_cast<float>(k)),
               boost::test_tools::per_element());
  // The answers counted as credit, as alone: the next round of every key leaves at once.
  d->call(kv_call::push, small_keys(0, 5, 4));
  BOOST_TEST_REQUIRE(d->sent.size() == 2u);
  for (const auto& next : messages_of(*d, 1))
    BOOST_TEST(std::get<wire::push>(next).round == 1u);
}

BOOST_AUTO_TEST_CASE(a_fused_frame_holds_at_most_its_bound_and_a_large_request_goes_alone) {
  auto options = one_server();
  options.fuse_item_bytes = 64;
  options.fuse_frame_bytes = 3 * 16;
  auto d = driver_for(options);
  auto keys = small_keys(0, 4, 4);   // 16 bytes each
  auto large = small_keys(4, 1, 32); // 128 bytes: above fuse_item_bytes
  auto more = small_keys(5, 2, 4);
  keys.insert(keys.end(), large.begin(), large.end());
  keys.insert(keys.end(), more.begin(), more.end());
  auto done = d->call(kv_call::push, std::move(keys));
  // Frames in call order: keys 0-2 (the bound), 3 alone (the large one follows), 4, then 5-6.
  std::vector<std::vector<std::uint64_t>> frames;
  for (std::size_t f = 0; f < d->sent.size(); ++f) {
    std::vector<std::uint64_t> keys_of_frame;
    for (const auto& m : messages_of(*d, f))
      keys_of_frame.push_back(std::get<wire::push>(m).key);
    frames.push_back(keys_of_frame);
  }
  const std::vector<std::vector<std::uint64_t>> expected{{0, 1, 2}, {3}, {4}, {5, 6}};
  BOOST_TEST(frames == expected);
  BOOST_TEST(std::holds_alternative<wire::push>(d->sent[1].request.msg)); // one: no batch
  for (const auto& push : d->sent_of<wire::push>())
    d->ack(push.request_id, 1);
  for (const auto& fused : d->sent_of<wire::batch>())
    for (const auto& one : fused.messages)
      d->ack(std::get<wire::push>(one).request_id, 1);
  BOOST_TEST(delivered_ok(done));
}

BOOST_AUTO_TEST_CASE(without_fusion_every_request_has_a_frame_of_its_own) {
  auto options = one_server();
  options.fuse_frame_bytes = 0;
  auto d = after_small_pushes(options, 5);
  BOOST_TEST(d->sent.size() == 5u);
  BOOST_TEST(d->sent_of<wire::push>().size() == 5u);
}

BOOST_AUTO_TEST_CASE(each_server_gets_its_own_keys_fused) {
  auto options = one_server();
  options.num_servers = 2;
  auto d = after_small_pushes(options, 6);
  // Each frame holds the keys of one server, and every key leaves once.
  BOOST_TEST_REQUIRE(d->sent.size() == 2u);
  std::set<std::uint64_t> seen;
  for (std::size_t f = 0; f < 2; ++f)
    for (const auto& m : messages_of(*d, f)) {
      BOOST_TEST(seen.insert(std::get<wire::push>(m).key).second);
    }
  BOOST_TEST(seen.size() == 6u);
  BOOST_TEST(d->sent[0].server != d->sent[1].server);
}

BOOST_AUTO_TEST_SUITE_END()

#include "actors/kv_worker.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/typed_broker.hpp>
#include <caf/send.hpp>
#include <caf/spawn_options.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/data_link.hpp"
#include "actors/logic/job_trace.hpp"
#include "actors/logic/key_placement.hpp"
#include "actors/logic/latency_histogram.hpp"
#include "actors/logic/wire_conversions.hpp"
#include "engine/dispatch.hpp"

namespace troupe {
namespace {

using clock = std::chrono::steady_clock;

/// "830 us", "12.4 ms" or "1.52 s".
std::string describe_us(double us) {
  char text[32];
  if (us < 1'000)
    std::snprintf(text, sizeof text, "%.0f us", us);
  else if (us < 1'000'000)
    std::snprintf(text, sizeof text, "%.3g ms", us / 1'000);
  else
    std::snprintf(text, sizeof text, "%.3g s", us / 1'000'000);
  return text;
}

/// "5 s" for whole seconds, "250 ms" otherwise.
std::string describe(std::chrono::milliseconds duration) {
  if (duration.count() % 1000 == 0)
    return std::to_string(duration.count() / 1000) + " s";
  return std::to_string(duration.count()) + " ms";
}

/// A call under way: how many of its requests are still expected, and how it ends.
struct call_state {
  completion<status> done;
  std::size_t remaining = 0;
  bool ended = false;

  /// The first end wins; later ones (a second failure, a late success) change nothing.
  void end(status outcome) {
    if (ended)
      return;
    ended = true;
    done.deliver(std::move(outcome));
  }
  /// Nothing more of this call needs doing: it ended, or its caller stopped waiting.
  bool over() const { return ended || done.cancelled(); }
};

/// Where the value of one key's pull lands: straight in the one host output, or in a staging
/// buffer copied to every output once each slice has arrived.
struct pull_target {
  ndarray buffer;
  std::vector<ndarray> copies; ///< empty when buffer is the output itself
  std::size_t slices_left = 0;
};

/// One request to one server: one slice of one key, or a keyless message.
struct part {
  std::shared_ptr<call_state> call;
  kv_call kind = kv_call::every_server;
  std::uint32_t server = 0;
  /// The key's name, or for a keyless request the call's (how errors name it: what_of).
  std::string name;
  /// Keyed requests.
  key_slice slice;
  bool whole = true; ///< the slice is the whole key (not split over servers)
  /// init, push, pushpull: the host value whose slice is sent (kept alive while frames view it).
  ndarray value;
  /// pull, pushpull: the reassembly of the reply into target->buffer.
  std::optional<wire::reassembler> assembly;
  std::shared_ptr<pull_target> target;
  /// Set when the request leaves; its timeout runs from here.
  clock::time_point sent_at;
  /// When it left on the job trace's clock (job_trace.hpp); 0: not traced.
  std::int64_t traced_since_us = 0;
  /// The first chunk of the reply has arrived (its round was learnt).
  bool reply_seen = false;
  /// The reply's chunks are copied by the worker's copier (copy_off_thread_bytes), which alone
  /// touches `assembly` from then on.
  bool copy_off_thread = false;
  /// pull, pushpull: where `assembly` writes, so that a resent request starts it afresh.
  std::span<std::byte> out_bytes;
  wire::dtype out_type = wire::dtype::float32;
  std::vector<std::int64_t> out_shape;
  /// push, pushpull, pull: the round it was sent with.
  std::uint64_t round = 0;
  /// Sent again after its server restarted: with `round`, as Push.resent.
  bool resend = false;
};

/// A copy of a push this worker sent, kept until its round is durable at the server.
struct kept_push {
  std::uint64_t round = 0;
  ndarray copy;
};

/// Replies at least this large are copied into the caller's output on the worker's copier, not
/// on the I/O thread: a 128 MiB push+pull copied on the I/O thread kept it from reading the next
/// chunks meanwhile, and took 1.02-1.05x the time of the old worker, whose copies ran elsewhere
/// (BENCHMARKS.md). Smaller replies are copied at once: a hop to another thread would cost more
/// than the copy.
constexpr std::size_t copy_off_thread_bytes = std::size_t{1} << 20;

/// Copies one reply chunk into its request's output, unless the caller has stopped waiting.
/// Touches only `p.assembly` and the call's completion, so it may run on the copier's thread.
std::pair<chunk_copy, std::string> copy_chunk(part& p, const wire::pull_reply& value) {
  std::optional<wire::result<bool>> added;
  // The caller's output is written only while the call is live (completion::while_live).
  if (!p.call->done.while_live([&] { added.emplace(p.assembly->add(value.tensor)); }))
    return {chunk_copy::cancelled, {}};
  if (!*added)
    return {chunk_copy::failed, added->error().message};
  return {added->value() ? chunk_copy::complete : chunk_copy::more, {}};
}

/// The int is unused: CAF 0.17.6's init_fun_factory dereferences a null argument tuple for a
/// function without arguments (UBSan reports it; actors/server_node.cpp does the same).
reply_copier_actor::behavior_type reply_copier(int) {
  return {[](reply_copy& job) {
    engine::on_behalf_of_lane_scope owned; // as the worker's handlers (guarded)
    job.run();
  }};
}

/// The rounds of one ps-key as this worker sees them, and its requests waiting for credit.
struct ps_key_state {
  /// Pushes of the key sent so far: the round of the next push, and of a pull's value.
  std::uint64_t next_round = 0;
  /// Rounds the server has completed, from its latest answer.
  std::uint64_t completed = 0;
  /// Requests not yet sent, in call order, behind a push that has no credit.
  std::deque<std::shared_ptr<part>> waiting;
  /// The server that holds the ps-key.
  std::uint32_t server = 0;
  /// Server recovery: rounds the server's last written checkpoint holds, and copies of the
  /// pushes of later rounds, in round order.
  std::uint64_t durable = 0;
  std::deque<kept_push> kept;
};

/// A server link as the worker sees it (server recovery).
struct server_state {
  /// The link went down, or a membership table listed the server lost: requests wait.
  bool down = false;
  clock::time_point down_since;
  /// A membership table listed it lost: the next one listing it alive names its new address.
  bool seen_lost = false;
  /// A helper is connecting to its new address.
  bool relinking = false;
};

/// The flattened bytes [begin, end) elements of host array `array`.
std::span<std::byte> element_bytes(const ndarray& array, std::int64_t begin, std::int64_t end) {
  const auto size = size_of(array.dtype());
  return {static_cast<std::byte*>(const_cast<void*>(array.raw_data())) + begin * size,
          static_cast<std::size_t>(end - begin) * size};
}

wire::tensor_chunk slice_tensor(const ndarray& array, const key_slice& slice, bool whole) {
  wire::tensor_chunk tensor;
  tensor.type = to_wire(array.dtype());
  if (whole)
    tensor.shape.assign(array.shape().begin(), array.shape().end());
  else
    tensor.shape = {slice.size()};
  tensor.data = element_bytes(array, slice.begin, slice.end);
  tensor.total_bytes = tensor.data.size();
  return tensor;
}

template <class Handle>
struct broker_of;
template <class... Sigs>
struct broker_of<caf::typed_actor<Sigs...>> {
  using type = caf::io::typed_broker<Sigs...>;
};

/// Where the worker runs: as a broker on the middleman's I/O thread when the system has one (the
/// links to the servers are brokers on that thread too, so a request and its replies cross no
/// other thread between the caller and the socket), else as an ordinary actor (in-process jobs).
using worker_on_io_thread = broker_of<worker_actor>::type;
using worker_on_scheduler = worker_actor::base;

template <class Base>
class worker_state {
public:
  static inline const char* name = "troupe.kv_worker";

  using pointer = caf::stateful_actor<worker_state, Base>*;

  worker_state() = default;
  worker_state(const worker_state&) = delete;
  worker_state& operator=(const worker_state&) = delete;

  /// Whatever is still under way when the actor goes (the system shutting down) ends now: a
  /// caller never waits on a worker that is gone.
  ~worker_state() {
    error gone{errc::peer_lost, "the KVStore worker stopped"};
    for (auto& [id, waiting] : parts_)
      waiting->call->end(gone);
    for (auto& [key, ps] : keys_)
      for (auto& waiting : ps.waiting)
        waiting->call->end(gone);
    if (finalizing_)
      finalizing_->deliver(ok());
  }

  worker_actor::behavior_type start(pointer self, kv_worker_options options) {
    self_ = self;
    options_ = std::move(options);
    copier_ = self->template spawn<caf::linked>(reply_copier, 0);
    tick_interval_ = std::clamp(options_.request_timeout / 8, std::chrono::milliseconds{10},
                                std::chrono::milliseconds{250});
    schedule_tick();
    return {
        [this](server_links& links) { guarded("its links", [&] { on_links(links); }); },
        [this](server_relink& relink) {
          guarded("a server's new link", [&] { on_relink(relink); });
        },
        [this](kv_operation& op) {
          guarded(
              op.what, [&] { on_call(op); }, &op.done);
        },
        [this](envelope& reply) { guarded("a server's reply", [&] { on_reply(reply); }); },
        [this](link_down_atom, std::uint64_t tag, const std::string& why) {
          on_link_down(tag, why);
        },
        [this](peer_lost_atom, const std::string& why) {
          fail_everything(error{errc::peer_lost, why});
        },
        [this](const wire::membership& table) { on_membership(table); },
        [this](stop_atom) {
          fail_everything(error{errc::peer_lost, "the scheduler ended the job"});
        },
        [this](tick_atom) {
          if (self_->current_sender() == self_->ctrl())
            on_tick();
        },
        [this](finalize_atom, completion<status>& done) { on_finalize(std::move(done)); },
        [this](copied_atom, std::uint64_t id, std::uint8_t how, std::string& problem) {
          guarded("a copied reply", [&] { on_copied(id, how, problem); });
        },
    };
  }

private:
  pointer self() const { return self_; }

  /// Runs a handler so that nothing it throws escapes the actor: the call it served (if any)
  /// fails naming what was being done.
  template <class Body>
  void guarded(std::string_view what, Body&& body, completion<status>* call = nullptr) {
    // The caller waited for the engine's queued uses of a request's arrays before handing them
    // over, and a lane's task may be waiting for this request (actors/gluon/trainer.cpp).
    engine::on_behalf_of_lane_scope owned;
    const status outcome = status_of([&]() -> status {
      body();
      return ok();
    });
    if (!outcome)
      report(what, outcome.error(), call);
  }

  void report(std::string_view what, const error& why, completion<status>* call) {
    options_.log.error(std::string{what} + ": " + why.to_string());
    if (call)
      call->deliver(error{why.code(), std::string{what} + ": " + why.message()});
  }

  // --- setup ---------------------------------------------------------------------------------

  void on_links(server_links& links) {
    links_ = std::move(links.links);
    names_ = std::move(links.names);
    names_.resize(links_.size());
    servers_.assign(links_.size(), server_state{});
    for (std::size_t s = 0; s < names_.size(); ++s)
      if (names_[s].empty())
        names_[s] = "server " + std::to_string(s);
  }

  // --- calls ---------------------------------------------------------------------------------

  void on_call(kv_operation& op) {
    auto call = std::make_shared<call_state>();
    call->done = op.done;
    if (failure_) {
      call->end(error{failure_->code(), op.what + ": " + failure_->message()});
      return;
    }
    if (links_.size() != options_.num_servers) {
      call->end(error{errc::internal, op.what + ": the worker has " +
                                          std::to_string(links_.size()) + " server links for " +
                                          std::to_string(options_.num_servers) + " servers"});
      return;
    }
    switch (op.call) {
    case kv_call::every_server:
      for (std::uint32_t server = 0; server < options_.num_servers; ++server) {
        auto p = new_part(call, kv_call::every_server, server, op.what);
        const auto id = next_request_id_++;
        sent(id, p);
        send(server, envelope{op.message_for(id, server), nullptr, 0});
      }
      break;
    case kv_call::init:
    case kv_call::push:
    case kv_call::pushpull:
    case kv_call::pull:
      for (auto& work : op.keys)
        add_key(call, op.call, work);
      break;
    }
    if (call->remaining == 0)
      call->end(ok());
  }

  std::shared_ptr<part> new_part(const std::shared_ptr<call_state>& call, kv_call kind,
                                 std::uint32_t server, std::string name) {
    auto p = std::make_shared<part>();
    p->call = call;
    p->kind = kind;
    p->server = server;
    p->name = std::move(name);
    ++call->remaining;
    return p;
  }

  static const char* verb(kv_call call) {
    switch (call) {
    case kv_call::init:
      return "init";
    case kv_call::push:
      return "push";
    case kv_call::pushpull:
      return "pushpull";
    case kv_call::pull:
      return "pull";
    case kv_call::every_server:
      break;
    }
    return "request";
  }

  /// How errors name a request: "pull of key 3 from server 1 (node 10) at 127.0.0.1:40123",
  /// "set_optimizer sgd on server 0". Built only when something is reported.
  std::string what_of(const part& p) const {
    if (p.kind == kv_call::every_server)
      return p.name + " on " + names_[p.server];
    return std::string{verb(p.kind)} + " of key " + p.name +
           (p.kind == kv_call::pull ? " from " : " to ") + names_[p.server];
  }

  /// The requests of one key of a call: one per slice, each queued behind the key's earlier
  /// requests when those are still waiting for credit.
  void add_key(const std::shared_ptr<call_state>& call, kv_call kind, kv_key_work& work) {
    const auto elements = work.value.is_none() ? element_count(work.shape) : work.value.size();
    const auto max_slice_elements =
        static_cast<std::int64_t>(options_.slice_bytes / size_of(work.type));
    auto slices = place_key(static_cast<std::uint64_t>(work.index), elements, options_.num_servers,
                            options_.bigarray_bound, max_slice_elements);
    std::shared_ptr<pull_target> target;
    if (kind == kv_call::pull || kind == kv_call::pushpull)
      target = make_target(work, slices.size());
    for (const auto& slice : slices) {
      auto p = new_part(call, kind, slice.server, work.name);
      p->slice = slice;
      p->whole = slices.size() == 1;
      p->value = work.value;
      if (target) {
        auto bytes = element_bytes(target->buffer, slice.begin, slice.end);
        auto shape = p->whole ? work.shape : shape_vector{slice.size()};
        p->copy_off_thread = bytes.size() >= copy_off_thread_bytes;
        p->out_bytes = bytes;
        p->out_type = to_wire(work.type);
        p->out_shape.assign(shape.begin(), shape.end());
        p->assembly.emplace(bytes, p->out_type, p->out_shape);
        p->target = target;
      }
      if (kind == kv_call::init)
        send_keyed(p, keys_[p->slice.ps_key]);
      else
        submit(p);
    }
  }

  std::shared_ptr<pull_target> make_target(const kv_key_work& work, std::size_t slices) {
    auto target = std::make_shared<pull_target>();
    target->slices_left = slices;
    const bool direct = work.outputs.size() == 1 && work.outputs[0].ctx().is_cpu();
    if (direct) {
      target->buffer = work.outputs[0];
    } else {
      target->buffer = ndarray::empty(work.shape, context::cpu(), work.type);
      target->copies = work.outputs;
    }
    return target;
  }

  // --- credit and sending --------------------------------------------------------------------

  bool has_credit(const ps_key_state& ps, const part& p) const {
    if (!options_.sync || p.kind == kv_call::pull)
      return true;
    const auto round = p.resend ? p.round : ps.next_round;
    return round < ps.completed + options_.max_rounds_ahead;
  }

  /// Server recovery: pushes are kept until durable, and a lost server is waited for.
  bool recovery() const {
    return options_.server_rejoin.count() > 0 && options_.reconnect != nullptr;
  }

  void submit(const std::shared_ptr<part>& p) {
    auto& ps = keys_[p->slice.ps_key];
    ps.server = p->server;
    if (ps.waiting.empty() && has_credit(ps, *p))
      send_keyed(p, ps);
    else
      ps.waiting.push_back(p);
  }

  /// Sends what credit now allows of the key's waiting requests, in order.
  void release_waiting(ps_key_state& ps) {
    while (!ps.waiting.empty() && has_credit(ps, *ps.waiting.front())) {
      auto p = std::move(ps.waiting.front());
      ps.waiting.pop_front();
      if (!p->call->over())
        send_keyed(p, ps);
    }
  }

  std::uint32_t timeout_ms() const {
    return static_cast<std::uint32_t>(std::min<std::int64_t>(
        options_.request_timeout.count(), std::numeric_limits<std::uint32_t>::max()));
  }

  /// Sends request `p` of the ps-key whose state is `ps`.
  void send_keyed(const std::shared_ptr<part>& p, ps_key_state& ps) {
    const auto id = next_request_id_++;
    const auto ps_key = p->slice.ps_key;
    ps.server = p->server;
    const bool pushes = p->kind == kv_call::push || p->kind == kv_call::pushpull;
    if (!p->resend) {
      p->round = pushes ? ps.next_round++ : ps.next_round;
      if (pushes && recovery())
        ps.kept.push_back(kept_push{p->round, copy_slice(*p)});
    }
    wire::message whole;
    switch (p->kind) {
    case kv_call::init:
      whole = wire::init{id, ps_key, slice_tensor(p->value, p->slice, p->whole)};
      break;
    case kv_call::push:
      whole = wire::push{
          id,       ps_key, options_.rank, p->round, slice_tensor(p->value, p->slice, p->whole),
          p->resend};
      break;
    case kv_call::pushpull:
      whole = wire::pushpull{id,
                             ps_key,
                             options_.rank,
                             p->round,
                             slice_tensor(p->value, p->slice, p->whole),
                             timeout_ms(),
                             p->resend};
      break;
    case kv_call::pull:
      whole = wire::pull_request{id, ps_key, options_.rank, p->round, timeout_ms()};
      break;
    case kv_call::every_server:
      return;
    }
    sent(id, p);
    const auto keepalive = p->value.is_none() ? nullptr : p->value.keepalive();
    if (wire::tensor_of(whole) == nullptr) {
      send(p->server, envelope{std::move(whole), nullptr, 0});
      return;
    }
    wire::chunker chunks{std::move(whole), options_.chunk_bytes};
    for (std::size_t c = 0; c < chunks.chunk_count(); ++c)
      send(p->server, envelope{chunks.chunk(c), keepalive, 0});
  }

  /// The bytes push `p` sends, copied: the caller may reuse its array once the push is acked.
  static ndarray copy_slice(const part& p) {
    const auto tensor = slice_tensor(p.value, p.slice, p.whole);
    shape_vector shape(tensor.shape.begin(), tensor.shape.end());
    auto copy = ndarray::empty(shape, context::cpu(), p.value.dtype());
    std::memcpy(copy.raw_data(), tensor.data.data(), tensor.data.size());
    return copy;
  }

  void sent(std::uint64_t id, const std::shared_ptr<part>& p) {
    p->sent_at = clock::now();
    p->traced_since_us = trace_start_time();
    parts_.emplace(id, p);
  }

  /// What the summary and the job trace note of an answered push, pull or pushpull.
  void note_answered(const part& p) {
    if (p.kind == kv_call::init || p.kind == kv_call::every_server)
      return;
    // Every answer passes here: without a summary to print or a trace to record, nothing is
    // counted.
    const bool summarised = options_.summary_log.enabled(log_level::info);
    if (!summarised && p.traced_since_us == 0)
      return;
    const auto elapsed =
        std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - p.sent_at);
    const auto element =
        static_cast<std::uint64_t>(p.value.is_none() ? 0 : size_of(p.value.dtype()));
    const std::uint64_t pushed =
        p.kind == kv_call::pull ? 0 : static_cast<std::uint64_t>(p.slice.size()) * element;
    const std::uint64_t pulled = p.kind == kv_call::push ? 0 : p.out_bytes.size();
    if (traffic_.size() < links_.size())
      traffic_.resize(links_.size());
    if (p.server < traffic_.size()) {
      auto& to = traffic_[p.server];
      ++to.requests;
      to.bytes_pushed += pushed;
      to.bytes_pulled += pulled;
    }
    const auto kind = static_cast<std::size_t>(p.kind == kv_call::push   ? answer_kind::push
                                               : p.kind == kv_call::pull ? answer_kind::pull
                                                                         : answer_kind::pushpull);
    answer_times_[kind].record(elapsed);
    if (p.traced_since_us != 0)
      job_trace::process().record({kind_names[kind], p.slice.ps_key, p.round, p.server,
                                   pushed + pulled, p.traced_since_us, job_trace::now_us()});
  }

  void log_summary() const {
    if (!options_.summary_log.enabled(log_level::info))
      return;
    for (std::size_t s = 0; s < traffic_.size(); ++s)
      options_.summary_log.info("to " + names_[s] + ": " + std::to_string(traffic_[s].requests) +
                                " requests, " + std::to_string(traffic_[s].bytes_pushed) +
                                " bytes pushed, " + std::to_string(traffic_[s].bytes_pulled) +
                                " bytes pulled");
    for (std::size_t k = 0; k < answer_times_.size(); ++k)
      if (answer_times_[k].count() > 0)
        options_.summary_log.info(std::string{kind_names[k]} + " times over " +
                                  std::to_string(answer_times_[k].count()) + " requests: p50 " +
                                  describe_us(answer_times_[k].quantile_us(0.5)) + ", p99 " +
                                  describe_us(answer_times_[k].quantile_us(0.99)));
    // This process's data links, as the servers' summaries count theirs.
    options_.summary_log.info(describe_tensor_bytes(process_link_tensor_bytes()));
  }

  void send(std::uint32_t server, envelope request) {
    // The tag comes back on every reply of an in-process link; network links add it themselves.
    request.connection = server + 1;
    // A server being recovered: the request stays under way and is sent again once it is back.
    if (!servers_.empty() && servers_[server].down)
      return;
    self()->send(links_[server], std::move(request));
  }

  // --- replies -------------------------------------------------------------------------------

  void on_reply(envelope& reply) {
    const auto id = wire::request_id_of(reply.msg);
    auto found = parts_.find(id);
    if (found == parts_.end()) {
      if (const auto* err = std::get_if<wire::error_reply>(&reply.msg); err && id == 0)
        options_.log.error("a server refused a frame: " + err->message);
      else
        options_.log.debug([&] {
          return "dropped a late " + std::string{wire::kind_name(reply.msg)} + " for request " +
                 std::to_string(id);
        });
      return;
    }
    auto p = found->second;
    if (const auto* ack = std::get_if<wire::ack>(&reply.msg)) {
      if (p->kind == kv_call::push)
        learn_round(p->slice.ps_key, ack->round, ack->dropped, ack->durable);
      finish(id, p, ok());
    } else if (std::holds_alternative<wire::pull_reply>(reply.msg)) {
      on_value(id, p, reply);
    } else if (const auto* err = std::get_if<wire::error_reply>(&reply.msg)) {
      forget_failed_push(*p);
      finish(id, p, from_wire(*err, what_of(*p) + ": "));
    } else {
      finish(id, p,
             error{errc::malformed_message, what_of(*p) + ": unexpected " +
                                                std::string{wire::kind_name(reply.msg)} +
                                                " reply"});
    }
  }

  /// What an answer says of the server's rounds of a key: more credit. A push dropped because
  /// its round closed with a quorum of other workers leaves this worker's round numbers as they
  /// are: every worker pushes every round, so every round reaches its quorum and no pull waits
  /// forever. Moving a straggler forward to the round being collected would make it skip rounds
  /// and push, at the end, a round the others never push.
  void learn_round(std::uint64_t ps_key, std::uint64_t completed, bool dropped,
                   std::uint64_t durable) {
    auto& ps = keys_[ps_key];
    ps.durable = std::max(ps.durable, durable);
    while (!ps.kept.empty() && ps.kept.front().round < ps.durable)
      ps.kept.pop_front();
    if (!options_.sync)
      return;
    ps.completed = std::max(ps.completed, completed);
    if (dropped)
      ++dropped_pushes_;
    release_waiting(ps);
  }

  /// dist_async: a push the server refused was not applied, and the caller hears so; sent again
  /// after a restart, it could be. (In dist_sync a round whose update failed closed all the same,
  /// and a restored server needs every worker's push of it again.)
  void forget_failed_push(const part& p) {
    if (options_.sync || (p.kind != kv_call::push && p.kind != kv_call::pushpull))
      return;
    auto& kept = keys_[p.slice.ps_key].kept;
    std::erase_if(kept, [&](const kept_push& push) { return push.round == p.round; });
  }

  void on_value(std::uint64_t id, const std::shared_ptr<part>& p, envelope& reply) {
    const auto& value = std::get<wire::pull_reply>(reply.msg);
    if (!p->assembly) {
      finish(id, p, error{errc::malformed_message, what_of(*p) + ": unexpected pull reply"});
      return;
    }
    if (!p->reply_seen) {
      p->reply_seen = true;
      learn_round(p->slice.ps_key, value.round, false, value.durable);
    }
    if (!p->copy_off_thread) {
      auto [how, problem] = copy_chunk(*p, value);
      on_chunk_copied(id, p, how, problem);
      return;
    }
    // The envelope travels with the copy: it keeps the received bytes (and their receive
    // credit) until they are copied.
    auto worker = caf::actor_cast<worker_actor>(self());
    self()->send(copier_, reply_copy{[worker, id, p, chunk = std::move(reply)] {
                   std::pair<chunk_copy, std::string> outcome;
                   try {
                     outcome = copy_chunk(*p, std::get<wire::pull_reply>(chunk.msg));
                   } catch (const std::exception& e) {
                     outcome = {chunk_copy::failed, e.what()};
                   }
                   caf::anon_send(worker, copied_atom::value, id,
                                  static_cast<std::uint8_t>(outcome.first),
                                  std::move(outcome.second));
                 }});
  }

  void on_copied(std::uint64_t id, std::uint8_t how, const std::string& problem) {
    auto found = parts_.find(id);
    // Gone: the request failed or timed out while its chunks were being copied.
    if (found == parts_.end() || how > static_cast<std::uint8_t>(chunk_copy::failed))
      return;
    auto p = found->second;
    on_chunk_copied(id, p, static_cast<chunk_copy>(how), problem);
  }

  void on_chunk_copied(std::uint64_t id, const std::shared_ptr<part>& p, chunk_copy how,
                       const std::string& problem) {
    switch (how) {
    case chunk_copy::more:
      return;
    case chunk_copy::cancelled:
      parts_.erase(id);
      return;
    case chunk_copy::failed:
      finish(id, p, error{errc::malformed_message, what_of(*p) + ": " + problem});
      return;
    case chunk_copy::complete:
      break;
    }
    auto& target = *p->target;
    status outcome;
    if (--target.slices_left == 0 && !target.copies.empty())
      outcome = status_of([&]() -> status {
        p->call->done.while_live([&] {
          for (auto& out : target.copies)
            target.buffer.copy_to(out);
        });
        return ok();
      });
    finish(id, p, std::move(outcome));
  }

  void finish(std::uint64_t id, const std::shared_ptr<part>& p, status outcome) {
    if (outcome)
      note_answered(*p);
    parts_.erase(id);
    auto& call = *p->call;
    if (!outcome)
      call.end(std::move(outcome));
    else if (call.remaining > 0 && --call.remaining == 0)
      call.end(ok());
    maybe_finalized();
  }

  // --- failures and time ---------------------------------------------------------------------

  void on_link_down(std::uint64_t tag, const std::string& why) {
    if (tag == 0 || tag > names_.size())
      return;
    // A server that refused this worker's handshake (its node key, its token) was not lost: it
    // said no, and will say it again.
    if (auto refusal = handshake_refusal(why))
      return fail_everything(
          error{errc::invalid_argument, names_[tag - 1] + " refused this worker: " + *refusal});
    if (recovery() && tag <= servers_.size()) {
      // Only the server's current link counts: an old one may close after the new one opened.
      if (self()->current_sender() != caf::actor_cast<caf::strong_actor_ptr>(links_[tag - 1]))
        return;
      hold_server(static_cast<std::uint32_t>(tag - 1), why);
      return;
    }
    std::string text = names_[tag - 1] + " was lost: " + why;
    // The scheduler's notice naming the node that was really lost usually arrives within a
    // moment; a server may only be closing because the job already failed.
    self()->delayed_send(self(), options_.link_down_grace, peer_lost_atom::value, std::move(text));
  }

  /// Every call under way and every later one fails with `why`; the first failure wins.
  void fail_everything(error why) {
    if (failure_)
      return;
    failure_ = why;
    options_.log.error(why.message());
    auto failed = std::move(parts_);
    parts_.clear();
    for (auto& [id, p] : failed)
      p->call->end(error{why.code(), what_of(*p) + ": " + why.message()});
    for (auto& [key, ps] : keys_) {
      for (auto& p : ps.waiting)
        p->call->end(error{why.code(), what_of(*p) + ": " + why.message()});
      ps.waiting.clear();
    }
    maybe_finalized();
  }

  void on_membership(const wire::membership& table) {
    for (const auto& node : table.nodes)
      if (node.node_role == wire::role::worker && !node.alive)
        options_.log.info(wire::describe(node) + " is gone; the job goes on");
    if (!recovery() || failure_)
      return;
    for (const auto& node : table.nodes) {
      if (node.node_role != wire::role::server || node.rank >= servers_.size())
        continue;
      auto& server = servers_[node.rank];
      if (!node.alive) {
        server.seen_lost = true;
        hold_server(node.rank, "the scheduler lists it lost");
      } else if (server.seen_lost && !server.relinking) {
        server.seen_lost = false;
        server.relinking = true;
        relink(node);
      }
    }
  }

  /// Server recovery: requests to `server` wait (bounded) for it to come back.
  void hold_server(std::uint32_t server, const std::string& why) {
    auto& state = servers_[server];
    if (state.down)
      return;
    state.down = true;
    state.down_since = clock::now();
    options_.log.error(names_[server] + " was lost: " + why + "; waiting up to " +
                       describe(options_.server_rejoin + options_.request_timeout) +
                       " for it to come back from its checkpoint");
  }

  /// Connects to the server's new address on a helper thread (connecting blocks); the link comes
  /// back as server_relink.
  void relink(const wire::node_info& node) {
    auto worker = caf::actor_cast<worker_actor>(self());
    auto receiver = caf::actor_cast<caf::actor>(self());
    // Passed as arguments, not captured: CAF 0.17.6's init_fun_factory dereferences a null
    // argument tuple for a function without arguments (see reply_copier).
    self()->system().template spawn<caf::detached>(
        [](caf::event_based_actor* helper, const worker_actor& worker, const caf::actor& receiver,
           const reconnect_function& connect, const wire::node_info& node) {
          server_relink relink;
          relink.server = node.rank;
          relink.name =
              wire::describe(node) + " at " + node.host + ":" + std::to_string(node.data_port);
          auto link = status_of([&]() -> status {
            auto opened = connect(node, receiver);
            if (!opened)
              return opened.error();
            relink.link = *opened;
            return ok();
          });
          if (!link)
            relink.problem = link.error().message();
          caf::anon_send(worker, std::move(relink));
          helper->quit();
        },
        worker, receiver, options_.reconnect, node);
  }

  void on_relink(server_relink& relink) {
    if (relink.server >= servers_.size())
      return;
    auto& state = servers_[relink.server];
    state.relinking = false;
    if (failure_) {
      if (relink.link)
        self()->send(*relink.link, stop_atom::value);
      return;
    }
    if (!relink.link) {
      fail_everything(error{errc::peer_lost, relink.name + " came back from its checkpoint, but " +
                                                 "the worker cannot reach it: " + relink.problem});
      return;
    }
    self()->send(links_[relink.server], stop_atom::value);
    links_[relink.server] = *relink.link;
    names_[relink.server] = relink.name;
    state.down = false;
    const auto [kept, under_way] = resend(relink.server);
    options_.log.info(relink.name + " is back from its checkpoint: sent again " +
                      std::to_string(kept) + " kept pushes and " + std::to_string(under_way) +
                      " other requests under way");
  }

  /// After `server` restarted from its checkpoint: every kept push of its ps-keys (those its
  /// checkpoint holds are acked without being applied) and every request under way to it, per
  /// ps-key in round order, with the credit counted from the durable round. Returns how many
  /// kept pushes and how many other requests go again.
  std::pair<std::size_t, std::size_t> resend(std::uint32_t server) {
    std::pair<std::size_t, std::size_t> counts;
    std::unordered_map<std::uint64_t, std::vector<std::shared_ptr<part>>> under_way;
    std::vector<std::pair<std::uint64_t, std::shared_ptr<part>>> lost;
    for (auto it = parts_.begin(); it != parts_.end();) {
      if (it->second->server != server) {
        ++it;
        continue;
      }
      auto& p = it->second;
      const bool keyed =
          p->kind == kv_call::push || p->kind == kv_call::pushpull || p->kind == kv_call::pull;
      // A reply being copied on the copier thread cannot be started afresh here.
      if (!keyed || (p->reply_seen && p->copy_off_thread))
        lost.emplace_back(it->first, p);
      else
        under_way[p->slice.ps_key].push_back(p);
      it = parts_.erase(it);
    }
    for (auto& [id, p] : lost)
      finish(id, p,
             error{errc::peer_lost, what_of(*p) + ": " + names_[server] +
                                        " restarted from its checkpoint while it was under way"});
    for (auto& [ps_key, ps] : keys_) {
      if (ps.server != server)
        continue;
      auto& requests = under_way[ps_key];
      std::sort(requests.begin(), requests.end(),
                [](const auto& a, const auto& b) { return a->round < b->round; });
      std::deque<std::shared_ptr<part>> again;
      for (const auto& kept : ps.kept) {
        auto match = std::find_if(requests.begin(), requests.end(), [&](const auto& p) {
          return p->kind != kv_call::pull && p->round == kept.round;
        });
        std::shared_ptr<part> p;
        if (match != requests.end()) {
          p = *match;
          requests.erase(match);
        } else {
          // Acked before the server went: its call is over, only the server needs it again.
          auto replay = std::make_shared<call_state>();
          p = new_part(replay, kv_call::push, server, std::to_string(ps_key));
        }
        p->value = kept.copy;
        p->slice = key_slice{server, ps_key, 0, kept.copy.size()};
        p->whole = true;
        p->round = kept.round;
        again.push_back(std::move(p));
      }
      counts.first += again.size();
      counts.second += requests.size();
      for (auto& p : requests) // pulls, which wait for the pushes before them
        again.push_back(p);
      for (auto& p : again) {
        p->resend = true;
        p->reply_seen = false;
        if (p->assembly)
          p->assembly.emplace(p->out_bytes, p->out_type, p->out_shape);
      }
      ps.completed = std::min(ps.completed, ps.durable);
      for (auto it = again.rbegin(); it != again.rend(); ++it)
        ps.waiting.push_front(*it);
      release_waiting(ps);
    }
    return counts;
  }

  void schedule_tick() { self()->delayed_send(self(), tick_interval_, tick_atom::value); }

  void on_tick() {
    schedule_tick();
    const auto now = clock::now();
    std::vector<std::uint64_t> overdue;
    for (std::uint32_t server = 0; server < servers_.size(); ++server)
      if (servers_[server].down &&
          now - servers_[server].down_since > options_.server_rejoin + options_.request_timeout) {
        fail_everything(error{errc::peer_lost,
                              names_[server] + " was lost and did not come back within " +
                                  describe(options_.server_rejoin + options_.request_timeout)});
        return;
      }
    for (const auto& [id, p] : parts_)
      if (p->call->done.cancelled() ||
          (now - p->sent_at > options_.request_timeout &&
           (servers_.size() <= p->server || !servers_[p->server].down)))
        overdue.push_back(id);
    for (auto id : overdue) {
      auto found = parts_.find(id);
      if (found == parts_.end())
        continue;
      auto p = found->second;
      if (p->call->done.cancelled()) {
        parts_.erase(found);
        continue;
      }
      error why{errc::timeout, what_of(*p) + " not answered within " +
                                   describe(options_.request_timeout) + " of being sent"};
      if (p->kind != kv_call::every_server)
        fail_waiting(p->slice.ps_key, why);
      finish(id, p, why);
    }
    if (finalizing_ && now > finalize_deadline_) {
      finalizing_->deliver(error{errc::timeout, "finalize: requests still under way after " +
                                                    describe(options_.request_timeout)});
      finalizing_.reset();
    }
  }

  /// The requests of a key queued behind one that failed can never go out in order.
  void fail_waiting(std::uint64_t ps_key, const error& why) {
    auto found = keys_.find(ps_key);
    if (found == keys_.end())
      return;
    for (auto& p : found->second.waiting)
      p->call->end(error{why.code(),
                         what_of(*p) + ": waiting behind a request that failed: " + why.message()});
    found->second.waiting.clear();
  }

  void on_finalize(completion<status> done) {
    finalizing_ = std::move(done);
    finalize_deadline_ = clock::now() + options_.request_timeout;
    maybe_finalized();
  }

  void maybe_finalized() {
    if (!finalizing_ || !parts_.empty())
      return;
    for (const auto& [key, ps] : keys_)
      if (!ps.waiting.empty())
        return;
    if (dropped_pushes_ > 0)
      options_.log.info(std::to_string(dropped_pushes_) +
                        " pushes arrived after their round had closed and were dropped");
    log_summary();
    finalizing_->deliver(ok());
    finalizing_.reset();
  }

  pointer self_ = nullptr;
  kv_worker_options options_;
  reply_copier_actor copier_;
  std::chrono::milliseconds tick_interval_{100};
  std::vector<link_actor> links_;
  std::vector<std::string> names_;
  std::vector<server_state> servers_;
  std::unordered_map<std::uint64_t, std::shared_ptr<part>> parts_;
  std::unordered_map<std::uint64_t, ps_key_state> keys_;
  std::uint64_t next_request_id_ = 1;
  std::uint64_t dropped_pushes_ = 0;
  /// For the summary: per server, and the answer times per kind of request.
  struct server_traffic {
    std::uint64_t requests = 0;
    std::uint64_t bytes_pushed = 0;
    std::uint64_t bytes_pulled = 0;
  };
  enum class answer_kind : std::size_t { push, pull, pushpull };
  static constexpr std::array<const char*, 3> kind_names{"push", "pull", "pushpull"};
  std::vector<server_traffic> traffic_;
  std::array<latency_histogram, 3> answer_times_;
  std::optional<error> failure_;
  std::optional<completion<status>> finalizing_;
  clock::time_point finalize_deadline_;
};

template <class Base>
worker_actor::behavior_type worker_behavior(typename worker_state<Base>::pointer self,
                                            kv_worker_options options) {
  return self->state.start(self, std::move(options));
}

} // namespace

worker_actor spawn_kv_worker(caf::actor_system& system, kv_worker_options options) {
  if (system.has_middleman())
    return system.middleman().spawn_broker(worker_behavior<worker_on_io_thread>,
                                           std::move(options));
  return system.spawn(worker_behavior<worker_on_scheduler>, std::move(options));
}

} // namespace troupe

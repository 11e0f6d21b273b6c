#include "actors/server_node.hpp"

#include <map>
#include <memory>
#include <optional>
#include <unistd.h>

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/bridge.hpp"
#include "actors/data_link.hpp"

namespace troupe {
namespace {

/// One request fanned out to every shard: replies still missing, the first error, the requester.
struct fan_out {
  std::uint64_t original_id = 0;
  std::uint32_t missing = 0;
  std::optional<envelope> failure;
  reply_sink reply_to;
  std::uint64_t connection = 0;
};

struct control_state {
  std::vector<shard_actor> shards;
  std::uint64_t next_id = 1;
  std::map<std::uint64_t, fan_out> pending; // by the id the shards see
  static inline const char* name = "troupe.server_control";
};

server_control_actor::behavior_type
control_behavior(server_control_actor::stateful_pointer<control_state> self,
                 std::vector<shard_actor> shards) {
  self->state.shards = std::move(shards);
  return {
      // A worker's request (set_optimizer, sync_settings, a command) goes to every shard under
      // an id of our own, so that concurrent requests of several workers (whose ids may collide)
      // are told apart.
      [self](envelope& request, const reply_sink& reply_to) {
        auto& st = self->state;
        auto* id = wire::request_id_field(request.msg);
        if (id == nullptr)
          return;
        auto own_id = st.next_id++;
        st.pending[own_id] = fan_out{*id, static_cast<std::uint32_t>(st.shards.size()),
                                     std::nullopt, reply_to, request.connection};
        *id = own_id;
        auto answers = caf::actor_cast<reply_sink>(self);
        for (auto& shard : st.shards)
          self->send(shard, envelope{request.msg, request.keepalive, 0}, answers);
      },
      // A shard's answer.
      [self](envelope& reply) {
        auto& st = self->state;
        auto* id = wire::request_id_field(reply.msg);
        if (id == nullptr)
          return;
        auto found = st.pending.find(*id);
        if (found == st.pending.end())
          return;
        auto& entry = found->second;
        if (std::holds_alternative<wire::error_reply>(reply.msg) && !entry.failure)
          entry.failure = std::move(reply);
        if (--entry.missing > 0)
          return;
        envelope answer =
            entry.failure ? std::move(*entry.failure) : envelope{wire::ack{}, nullptr, 0};
        *wire::request_id_field(answer.msg) = entry.original_id;
        answer.connection = entry.connection;
        self->send(entry.reply_to, std::move(answer));
        st.pending.erase(found);
      },
  };
}

bool is_keyed(const wire::message& msg) {
  return std::holds_alternative<wire::init>(msg) || std::holds_alternative<wire::push>(msg) ||
         std::holds_alternative<wire::pull_request>(msg) ||
         std::holds_alternative<wire::pushpull>(msg);
}

/// The shard, of `shards`, that holds a keyed request's ps-key.
std::uint32_t shard_for(const wire::message& keyed, std::size_t shards) {
  return shard_of(wire::key_of(keyed).value_or(0), static_cast<std::uint32_t>(shards));
}

/// The keyless requests a server takes, which the control actor fans out to every shard.
bool is_for_every_shard(const wire::message& msg) {
  return std::holds_alternative<wire::set_optimizer>(msg) ||
         std::holds_alternative<wire::set_gradient_compression>(msg) ||
         std::holds_alternative<wire::sync_settings>(msg) ||
         std::holds_alternative<wire::command>(msg);
}

link_actor::behavior_type local_link_behavior(link_actor::pointer self,
                                              std::function<request_handler(const envelope&)> route,
                                              reply_sink reply_to) {
  auto forward_one = [self, route = std::move(route), reply_to](envelope& request) {
    if (auto target = route(request)) {
      self->send(target, std::move(request), reply_to);
      return;
    }
    self->send(reply_to, envelope{no_handler_reply(request.msg), nullptr, request.connection});
  };
  // A batch's messages each as if they had come alone, in order, as a data server takes them.
  auto forward = [forward_one](envelope& request) {
    auto* fused = std::get_if<wire::batch>(&request.msg);
    if (fused == nullptr)
      return forward_one(request);
    for (auto& one : fused->messages) {
      envelope each{wire::unbatched(std::move(one)), request.keepalive, request.connection};
      forward_one(each);
    }
  };
  return {
      forward,
      [forward](handed_atom, envelope& request) { forward(request); },
      // A store closes its links at finalize, whichever kind they are.
      [self](stop_atom) { self->quit(); },
      [](caf::get_atom) { return std::string{"in-process"}; },
  };
}

} // namespace

std::uint64_t default_max_store_bytes() noexcept {
  return static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
         static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)) / 2;
}

request_router::request_router(std::vector<shard_actor> shards, request_handler control,
                               std::vector<std::shared_ptr<shard_lane>> lanes)
    : shards_(std::move(shards)), control_(std::move(control)), lanes_(std::move(lanes)) {}

request_handler request_router::operator()(const envelope& request) const {
  if (is_keyed(request.msg) && !shards_.empty())
    return shards_[shard_for(request.msg, shards_.size())];
  if (is_for_every_shard(request.msg))
    return control_;
  // Another server's hand-over goes to the shard of the same index, which answers one it has not.
  if (const auto* moved = std::get_if<wire::range_data>(&request.msg); moved && !shards_.empty())
    return shards_[moved->shard < shards_.size() ? moved->shard : 0];
  // Kinds a server never takes (replies, the scheduler's messages, heartbeats): the broker
  // answers them at once with unsupported, and nothing is kept for them.
  return {};
}

bool request_router::take(envelope& request, const reply_sink& broker) const {
  if (!is_keyed(request.msg) || lanes_.empty())
    return false;
  lanes_[shard_for(request.msg, lanes_.size())]->take(std::move(request), broker);
  return true;
}

void request_router::membership(const wire::membership& table) const {
  for (std::size_t i = 0; i < shards_.size(); ++i)
    if (i < lanes_.size())
      lanes_[i]->hand(shards_[i], table);
    else
      caf::anon_send(shards_[i], table);
}

void request_router::connection_closed(std::uint64_t connection) const {
  for (const auto& shard : shards_)
    caf::anon_send(shard, closed_atom::value, connection);
}

server_node::server_node(caf::actor_system& system, server_node_options options)
    : system_(system), options_(std::move(options)), router_({}, {}) {
  if (options_.max_store_bytes == 0)
    options_.max_store_bytes = default_max_store_bytes();
  auto store_bytes = std::make_shared<std::atomic<std::uint64_t>>(0);
  std::vector<std::shared_ptr<shard_lane>> lanes;
  for (std::uint32_t i = 0; i < options_.shards; ++i) {
    shard_options shard;
    shard.shard_index = i;
    shard.num_workers = options_.num_workers;
    shard.max_workers = options_.max_workers;
    shard.num_servers = options_.num_servers;
    shard.num_ranges = options_.num_ranges;
    shard.server_rank = options_.server_rank;
    shard.shards_per_server = options_.shards;
    shard.checkpoint = options_.checkpoint;
    shard.policy.mode = options_.mode;
    shard.chunk_bytes = options_.chunk_bytes;
    shard.pull_timeout = options_.pull_timeout;
    shard.sweep_interval = options_.sweep_interval;
    shard.max_value_bytes = options_.max_value_bytes;
    shard.stalled_init = options_.stalled_init;
    shard.store_bytes = store_bytes;
    shard.max_store_bytes = options_.max_store_bytes;
    shard.update_device = options_.update_device;
    if (i < options_.restore.size())
      shard.restore_from = std::move(options_.restore[i]);
    shard.log = options_.log.part("shard " + std::to_string(i));
    lanes.push_back(std::make_shared<shard_lane>(shard.update_device.is_cpu()));
    shards_.push_back(spawn_server_shard(system, std::move(shard), lanes.back()));
    if (options_.on_shard_failure)
      shards_.back()->attach_functor([i, told = options_.on_shard_failure](const caf::error& why) {
        if (why && why != caf::exit_reason::user_shutdown)
          told("shard " + std::to_string(i) + " of this server failed: " + caf::to_string(why));
      });
  }
  options_.restore.clear();
  control_ = system.spawn(control_behavior, shards_);
  router_ = request_router{shards_, control_, std::move(lanes)};
}

server_node::~server_node() {
  for (auto& shard : shards_)
    caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(control_, caf::exit_reason::user_shutdown);
}

void server_node::broadcast(const wire::membership& table) const {
  router_.membership(table);
}

void server_node::set_rank(std::uint32_t rank) const {
  for (const auto& shard : shards_)
    caf::anon_send(shard, rank_atom::value, rank);
}

result<shard_stats> server_node::stats(std::chrono::milliseconds timeout) const {
  completion<result<shard_stats>> done;
  struct tally {
    shard_stats sum;
    std::size_t missing = 0;
  };
  // A one-shot helper that takes no messages of its own, only the answers to its requests; CAF
  // 0.17 has no typed actor with an empty interface, so it stays a plain event_based_actor. It
  // takes an unused argument: CAF 0.17.6's init_fun_factory dereferences a null argument tuple
  // for a function without one (UBSan reports it).
  system_.spawn(
      [shards = shards_, done, timeout](caf::event_based_actor* self, int) {
        if (shards.empty()) {
          done.deliver(shard_stats{});
          return;
        }
        auto counted = std::make_shared<tally>(tally{{}, shards.size()});
        for (const auto& shard : shards)
          self->request(shard, timeout, stats_atom::value)
              .then(
                  [counted, done](const shard_stats& stats) {
                    counted->sum += stats;
                    if (--counted->missing == 0)
                      done.deliver(counted->sum);
                  },
                  [done](const caf::error& failure) {
                    done.deliver(error{errc::timeout, "shard statistics: a shard did not answer (" +
                                                          caf::to_string(failure) + ")"});
                  });
      },
      0);
  // The helper's own requests end by `timeout`; the margin covers its start.
  auto got = done.wait_or_cancel(completion<result<shard_stats>>::clock::now() + timeout +
                                 std::chrono::seconds{1});
  if (!got)
    return error{errc::timeout,
                 "shard statistics: no answer within " + std::to_string(timeout.count()) + " ms"};
  return *got;
}

link_actor spawn_local_link(caf::actor_system& system,
                            std::function<request_handler(const envelope&)> route,
                            reply_sink reply_to) {
  return system.spawn(local_link_behavior, std::move(route), std::move(reply_to));
}

} // namespace troupe

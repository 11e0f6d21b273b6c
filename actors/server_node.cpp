#include "actors/server_node.hpp"

#include <map>
#include <optional>

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

namespace troupe {
namespace {

/// One request fanned out to every shard: replies still missing, the first error, the requester.
struct fan_out {
  std::uint64_t original_id = 0;
  std::uint32_t missing = 0;
  std::optional<envelope> failure;
  caf::actor reply_to;
  std::uint64_t connection = 0;
};

struct control_state {
  std::vector<caf::actor> shards;
  std::uint64_t next_id = 1;
  std::map<std::uint64_t, fan_out> pending; // by the id the shards see
  static inline const char* name = "troupe.server_control";
};

caf::behavior control_actor(caf::stateful_actor<control_state>* self,
                            std::vector<caf::actor> shards) {
  self->state.shards = std::move(shards);
  return {
      // A worker's request goes to every shard under an id of our own, so that concurrent
      // requests of several workers (whose ids may collide) are told apart.
      [self](envelope& request, const caf::actor& reply_to) {
        auto& st = self->state;
        auto* id = wire::request_id_field(request.msg);
        if (id == nullptr)
          return;
        auto own_id = st.next_id++;
        st.pending[own_id] = fan_out{*id, static_cast<std::uint32_t>(st.shards.size()),
                                     std::nullopt, reply_to, request.connection};
        *id = own_id;
        auto self_handle = caf::actor_cast<caf::actor>(self);
        for (auto& shard : st.shards)
          self->send(shard, envelope{request.msg, request.keepalive, 0}, self_handle);
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

caf::behavior local_link_actor(caf::event_based_actor* self,
                               std::function<caf::actor(const envelope&)> route,
                               caf::actor reply_to) {
  return {
      [self, route = std::move(route), reply_to](envelope& request) {
        self->send(route(request), std::move(request), reply_to);
      },
  };
}

} // namespace

server_node::server_node(caf::actor_system& system, server_node_options options)
    : options_(options) {
  for (std::uint32_t i = 0; i < options_.shards; ++i)
    shards_.push_back(spawn_server_shard(
        system, shard_options{i, options_.num_workers, options_.mode, options_.chunk_bytes}));
  control_ = system.spawn(control_actor, shards_);
}

server_node::~server_node() {
  for (auto& shard : shards_)
    caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(control_, caf::exit_reason::user_shutdown);
}

const caf::actor& server_node::route(const envelope& request) const {
  if (is_keyed(request.msg))
    return shards_[shard_of(wire::key_of(request.msg).value_or(0), options_.shards)];
  return control_;
}

void server_node::broadcast(const wire::membership& table) const {
  for (const auto& shard : shards_)
    caf::anon_send(shard, table);
}

std::function<caf::actor(const envelope&)> server_node::router() const {
  // Copies of the handles: the function may outlive this object's caller but not the actors.
  return [shards = shards_, control = control_](const envelope& request) -> caf::actor {
    if (is_keyed(request.msg))
      return shards[shard_of(wire::key_of(request.msg).value_or(0),
                             static_cast<std::uint32_t>(shards.size()))];
    return control;
  };
}

caf::actor spawn_local_link(caf::actor_system& system,
                            std::function<caf::actor(const envelope&)> route, caf::actor reply_to) {
  return system.spawn(local_link_actor, std::move(route), std::move(reply_to));
}

} // namespace troupe

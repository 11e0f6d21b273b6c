#pragma once
// Every interface between troupe's actors, in one place: the atoms, the in-process message types,
// and one caf::typed_actor per kind of actor with a comment per handler. A message an actor does
// not handle fails to compile at the send. The plain types that the actors' logic also handles
// without CAF have headers of their own: the envelope (actors/logic/envelope.hpp), shard_stats,
// and a KVStore call with its completion (actors/logic/kv_operation.hpp).
//
// Two transports, one message form. Between processes every message, control or data, is a
// Cap'n Proto frame (schema/codec.hpp) on troupe's own framed links (actors/data_link.hpp): the
// link brokers decode a frame into an `envelope` whose tensor spans point into the pooled frame
// buffer it keeps alive, and encode an outgoing envelope into a frame. No CAF remote-actor (BASP)
// port faces the network. Within one process the same envelope passes from actor to actor
// without any encoding: the tensor spans point into an ndarray's storage, which `keepalive`
// holds. So a shard runs one code path whether its worker is a thread away or a network away.
//
// Who talks to whom (docs/architecture.md has the picture):
//
//   worker ──envelope──> link ══frames══> data server ──(envelope, reply_sink)──> shard / control
//   worker <─envelope─── link <══frames══ data server <───────(envelope)─────────┘
//   node agent <──envelope── link <══frames══> control server ──(envelope, sink)──> scheduler
//   node agent <──────────────────────envelope─────────────────── sink <── scheduler / job barrier

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/bridge.hpp"
#include "actors/logic/envelope.hpp"
#include "actors/logic/kv_operation.hpp"
#include "actors/logic/link_auth.hpp"
#include "actors/logic/scheduler_core.hpp"
#include "actors/logic/shard_checkpoint.hpp"
#include "actors/logic/shard_stats.hpp"
#include "engine/error.hpp"
#include "engine/ndarray.hpp"
#include "schema/messages.hpp"

namespace troupe {

// --- atoms (at most 10 characters in CAF 0.17) --------------------------------------------------
using link_down_atom = caf::atom_constant<caf::atom("link_down")>;
using peer_lost_atom = caf::atom_constant<caf::atom("peer_lost")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using closed_atom = caf::atom_constant<caf::atom("closed")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using subscribe_atom = caf::atom_constant<caf::atom("subscribe")>;
using finalize_atom = caf::atom_constant<caf::atom("finalize")>;
using copied_atom = caf::atom_constant<caf::atom("copied")>;
using failed_atom = caf::atom_constant<caf::atom("failed")>;
using rank_atom = caf::atom_constant<caf::atom("rank")>;
using handed_atom = caf::atom_constant<caf::atom("handed")>;
using held_atom = caf::atom_constant<caf::atom("held")>;
using hand_over_atom = caf::atom_constant<caf::atom("hand_over")>;

// --- links ---------------------------------------------------------------------------------------

/// Whoever takes the replies to requests it handed on: a data server broker (writes each envelope
/// on connection envelope.connection) or, in one process, the worker that sent the request.
using reply_sink = caf::typed_actor<caf::reacts_to<envelope>>;

/// The replies made on a data server broker's own thread while it hands a request on
/// (data_server_options::take_request answering it there, shard_lane::take): the broker queues
/// them when the hand-over returns, instead of each coming back as a message to itself (a
/// mailbox element per small reply). Whoever replies to a reply_sink checks for it
/// (collect_here); a reply made on another thread, or for another sink, is sent as before.
struct reply_collector {
  /// The broker whose replies are collected.
  const void* sink = nullptr;
  std::vector<envelope> replies;

  /// This thread's collector, or null.
  static reply_collector*& current() noexcept {
    thread_local reply_collector* here = nullptr;
    return here;
  }
  /// Makes `collector` this thread's for as long as it lives, then puts back the one before.
  class scope {
  public:
    explicit scope(reply_collector& collector) : outer_(std::exchange(current(), &collector)) {}
    ~scope() { current() = outer_; }
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;

  private:
    reply_collector* outer_;
  };

  /// Keeps `reply` when this thread collects for `sink`; false: send it.
  static bool collect_here(const void* sink, envelope& reply) {
    auto* here = current();
    if (here == nullptr || here->sink != sink)
      return false;
    here->replies.push_back(std::move(reply));
    return true;
  }
};

/// A link, either end: a data link broker (actors/data_link.hpp) or, within one process, a local
/// link (actors/server_node.hpp), so that a worker cannot tell which it holds.
///
/// The brokers are CAF 0.17 brokers (caf::io::stateful_broker), untyped inside: one behaviour
/// takes the I/O events of their scribes and doorman (new_data_msg, connection_closed_msg, ...)
/// and their own wake-ups (credit released on another thread, stats) besides the messages below,
/// and CAF 0.17 has no stateful typed broker. They are handed out only as link_actor, so a sender
/// can send them nothing else.
using link_actor = caf::typed_actor<
    /// Send this message: a client link to its server, a server broker on the envelope's
    /// connection.
    caf::reacts_to<envelope>,
    /// The same, handed through a client link's lane (actors/data_link.hpp, link_lane), which
    /// counts it until the link has taken it; a link without a lane takes it as (envelope).
    caf::reacts_to<handed_atom, envelope>,
    /// Close (a server: the acceptor and every connection) and quit.
    caf::reacts_to<stop_atom>,
    /// "host:port": where a server listens, or the peer of a client link.
    caf::replies_to<caf::get_atom>::with<std::string>>;

/// What a connection's handshake established beyond the job token, told to the link's owner
/// before any frame of the connection (data_link.hpp: data_server_options::on_authenticated,
/// data_link_options::on_authenticated).
struct link_authentication {
  /// The connection's session key, when its handshake exchanged keys (a control connection):
  /// what the scheduler seals a node's secret under (actors/logic/node_identity.hpp).
  session_key session;
  /// The node the peer proved to be, when the listener requires node proofs (a server's data
  /// port): the identity its requests are checked against.
  std::optional<wire::node_identity> node;
};

/// Anything that handles requests coming off a link: a server shard, a server's control actor, the
/// scheduler. Replies go to the sink as (envelope) carrying the request's connection id.
using request_handler = caf::typed_actor<caf::reacts_to<envelope, reply_sink>>;

// --- server --------------------------------------------------------------------------------------

/// A shard's part of a hand-over of key ranges to another server (elastic servers): `done` gets
/// its keys, encoded as they travel (RangeData), once they have left the shard
/// (shard_core::hand_over), or why the shard refused.
struct shard_hand_over {
  std::vector<std::uint32_t> ranges;
  completion<result<std::shared_ptr<const encoded_hand_over>>> done;
};

/// A server shard (actors/server_shard.hpp, its logic in actors/logic/shard_core.hpp).
using shard_actor = caf::typed_actor<
    /// A worker's request (init, push, pushpull, pull_request, set_optimizer, sync_settings,
    /// command); every reply, now or when a round completes, goes to the sink.
    caf::reacts_to<envelope, reply_sink>,
    /// The same, handed on by the data server's broker through the shard's lane
    /// (actors/server_shard.hpp, shard_lane::take), which counts it until it is handled.
    caf::reacts_to<handed_atom, envelope, reply_sink>,
    /// The job's membership changed (a worker lost, left or joined): bounded staleness waits for
    /// live workers only, rounds for their members.
    caf::reacts_to<wire::membership>,
    /// The same from the server's node (server_node::broadcast), counted by the shard's lane
    /// like a handed request, so that no request taken after it is answered before it.
    caf::reacts_to<handed_atom, wire::membership>,
    /// That connection of the data server closed: the inits it began and the unfinished pushes of
    /// its workers are dropped (shard_core::on_connection_closed).
    caf::reacts_to<closed_atom, std::uint64_t>,
    /// Expire pulls whose request has given up, drop stalled inits, and write a checkpoint when
    /// one is due (sent by the shard to itself).
    caf::reacts_to<tick_atom>,
    /// Its counters.
    caf::replies_to<stats_atom>::with<shard_stats>,
    /// The rank the scheduler gave its server, which names the server's files; sent once the
    /// server has joined (the shards exist before, to answer from the start).
    caf::reacts_to<rank_atom, std::uint32_t>,
    /// Hand the keys of key ranges over (shard_hand_over).
    caf::reacts_to<hand_over_atom, shard_hand_over>>;

/// A server's control actor (actors/server_node.hpp): the request_handler of every keyless request,
/// which it fans out to the server's shards.
using server_control_actor = caf::typed_actor<
    /// A worker's keyless request (set_optimizer, sync_settings, a command): sent to every shard
    /// under an id of the control actor's own; one answer, an ack or the first error, goes to the
    /// sink once every shard has answered.
    caf::reacts_to<envelope, reply_sink>,
    /// A shard's answer to one of those requests.
    caf::reacts_to<envelope>>;

// --- worker --------------------------------------------------------------------------------------

class link_lane; // actors/data_link.hpp

/// The links of a worker to the servers of its job, by server rank.
struct server_links {
  std::vector<link_actor> links;
  /// Per link, its lane when it has one (a data link opened with data_link_options::lane; null or
  /// missing: none, every frame goes as a message).
  std::vector<std::shared_ptr<link_lane>> lanes;
  /// How messages name each server: "server 1 (node 10) at 127.0.0.1:40123".
  std::vector<std::string> names;
};

/// A new link to a server that restarted from its checkpoint (a worker's helper connects it off
/// the I/O thread): the link and how messages name the server, or why it could not connect.
struct server_relink {
  std::uint32_t server = 0;
  std::optional<link_actor> link;
  std::string name;
  std::string problem;
};

/// A large reply chunk's copy into a caller's output, which a worker hands to its copier so that
/// the middleman's I/O thread, where the worker runs, goes on reading sockets while the bytes
/// move (actors/kv_worker.cpp). `run` reports back to the worker with copied_atom.
struct reply_copy {
  std::function<void()> run;
};

/// The worker's helper on CAF's scheduler: runs each reply_copy in the order it arrives.
using reply_copier_actor = caf::typed_actor<caf::reacts_to<reply_copy>>;

/// Work queued on one context by the dependency engine (engine/dispatch.hpp).
struct device_work {
  std::function<void()> run;
};

/// One device context's actor (actors/device_actors.hpp): runs that context's work one task at a
/// time, in the order it arrives, on a thread of its own.
using device_actor = caf::typed_actor<caf::reacts_to<device_work>>;

/// The KVStore worker of one process (actors/kv_worker.hpp).
using worker_actor = caf::typed_actor<
    /// Its links, once they are open (sent once, right after the spawn).
    caf::reacts_to<server_links>,
    /// A call from the blocking facade (dist_kvstore); handed: through its worker_lane, which
    /// counts it until it is handled (actors/kv_worker.hpp).
    caf::reacts_to<kv_operation>, caf::reacts_to<handed_atom, kv_operation>,
    /// A server that restarted from its checkpoint is linked again (or could not be).
    caf::reacts_to<server_relink>,
    /// A reply from the server linked under tag envelope.connection (its rank + 1).
    caf::reacts_to<envelope>,
    /// The link with that tag is gone, and why: every request fails naming the server.
    caf::reacts_to<link_down_atom, std::uint64_t, std::string>,
    /// The job failed (the node agent's notice, naming the lost node and its role).
    caf::reacts_to<peer_lost_atom, std::string>,
    /// The grace after the link with that tag went down is over (worker_core::on_lost_report).
    caf::reacts_to<peer_lost_atom, std::uint64_t, std::string>,
    /// The job's membership changed (a worker was lost and the job goes on).
    caf::reacts_to<wire::membership>,
    /// The scheduler ended the job: later calls fail.
    caf::reacts_to<stop_atom>,
    /// Sweep for requests whose timeout has passed (sent by the worker to itself).
    caf::reacts_to<tick_atom>,
    /// Deliver once every request under way has completed (or the timeout has passed).
    caf::reacts_to<finalize_atom, completion<result<std::uint64_t>>>,
    /// A link let go of a frame the worker handed it with this receipt (its keepalive is gone):
    /// its bytes leave the server's send window (worker_core::frame_left).
    caf::reacts_to<send_receipt>,
    /// Its copier copied (or could not copy) a chunk of the reply to request `id`: a chunk_copy
    /// and, when it failed, why.
    caf::reacts_to<copied_atom, std::uint64_t, std::uint8_t, std::string>>;

// --- control plane -------------------------------------------------------------------------------

/// Whoever wants to hear about the job from a node agent: a worker actor, a server.
using job_listener = caf::typed_actor<
    /// The job failed; the text names the lost node and its role.
    caf::reacts_to<peer_lost_atom, std::string>,
    /// The scheduler told this server to stop: the job ended well.
    caf::reacts_to<stop_atom>,
    /// A new membership table (a worker was lost within the quorum and the job goes on).
    caf::reacts_to<wire::membership>>;

/// A blocking node-agent call (barrier, done, sync settings to the scheduler), with its answer.
/// The agent sets the request id (and a barrier's id and sender) itself.
struct control_call {
  wire::message request;
  /// "barrier of group 4", "done": how errors name the call.
  std::string what;
  completion<status> done;
  /// A barrier: where the release's gathered values go before `done` is delivered; null when the
  /// caller wants none.
  std::shared_ptr<std::vector<wire::gathered_values>> gathered;
};

/// The node side of the control plane (actors/node_agent.hpp).
using node_agent_actor = caf::typed_actor<
    /// The control link to the scheduler is open (sent once, by node_agent::join): register.
    caf::reacts_to<caf::connect_atom, caf::actor>,
    /// Its handshake is done, and agreed this session key (told by the link before any frame).
    caf::reacts_to<link_authentication>,
    /// A frame from the scheduler, off the control link.
    caf::reacts_to<envelope>,
    /// The control link is gone.
    caf::reacts_to<link_down_atom, std::uint64_t, std::string>,
    /// Send a request to the scheduler and deliver its answer.
    caf::reacts_to<control_call>,
    /// Tell this listener about the job from now on (and at once, if it already ended).
    caf::reacts_to<subscribe_atom, job_listener>,
    /// This node failed (a server's shard died): tell the scheduler why, unasked.
    caf::reacts_to<failed_atom, std::string>,
    /// A server's shards hold the membership table with this request id: acknowledge it to the
    /// scheduler (Membership.requestId).
    caf::reacts_to<held_atom, std::uint64_t>,
    /// A server's hand-over of key ranges (wire::hand_over) with this request id failed: tell the
    /// scheduler why (its success goes back as held_atom's ack).
    caf::reacts_to<failed_atom, std::uint64_t, std::string>,
    /// Heartbeat, liveness check and the join deadline (sent by the agent to itself).
    caf::reacts_to<tick_atom>>;

/// Under TLS: the role the certificate of a node's control connection names, told by the
/// scheduler's port before any frame of that connection. The node is admitted in that role only.
struct certified_peer {
  std::uint64_t connection = 0;
  wire::role role = wire::role::worker;
};

/// What the handshake of a node's control connection established (its session key), told by the
/// scheduler's port before any frame of that connection: the admission seals the node's secret
/// under it.
struct authenticated_peer {
  std::uint64_t connection = 0;
  link_authentication authentication;
};

/// One node waiting at a job barrier (scheduler_core's barrier_entry), and where its release
/// goes: to `sink` as an envelope on `connection`.
struct barrier_arrival : barrier_entry {
  reply_sink sink;
};

/// The job barriers to the scheduler: a barrier that completed and takes in a worker that joins
/// at it (barrier_entry::joins). The scheduler sends the table that lists the joiner (servers
/// first) and then releases these arrivals itself.
struct barrier_held {
  std::vector<barrier_arrival> arrivals;
};

/// The scheduler of a job (actors/scheduler.hpp).
using scheduler_actor = caf::typed_actor<
    /// A frame from a node, off its control connection; replies go to the sink.
    caf::reacts_to<envelope, reply_sink>,
    /// That control connection closed.
    caf::reacts_to<closed_atom, std::uint64_t>,
    /// That control connection's TLS certificate names this role.
    caf::reacts_to<certified_peer>,
    /// That control connection's handshake is done (its session key).
    caf::reacts_to<authenticated_peer>,
    /// Heartbeats, liveness, start-up and drain deadlines (sent by the scheduler to itself).
    caf::reacts_to<tick_atom>,
    /// A barrier the job barriers hold until the workers have the table that counts its joiners.
    caf::reacts_to<barrier_held>>;

/// A member of the job will arrive at no barrier again (it was lost).
struct barrier_member_lost {
  std::uint32_t member = 0;
  wire::role member_role = wire::role::worker;
};

/// A worker joined the running job: it is expected at the barriers of group union g from id
/// first_barrier[g] on (1 beyond the list).
struct barrier_member_joined {
  std::uint32_t member = 0;
  std::vector<std::uint64_t> first_barrier;
  /// It joins at the workers' next barrier (job_barriers::join_at_next_barrier).
  bool at_next_barrier = false;
};

/// The job barriers of a scheduler: KVStore::barrier(), the init barrier, the job's start and
/// end (actors/job_barrier.hpp). It releases the members itself, through their sinks.
using barrier_actor = caf::typed_actor<
    /// A member arrived; every arrival of the barrier is released once each live member of its
    /// group has arrived. A second arrival of a member at one barrier is refused.
    caf::reacts_to<barrier_arrival>,
    /// A member is gone: no barrier waits for it any more, and those it held up are released.
    caf::reacts_to<barrier_member_lost>,
    /// A worker joined: the barriers from its first ones on wait for it too.
    caf::reacts_to<barrier_member_joined>>;

} // namespace troupe

// None of these leave the process as CAF messages (frames do, through the links), so they need no
// serializer.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::envelope)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::wire::membership)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::barrier_member_joined)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::shard_stats)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::kv_operation)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::reply_copy)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::send_receipt)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::device_work)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::server_links)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::server_relink)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::completion<troupe::status>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::completion<troupe::result<std::uint64_t>>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::control_call)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::barrier_arrival)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::barrier_member_lost)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::barrier_held)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::certified_peer)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::authenticated_peer)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::shard_hand_over)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::link_authentication)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::job_secret)

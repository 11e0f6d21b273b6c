#pragma once
// The rules of a job's scheduler (ps-lite's scheduler node), callable without CAF: who is
// admitted and with which rank, the membership table and its epochs, the job's quorum, which
// losses the job survives, the rank a lost server keeps open for its recovery (server_rejoin),
// when the servers are told to stop, and how the job ends. The conversation it holds with the
// nodes is the scheduler's protocol, described in actors/scheduler.hpp.
//
// The scheduler actor (actors/scheduler.cpp) wraps it: it hands the core every frame of a control
// connection, the connection's close, what the connection's handshake established (its session
// key, under TLS its certificate's role) and a tick every heartbeat_interval, each with the time
// it happened, and carries out the actions the core returns, in order: frames to control
// connections, arrivals at and losses for the job barriers (actors/job_barrier.hpp, whose rules
// stay with the barrier actor), and the job's end. The core reads no clock and sends nothing
// itself, so a test drives it message by message with a time of its own choosing.
//
// The phases:
//
//   registering --every server and worker admitted: membership sent--> running
//        |                                                                |
//        | startup_timeout, or an admitted node lost                      | every live worker
//        v                                                                v done: stop to servers
//      failed <--- a server lost, or more workers than the quorum allows - draining
//                                                                         |
//                                  every server gone, or drain_timeout    v
//                                                                       done
//
// A worker that registers while the job runs joins it when the job has room (max_workers): it gets
// a fresh rank, and the table that lists it goes to the servers first; the workers, the joiner
// included, get it once every server acked it (Membership.requestId), so every key has fixed the
// round it counts the joiner from before any worker hears of it. Its barriers start at the next
// id no member had reached (Admitted.firstBarrier). One that asks to join at a barrier
// (Registration.joinAtBarrier) is listed in no table until the job barriers take it in at the
// workers' next barrier (on_joiners_taken_in); that table goes out the same way, and the barrier
// is released only after it (release_held_barriers).
//
// done and failed are final: the core returns the outcome (job_ended) and takes nothing more. A
// worker that said done and a server that was told to stop have "finished": their departure is
// expected, not a loss. A worker that says done while others still run leaves the job: the next
// membership table marks it left (NodeInfo.left), from which the servers close its keys' rounds
// without it, and the job barriers stop waiting for it. A worker lost within the quorum (running
// only) leaves the phase as it is, and so does a server lost while the job runs with server_rejoin
// > 0, until its rank's wait is over.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "actors/config/tls_credentials.hpp"
#include "actors/logic/link_auth.hpp"
#include "engine/error.hpp"
#include "engine/log.hpp"
#include "schema/messages.hpp"

namespace troupe {

/// ps-lite's node ids: the scheduler is 1, server rank r is 8+2r, worker rank r is 9+2r.
inline constexpr std::uint32_t scheduler_node_id = 1;
constexpr std::uint32_t server_node_id(std::uint32_t rank) noexcept {
  return 8 + 2 * rank;
}
constexpr std::uint32_t worker_node_id(std::uint32_t rank) noexcept {
  return 9 + 2 * rank;
}

/// Most servers or workers one job may have (node ids must fit in 32 bits with room to spare).
inline constexpr std::uint32_t max_nodes_per_role = 1u << 20;

/// Longest host name a node may register with (DNS names have at most 253 bytes), which bounds a
/// node's row in the membership table.
inline constexpr std::size_t max_host_bytes = 255;

/// The membership table's key ranges: ps-lite's R ranges [max_key/R*r, max_key/R*(r+1))
/// (actors/logic/key_placement.hpp's server_key_ranges, so workers and the table agree), range r
/// held by server r mod num_servers, as shard_index 0: a server splits its ranges over its shards
/// itself. R is num_ranges (job.max_servers), num_servers when 0: then server i holds range i,
/// ps-lite's layout exactly. Like ps-lite, the top max_key % R keys belong to no range; ps-keys
/// are range.begin + key, far below them. Precondition: num_servers >= 1, num_ranges 0 or >=
/// num_servers.
std::vector<wire::key_range> membership_key_ranges(std::uint32_t num_servers,
                                                   std::uint32_t num_ranges = 0);

/// How the scheduler of one job runs. Durations are wall-clock.
struct scheduler_options {
  /// Address nodes reach the scheduler at (DMLC_PS_ROOT_URI), as the membership table says.
  /// Default: loopback only.
  std::string host = "127.0.0.1";
  /// Address the scheduler's port binds (node.bind: "0.0.0.0" for every interface); empty: host.
  std::string bind;
  /// Port to bind (DMLC_PS_ROOT_PORT); 0 lets the OS pick one (spawn_scheduler reports it).
  std::uint16_t port = 0;
  /// DMLC_NUM_WORKER, >= 1: the workers the job starts with.
  std::uint32_t num_workers = 1;
  /// job.max_workers: workers beyond num_workers join the running job, up to this many ranks in
  /// all (a rank is never given twice). 0 or below num_workers: num_workers (none joins).
  std::uint32_t max_workers = 0;
  /// DMLC_NUM_SERVER, >= 1.
  std::uint32_t num_servers = 1;
  /// job.max_servers: the key ranges keys are placed over (membership_key_ranges); 0 or below
  /// num_servers: num_servers.
  std::uint32_t max_servers = 0;
  /// How many workers the job needs alive (sync.quorum) until worker rank 0 announces its own:
  /// 1..num_workers, 0 meaning num_workers (a lost worker fails the job).
  std::uint32_t quorum = 0;
  /// Nodes of another job are rejected (wrong_job). Non-empty.
  std::string job_id;
  /// The job token: a node's control connection must prove it in its handshake before the
  /// scheduler reads anything from it (actors/logic/link_auth.hpp). Empty: no token.
  std::string auth_token;
  /// The job secret the nodes' keys derive from (actors/logic/node_identity.hpp). Empty:
  /// spawn_scheduler draws a fresh one, as every job should; a test may fix one to check keys.
  job_secret secret;
  /// TLS on the scheduler's port (actors/config/tls_credentials.hpp): its own credentials, a
  /// scheduler's. With them, only servers and workers with certificates from the job's CA get in,
  /// and each is admitted only in the role its certificate names (else rejected{wrong_role}).
  /// Null: plaintext.
  std::shared_ptr<const tls_credentials> tls;
  /// The job fails when not every node has registered this long after the spawn.
  std::chrono::milliseconds startup_timeout{60'000};
  /// A node that sends nothing (heartbeats included) for this long is declared lost.
  std::chrono::milliseconds peer_timeout{10'000};
  /// How often the scheduler checks for silent nodes and sends its own heartbeat to every node;
  /// must be below the nodes' peer timeout.
  std::chrono::milliseconds heartbeat_interval{1'000};
  /// How long a lost server's rank stays open for a server restarted from its checkpoint
  /// (Registration.recovering, troupe-node --recover) before the loss fails the job; meanwhile
  /// the job goes on without it (its workers hold their calls to it). 0: a lost server fails the
  /// job at once.
  std::chrono::milliseconds server_rejoin{0};
  /// After the stop command, how long the scheduler waits for the servers to leave before it
  /// ends anyway (the outcome is still that of the workers).
  std::chrono::milliseconds drain_timeout{5'000};
  /// Where the scheduler logs (ps-lite's PS_VERBOSE levels: errors always, 1 admissions and
  /// phases, 2 every frame); name it node_name("scheduler", nullopt, host). Default: silent.
  logger log;
  /// Told the rank of each worker the scheduler declares lost, when it does (troupe-launch then
  /// stops that process, whatever state it is in). Runs on the scheduler's thread: it must not
  /// block or throw.
  std::function<void(std::uint32_t rank)> on_worker_lost;
};

/// How a job ended.
enum class job_end : std::uint8_t {
  finished,             ///< every worker finished
  finished_with_losses, ///< the live workers finished; some were lost within the quorum
  failed,               ///< the job failed (see job_outcome::failure)
};

/// A worker lost within the quorum.
struct lost_worker {
  std::uint32_t rank = 0;
  std::uint32_t node_id = 0;
  /// When, after the scheduler started.
  std::chrono::milliseconds after{0};
  /// "its control connection closed", "nothing heard from it for 5 s (peer timeout 5 s)".
  std::string why;
  friend bool operator==(const lost_worker&, const lost_worker&) = default;
};

/// A worker that left the job on its own while it ran (it said done before the others).
struct departed_worker {
  std::uint32_t rank = 0;
  std::uint32_t node_id = 0;
  /// Its rounds: the most pushes it made of any one key (Command.rounds).
  std::uint64_t rounds = 0;
  /// When, after the scheduler started.
  std::chrono::milliseconds after{0};
  friend bool operator==(const departed_worker&, const departed_worker&) = default;
};

/// A worker admitted into the running job.
struct joined_worker {
  std::uint32_t rank = 0;
  std::uint32_t node_id = 0;
  /// When, after the scheduler started.
  std::chrono::milliseconds after{0};
  friend bool operator==(const joined_worker&, const joined_worker&) = default;
};

/// A server that joined the running job or left it (elastic servers).
struct server_change {
  std::uint32_t rank = 0;
  std::uint32_t node_id = 0;
  bool joined = true;
  /// When, after the scheduler started, and the membership epoch that first listed the change.
  std::chrono::milliseconds after{0};
  std::uint64_t epoch = 0;
  friend bool operator==(const server_change&, const server_change&) = default;
};

/// The end of a job as the scheduler saw it.
struct job_outcome {
  job_end end = job_end::failed;
  /// failed: why. errc::timeout when the job never completed its registration (the message
  /// names the missing roles); errc::peer_lost when a node was lost beyond what the quorum
  /// allows (the message names its role, rank and node id) or the scheduler was stopped.
  std::optional<error> failure;
  /// Workers that said done.
  std::uint32_t workers_finished = 0;
  /// Workers lost, in the order they were lost: those within the quorum and, when a worker's
  /// loss failed the job, that one too.
  std::vector<lost_worker> lost_workers;
  /// Workers that left while the others went on, in the order they left (the summary names those
  /// that did fewer rounds than the most any worker did).
  std::vector<departed_worker> left_workers;
  /// Workers that joined the running job, in the order they were admitted.
  std::vector<joined_worker> joined_workers;
  /// Servers that joined or left the running job, in order.
  std::vector<server_change> server_changes;
  /// The one line the scheduler logged at the end: workers finished and lost, who, when, why.
  std::string summary;

  /// The job's result as a status: ok() unless it failed.
  status as_status() const;
};

/// One node at a job barrier, as the scheduler checked it (a union of groups that includes the
/// member's): what the job barriers (actors/job_barrier.hpp) keep of an arrival.
struct barrier_entry {
  /// A non-zero union of wire::group bits that includes member_role's bit.
  std::uint8_t group = wire::group::workers;
  std::uint64_t barrier_id = 0;
  /// The scheduler's index of the node (never reused within a job), and its role.
  std::uint32_t member = 0;
  wire::role member_role = wire::role::worker;
  /// Echoed by the release.
  std::uint64_t request_id = 0;
  /// The member's rank in its role, and the values it shares (wire::barrier::values).
  std::uint32_t member_rank = 0;
  std::vector<double> values;
  /// The node's control connection, which the release (or a refusal) answers on.
  std::uint64_t connection = 0;
  /// A worker's barrier that ends its init or set_optimizer (Barrier.start): it counts no worker
  /// that joins at a barrier.
  bool start = false;
  /// Set by the job barriers: the arrival of a worker that joined at this barrier, which its
  /// release counts (the scheduler sends the table that lists it first).
  bool joins = false;
};

/// The scheduler's phase (the diagram of the file comment).
enum class scheduler_phase : std::uint8_t { registering, running, draining, done, failed };

/// The scheduler's rules. Not thread-safe: one caller (the scheduler actor) at a time. Times are
/// the caller's steady clock; each call's `now` must not be earlier than the last one's.
class scheduler_core {
public:
  using clock = std::chrono::steady_clock;

  /// Send `msg` on control connection `connection` (an admitted node's, or the one a frame came
  /// on). Dropped when that connection has closed meanwhile.
  struct control_frame {
    std::uint64_t connection = 0;
    wire::message msg;
  };
  /// Tell the job barriers that `member` will arrive nowhere again (a worker lost within the
  /// quorum).
  struct barrier_member_gone {
    std::uint32_t member = 0;
    wire::role member_role = wire::role::worker;
  };
  /// The job is over: deliver the outcome and stop (done or failed). Always the last action.
  struct job_ended {
    job_outcome outcome;
  };
  /// Hand this arrival, checked, to the job barriers.
  using barrier_entry = troupe::barrier_entry;
  /// Tell the job barriers that `member` (a worker that joined the running job) is expected at
  /// the barriers of each group union g from id first_barrier[g] on.
  struct barrier_member_joined {
    std::uint32_t member = 0;
    std::vector<std::uint64_t> first_barrier;
    /// It joins at the workers' next barrier (Registration.joinAtBarrier).
    bool at_next_barrier = false;
  };
  /// Release the barriers held for their joiners (barrier_held): every worker has the table that
  /// counts them now.
  struct release_held_barriers {};
  using action = std::variant<control_frame, barrier_entry, barrier_member_gone,
                              barrier_member_joined, release_held_barriers, job_ended>;
  /// What one call asks of the caller, to be carried out in order.
  using actions = std::vector<action>;

  /// The scheduler of a job run as `options` say (checked by spawn_scheduler: counts in
  /// 1..max_nodes_per_role, positive durations, a job id and a secret), started at `now`: the
  /// startup timeout runs from there.
  scheduler_core(scheduler_options options, clock::time_point now);

  /// The handshake of control connection `connection` agreed `session`: an admission on it seals
  /// the node's secret under that key. Told before any frame of the connection.
  void on_authenticated(std::uint64_t connection, session_key session);
  /// Under TLS: the certificate of `connection` names `role`, the only role it may register as.
  void on_certified(std::uint64_t connection, wire::role role);
  /// A frame from `connection` (validated by the link): registration, barrier, command,
  /// sync_settings, heartbeat, ack or error_reply; anything else is refused with an error_reply.
  actions on_frame(std::uint64_t connection, const wire::message& msg, clock::time_point now);
  /// `connection` closed: a node that had not finished is lost.
  actions on_closed(std::uint64_t connection, clock::time_point now);
  /// Every heartbeat_interval: the startup, drain and rejoin deadlines, silent nodes (lost after
  /// peer_timeout), and a heartbeat to every node still connected.
  actions on_tick(clock::time_point now);
  /// The job barriers completed a barrier of the workers that takes in `joiners` (node indices,
  /// workers admitted to join at a barrier; barrier_held): they are counted from now on. The
  /// table that lists them goes to the servers, and once every server acked, to the workers; then
  /// release_held_barriers.
  actions on_joiners_taken_in(const std::vector<std::uint32_t>& joiners, clock::time_point now);

  scheduler_phase phase() const noexcept { return phase_; }
  /// done or failed: the outcome has been returned; nothing more happens.
  bool ended() const noexcept {
    return phase_ == scheduler_phase::done || phase_ == scheduler_phase::failed;
  }
  /// Live workers the job needs.
  std::uint32_t quorum() const noexcept { return quorum_; }
  /// The epoch of the last membership table sent; 0 before the job started.
  std::uint64_t epoch() const noexcept { return epoch_; }
  /// Worker ranks the job may give: max_workers, at least num_workers.
  std::uint32_t worker_capacity() const noexcept {
    return std::max(options_.num_workers, options_.max_workers);
  }
  /// Server ranks the job may give (elastic servers): max_servers, at least num_servers.
  std::uint32_t server_capacity() const noexcept {
    return std::max(options_.num_servers, options_.max_servers);
  }
  /// The server that holds each key range now, in range order (Membership.keyRanges).
  const std::vector<std::uint32_t>& range_owners() const noexcept { return range_owner_; }

private:
  /// One admitted node.
  struct node_entry {
    wire::node_info info;
    /// Its control connection.
    std::uint64_t connection = 0;
    /// Last frame of any kind from the node.
    clock::time_point last_seen;
    /// Worker: said done. Server: was sent stop.
    bool finished = false;
    /// Server (elastic servers): asked to leave; its key ranges move to the others, then it is
    /// sent stop.
    bool leaving = false;
    /// Worker: the rounds its done reported.
    std::uint64_t rounds = 0;
    /// Its control connection closed.
    bool gone = false;
    /// Declared lost (within the quorum; beyond it the job has failed).
    bool lost = false;
    /// Why it was lost, for its later frames.
    std::string lost_text;
    /// A lost server whose rank waits for a recovering server (server_rejoin) until then.
    std::optional<clock::time_point> rejoin_deadline;
    /// A worker admitted to join at the workers' next barrier that no barrier has taken in yet:
    /// in no table, counted nowhere. And the request id of its arrival there, once it came.
    bool waits_at_barrier = false;
    std::optional<std::uint64_t> join_request;
  };

  // Incoming frames.
  void on_registration(std::uint64_t connection, const wire::registration& reg);
  void on_rejoin(std::uint64_t connection, const wire::registration& reg);
  /// A server's ack of the table held back from the workers (Membership.requestId).
  void on_table_ack(std::size_t index, std::uint64_t request_id);
  /// Sends the table held back from the workers to them (and then the barriers held for their
  /// joiners).
  void release_table();
  void on_barrier(std::size_t index, const wire::barrier& request);
  void on_command(std::size_t index, const wire::command& cmd);
  void on_sync_settings(std::size_t index, const wire::sync_settings& settings);
  /// Which rank a newly admitted node of `node_role` gets, out of `wanted`.
  std::uint32_t next_rank(wire::role node_role, std::int32_t rank_hint, std::uint32_t wanted) const;

  // Elastic servers.
  /// Moves as few key ranges as give each of the n servers in the job its share, R / n ranges or
  /// one more (a leaver's ranges, and a server's beyond its share, go to the servers below
  /// theirs, in rank order), unless a move is under way (it runs again when that one is done):
  /// each server that gives ranges gets a HandOver per receiving server.
  void rebalance();
  /// A server acked (or refused) hand-over `request_id`.
  void on_hand_over_answer(std::size_t index, std::uint64_t request_id,
                           const wire::error_reply* refusal);
  /// A server asked to leave (its Command stop): refused when it is the job's last server.
  void on_server_leave(std::size_t index, const wire::command& cmd);
  /// Servers that asked to leave and hold no key range any more are sent stop and listed left;
  /// true when one was.
  bool release_leavers();

  // Lifecycle.
  void start_job();
  void send_membership();
  void maybe_drain();
  void maybe_finish();
  void on_startup_timeout();
  void on_drain_timeout();
  void lose(std::size_t index, const std::string& why);
  void leave(std::size_t index);
  void finish(std::optional<error> failure);
  std::string summary(const job_outcome& outcome) const;

  // Admission and output.
  std::optional<wire::admitted> admitted_as(const wire::node_info& node,
                                            const session_key& session) const;
  void reply(std::uint64_t connection, wire::message msg);
  void send(const node_entry& node, wire::message msg);
  void broadcast(const wire::message& msg);
  /// Hands over what the calls since the last take asked for.
  actions take();

  // Lookups.
  std::optional<std::size_t> find(std::uint64_t connection) const;
  std::string who(std::optional<std::size_t> index) const;
  /// Workers the job has admitted (left and lost ones included: only joins change it, so a
  /// worker's num_workers() never drops under a calculation that used it); num_workers until it
  /// runs.
  std::uint32_t workers_in() const;
  std::uint32_t lost_count() const { return static_cast<std::uint32_t>(lost_workers_.size()); }
  std::chrono::milliseconds since_start() const;

  scheduler_options options_;
  logger log_;
  scheduler_phase phase_ = scheduler_phase::registering;
  /// The time of the call being handled.
  clock::time_point now_;
  actions pending_;
  /// Admitted nodes in arrival order; never shrinks (a gone node keeps its rank and index).
  std::vector<node_entry> nodes_;
  std::unordered_map<std::uint64_t, std::size_t> by_connection_;
  /// Under TLS: the role each open control connection's certificate names.
  std::unordered_map<std::uint64_t, wire::role> certified_;
  /// The session key of each open control connection (its handshake's key exchange).
  std::unordered_map<std::uint64_t, session_key> sessions_;
  /// The job token, which node keys derive from with options_.secret.
  link_secret token_;
  std::uint32_t servers_admitted_ = 0;
  std::uint32_t workers_admitted_ = 0;
  /// Live workers the job needs (worker rank 0's sync settings; num_workers until then).
  std::uint32_t quorum_ = 1;
  std::vector<lost_worker> lost_workers_;
  std::vector<departed_worker> left_workers_;
  std::vector<joined_worker> joined_workers_;
  std::vector<server_change> server_changes_;
  /// Workers listed in the last table the workers were sent: a table that lists more (a worker
  /// joined) goes to the servers first and reaches the workers once every server acked it.
  std::size_t workers_announced_ = 0;
  /// The table held back from the workers, its request id, and the servers (indices) yet to ack.
  std::optional<wire::membership> held_table_;
  std::uint64_t held_request_id_ = 0;
  std::vector<std::size_t> awaiting_table_ack_;
  /// The highest barrier id any node has arrived at, per group union (for a joiner's first).
  std::array<std::uint64_t, 8> barrier_reached_{};
  std::uint64_t epoch_ = 0;
  std::uint64_t next_request_id_ = 0;
  /// range_owner_[r]: the server rank that holds key range r.
  std::vector<std::uint32_t> range_owner_;
  /// Hand-overs under way, by request id: who gives which ranges to whom.
  struct range_hand_over {
    std::uint32_t from = 0;
    std::uint32_t to = 0;
    std::vector<std::uint32_t> ranges;
  };
  std::map<std::uint64_t, range_hand_over> moving_;
  std::uint64_t heartbeat_sequence_ = 0;
  clock::time_point started_;
  clock::time_point drain_deadline_;
};

} // namespace troupe

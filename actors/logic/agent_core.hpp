#pragma once
// The rules of a node's agent in its job's control plane (actors/node_agent.hpp), callable
// without CAF: the registration and its admission (the node's secret unsealed under the control
// link's session key), the membership table and its epochs, the ids of the node's requests and
// barriers, which errors of the scheduler end the node, how a closed control link is classified
// (a refused handshake, a lost scheduler, or a scheduler that leaves after the node finished),
// the join deadline, the scheduler's silence, and join()'s backoff for a scheduler that refuses
// connections (connect_backoff).
//
// The agent actor (actors/node_agent.cpp) wraps it: it hands the core the control link's opening
// and closing, the session key its handshake agreed, every frame from the scheduler, each
// blocking call of node_agent and a tick every heartbeat_interval, each with the time it
// happened, and carries out the actions the core returns, in order: frames to the scheduler,
// join()'s result, answers to the waiting calls and the job's end (whose completions stay with
// the actor), and the news for the subscribers (whose list stays with the actor too). The core
// reads no clock and sends nothing itself, so a test drives it frame by frame with a time of its
// own choosing.
//
// The phases:
//
//   connecting (join() dials; the agent waits for the link) -> registering -> admitted -> joined
//   (the first membership table: join() returns) -> finished (done acknowledged or stop
//   received), or failed.
//
// failed is final and reached from any phase: the first failure wins, and every waiting call and
// every later one gets it. After finished, the scheduler leaving is no loss: the calls still
// waiting are told it left.

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "actors/config/tls_credentials.hpp"
#include "actors/logic/link_auth.hpp"
#include "engine/error.hpp"
#include "engine/log.hpp"
#include "schema/messages.hpp"

namespace troupe {

/// How a node joins its job. Durations are wall-clock.
struct agent_options {
  /// The scheduler's address and port (DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT).
  std::string scheduler_host = "127.0.0.1";
  std::uint16_t scheduler_port = 0;
  /// server or worker (DMLC_ROLE); a scheduler does not join.
  wire::role role = wire::role::worker;
  /// Must match the scheduler's job id and token (the token is proven in the control
  /// connection's handshake and never sent).
  std::string job_id;
  std::string auth_token;
  /// TLS on the control link (actors/config/tls_credentials.hpp): this node's credentials, whose
  /// certificate must name `role`; the scheduler's must name the scheduler. Null: plaintext.
  std::shared_ptr<const tls_credentials> tls;
  /// Where this node's data port listens (servers: where workers connect), as peers should dial
  /// it; listed in the membership table. data_port 0: the node accepts no data connections.
  std::string host = "127.0.0.1";
  std::uint16_t data_port = 0;
  /// The rank to ask the scheduler for, or -1 to take the next one.
  std::int32_t rank_hint = -1;
  /// A server restarted from its checkpoint: it registers as the recovering server of exactly
  /// rank_hint (Registration.recovering), which the scheduler admits only in that rank.
  bool recovering = false;
  /// A worker that joins the running job is counted from the workers' next barrier on
  /// (Registration.joinAtBarrier): admitted as a joiner, it arrives at that barrier at once, and
  /// join() returns once the barrier is released (with the others' gathered values,
  /// joined::gathered) and a table lists it.
  bool join_at_barrier = false;
  /// A server: told the job secret its admission carries, on the agent's thread, as soon as it is
  /// admitted (before join() returns): its data port checks its workers' node proofs against it.
  /// Optional.
  std::function<void(const job_secret&)> on_job_secret{};
  /// Told every membership table the node takes (the first at join, then each newer one), on the
  /// agent's thread: it must not block or throw. Optional.
  std::function<void(const wire::membership&)> on_table{};
  /// A server (elastic servers): the scheduler asks it to hand key ranges to another server
  /// (troupe.capnp HandOver), on the agent's thread; it must not block or throw, and calls
  /// `answer` (from any thread, once) with the outcome, which goes back to the scheduler as Ack or
  /// Error. Without it such a request is answered with Error unsupported.
  std::function<void(const wire::hand_over&, std::function<void(status)> answer)> on_hand_over{};
  /// How long join() keeps retrying a scheduler that refuses connections (timeouts.connect).
  std::chrono::milliseconds connect_timeout{10'000};
  /// Bound on all of join(): connecting, registering and receiving the membership table.
  std::chrono::milliseconds startup_timeout{60'000};
  /// How often the agent sends the scheduler a heartbeat frame and checks that the scheduler
  /// still speaks; well below both sides' peer_timeout. This catches a frozen (SIGSTOPped)
  /// scheduler whose socket stays open.
  std::chrono::milliseconds heartbeat_interval{1'000};
  /// The scheduler is declared lost when nothing (its heartbeats included) has come from it for
  /// this long (timeouts.peer); must exceed the scheduler's heartbeat_interval. Distinct from a
  /// request's timeout, which bounds one call.
  std::chrono::milliseconds peer_timeout{10'000};
  /// Where the agent logs (ps-lite's PS_VERBOSE levels: errors always, 1 admission and job
  /// events, 2 every frame), renamed node_name(role, rank, host) once admitted. Default: silent.
  logger log;
};

/// join()'s pauses between attempts to reach a scheduler that refuses connections (processes of
/// a job start in any order): first_pause, doubling to longest_pause, never past the deadline.
/// Not thread-safe; times are the caller's steady clock.
class connect_backoff {
public:
  using clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds first_pause{50};
  static constexpr std::chrono::milliseconds longest_pause{1'000};

  /// Attempts that start at `started` and give up at `deadline`.
  connect_backoff(clock::time_point started, clock::time_point deadline) noexcept
      : started_(started), deadline_(deadline) {}

  /// An attempt failed at `now` for `reason`: how long to pause before the next one, or nullopt
  /// when the deadline has passed (give_up() then says why).
  std::optional<clock::duration> failed(clock::time_point now, std::string reason);
  /// errc::timeout "could not reach the scheduler at <where>: tried for <time> (<n> attempts,
  /// connect timeout <connect_timeout>); last: <reason>".
  error give_up(const std::string& where, std::chrono::milliseconds connect_timeout) const;
  /// Attempts that failed so far.
  int attempts() const noexcept { return attempts_; }

private:
  clock::time_point started_;
  clock::time_point deadline_;
  /// The time of the last failure, and why.
  clock::time_point last_{};
  std::string last_reason_;
  std::chrono::milliseconds next_pause_ = first_pause;
  int attempts_ = 0;
};

/// A node agent's rules. Not thread-safe: one caller (the agent actor) at a time. Times are the
/// caller's steady clock; each call's `now` must not be earlier than the last one's.
class agent_core {
public:
  using clock = std::chrono::steady_clock;

  /// The registration's request id; the node's calls number theirs from the next one up.
  static constexpr std::uint64_t registration_request_id = 1;

  /// Send `msg` to the scheduler on the control link.
  struct to_scheduler {
    wire::message msg;
  };
  /// A server's admission carried the job secret: hand it to agent_options::on_job_secret. Comes
  /// before `joined`.
  struct job_secret_opened {
    job_secret secret;
  };
  /// join() may return: the node is admitted and has its first membership table. Once.
  struct joined {
    wire::admitted admitted;
    wire::membership membership;
    /// A worker's node key (empty at a server).
    node_key key;
    /// A worker that joined at a barrier (join_at_barrier): what the others shared there.
    std::optional<std::vector<wire::gathered_values>> gathered;
  };
  /// Answer the waiting call `request_id` (an id on_call gave it). A barrier's release brings
  /// the gathered values, for the caller that asked for them.
  struct answer {
    std::uint64_t request_id = 0;
    status outcome;
    std::optional<std::vector<wire::gathered_values>> gathered;
  };
  /// The node's part in the job is over with `failure`: join() (if it still waits),
  /// wait_for_stop() and every later call get it. The answers to the calls still waiting follow.
  struct job_failed {
    error failure;
  };
  /// The stop command arrived: wait_for_stop() returns ok().
  struct job_stopped {};

  /// What the subscribers are told (the subscriber messages of actors/node_agent.hpp).
  struct stop_news {};
  struct lost_news {
    /// Names the lost node's role and rank (or the scheduler).
    std::string message;
  };
  using news = std::variant<stop_news, lost_news, wire::membership>;
  /// Tell every subscriber `what`.
  struct tell_subscribers {
    news what;
  };

  /// A server is asked to hand key ranges over: agent_options::on_hand_over, whose answer goes to
  /// the scheduler with the request's id.
  struct hand_over_asked {
    wire::hand_over order;
  };

  using action = std::variant<to_scheduler, job_secret_opened, joined, answer, job_failed,
                              job_stopped, tell_subscribers, hand_over_asked>;
  /// What one call asks of the caller, to be carried out in order.
  using actions = std::vector<action>;

  /// A call sent to the scheduler as request `request_id`: send `frame`; its answer comes later.
  struct placed_call {
    std::uint64_t request_id = 0;
    wire::message frame;
  };

  /// The agent of a node joining as `options` say (checked by node_agent::join), started at
  /// `started`: join() must be done by started + startup_timeout.
  agent_core(agent_options options, clock::time_point started);

  /// Whether a control link that opens now is taken: only the first, and not after a failure.
  bool wants_link() const noexcept { return !connected_ && !failure_; }
  /// The control link is open (precondition: wants_link()): the registration to send.
  actions on_connected(clock::time_point now);
  /// The control link's handshake agreed `session`: the admission's secret is sealed under it.
  /// Told before any frame.
  void on_authenticated(session_key session);
  /// A frame from the scheduler (validated by the link; one that failed validation arrives as a
  /// local error_reply{0, bad_frame}). Frames that answer nothing or that the agent does not take
  /// are logged as errors, naming what is wrong, and otherwise ignored.
  actions on_frame(const wire::message& msg, clock::time_point now);
  /// The control link closed for `reason`; `refusal` is the scheduler's words when it refused
  /// the link's handshake (handshake_refusal of actors/data_link.hpp), nullopt otherwise.
  actions on_closed(const std::string& reason, const std::optional<std::string>& refusal);
  /// A blocking call's request (a barrier, the done command, sync settings), named `what` in its
  /// errors ("barrier of group 4"): the frame to send, with its request id (and a barrier's
  /// barrier id and sender) filled in; or, when it cannot be sent (the job failed, the scheduler
  /// left), the error to answer it with at once.
  result<placed_call> on_call(wire::message request, std::string what);
  /// The caller of request `request_id` stopped waiting: forget it, so that the table of waiting
  /// calls stays as small as the number of callers.
  void abandon(std::uint64_t request_id);
  /// This node failed (a server's shard died): tell the scheduler why, unasked.
  actions on_local_failure(std::string why);
  /// Every heartbeat_interval while ticking(): the join deadline, a heartbeat to the scheduler
  /// once admitted, and the scheduler's silence (lost after peer_timeout, unless finished).
  actions on_tick(clock::time_point now);
  /// Whether ticks are still wanted: the link is open and the node has not failed.
  bool ticking() const noexcept { return connected_ && !failure_; }

  /// What a subscriber that comes now is told at once: the stop, the loss that failed the job.
  std::vector<news> news_for_new_subscriber() const;

  /// The error that ended this node's part in the job, if any.
  const std::optional<error>& failure() const noexcept { return failure_; }
  /// The stop command arrived.
  bool stopped() const noexcept { return stopped_; }
  /// Done acknowledged or stop received: the scheduler may leave without that being a loss.
  bool finished() const noexcept { return finished_; }
  /// The admission, once admitted.
  const std::optional<wire::admitted>& admitted() const noexcept { return admitted_; }
  /// The last membership table taken (the highest epoch so far).
  const std::optional<wire::membership>& membership() const noexcept { return membership_; }
  /// Calls waiting for the scheduler's answer.
  std::size_t waiting_calls() const noexcept { return waiting_.size(); }

private:
  void on_admission(const wire::admission& admission);
  void on_membership(const wire::membership& table);
  void on_release(const wire::barrier_release& release);
  void on_command(const wire::command& cmd);
  void on_error(const wire::error_reply& err);
  void maybe_joined();
  /// Answers request `request_id` with `outcome`; false when no such request is waiting.
  bool complete(std::uint64_t request_id, status outcome,
                std::optional<std::vector<wire::gathered_values>> gathered = std::nullopt);
  void fail(error err);
  /// The answer to a call that the scheduler, gone after the node finished, cannot give.
  error left(const std::string& what) const;
  void send(wire::message msg);
  actions take();

  agent_options options_;
  logger log_;
  /// "host:port" of the scheduler.
  std::string where_;
  clock::time_point deadline_;
  actions pending_;
  bool connected_ = false;
  /// The control link's handshake is done, and the session key it agreed.
  bool authenticated_ = false;
  session_key session_;
  /// A worker's node key, from its admission.
  node_key key_;
  std::optional<wire::admitted> admitted_;
  std::optional<wire::membership> membership_;
  bool joined_ = false;
  std::optional<error> failure_;
  bool stopped_ = false;
  bool finished_ = false;
  /// The calls waiting for an answer: request id -> what the call is, for its errors.
  std::map<std::uint64_t, std::string> waiting_;
  std::optional<std::uint64_t> done_request_;
  std::uint64_t next_request_id_ = registration_request_id + 1;
  /// Barriers this node entered, per group: the next barrier's id is one more.
  std::array<std::uint64_t, 8> barriers_entered_{};
  /// A worker joining at a barrier: the request id of its arrival there, until it is released,
  /// and what the release gathered.
  std::optional<std::uint64_t> join_barrier_request_;
  std::optional<std::vector<wire::gathered_values>> join_gathered_;
  std::uint64_t heartbeat_sequence_ = 0;
  clock::time_point last_heard_;
};

} // namespace troupe

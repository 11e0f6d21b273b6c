#include "actors/logic/agent_core.hpp"

#include <algorithm>
#include <utility>

#include "actors/config/config.hpp"
#include "actors/logic/node_identity.hpp"
#include "actors/logic/wire_conversions.hpp"

namespace troupe {

namespace {

using std::chrono::milliseconds;

std::string_view to_string(wire::reject_reason reason) {
  switch (reason) {
  case wire::reject_reason::protocol_version:
    return "protocol_version";
  case wire::reject_reason::wrong_job:
    return "wrong_job";
  case wire::reject_reason::bad_token:
    return "bad_token";
  case wire::reject_reason::role_full:
    return "role_full";
  case wire::reject_reason::duplicate:
    return "duplicate";
  case wire::reject_reason::shutting_down:
    return "shutting_down";
  case wire::reject_reason::wrong_role:
    return "wrong_role";
  }
  return "unknown";
}

} // namespace

// --- connect_backoff -----------------------------------------------------------------------------

std::optional<connect_backoff::clock::duration> connect_backoff::failed(clock::time_point now,
                                                                        std::string reason) {
  ++attempts_;
  last_ = now;
  last_reason_ = std::move(reason);
  if (now >= deadline_)
    return std::nullopt;
  const auto pause = std::min<clock::duration>(next_pause_, deadline_ - now);
  next_pause_ = std::min(next_pause_ * 2, longest_pause);
  return pause;
}

error connect_backoff::give_up(const std::string& where,
                               std::chrono::milliseconds connect_timeout) const {
  const auto tried = std::chrono::duration_cast<milliseconds>(last_ - started_);
  return error{errc::timeout, "could not reach the scheduler at " + where + ": tried for " +
                                  format_duration(tried) + " (" + std::to_string(attempts_) +
                                  " attempts, connect timeout " + format_duration(connect_timeout) +
                                  "); last: " + last_reason_};
}

// --- agent_core ----------------------------------------------------------------------------------

agent_core::agent_core(agent_options options, clock::time_point started)
    : options_(std::move(options)), log_(options_.log),
      where_(options_.scheduler_host + ":" + std::to_string(options_.scheduler_port)),
      deadline_(started + options_.startup_timeout) {}

agent_core::actions agent_core::on_connected(clock::time_point now) {
  connected_ = true;
  last_heard_ = now;
  wire::registration reg;
  reg.request_id = registration_request_id;
  reg.node_role = options_.role;
  reg.job_id = options_.job_id;
  reg.host = options_.host;
  reg.port = options_.data_port;
  reg.rank_hint = options_.rank_hint;
  reg.recovering = options_.recovering;
  reg.join_at_barrier = options_.join_at_barrier;
  send(reg);
  return take();
}

void agent_core::on_authenticated(session_key session) {
  authenticated_ = true;
  session_ = session;
}

agent_core::actions agent_core::on_frame(const wire::message& msg, clock::time_point now) {
  last_heard_ = now;
  log_.debug([&] { return std::string{wire::kind_name(msg)} + " from the scheduler"; });
  if (const auto* admission = std::get_if<wire::admission>(&msg))
    on_admission(*admission);
  else if (const auto* table = std::get_if<wire::membership>(&msg))
    on_membership(*table);
  else if (const auto* release = std::get_if<wire::barrier_release>(&msg))
    on_release(*release);
  else if (const auto* acked = std::get_if<wire::ack>(&msg))
    complete(acked->request_id, ok());
  else if (const auto* cmd = std::get_if<wire::command>(&msg))
    on_command(*cmd);
  else if (const auto* err = std::get_if<wire::error_reply>(&msg))
    on_error(*err);
  else if (const auto* order = std::get_if<wire::hand_over>(&msg);
           order && options_.role == wire::role::server && admitted_)
    pending_.emplace_back(hand_over_asked{*order});
  else if (!std::holds_alternative<wire::heartbeat>(msg))
    log_.error("ignored a " + std::string{wire::kind_name(msg)} + " from the scheduler");
  return take();
}

void agent_core::on_admission(const wire::admission& admission) {
  if (admission.request_id != registration_request_id || admitted_) {
    log_.error("ignored an admission that answers no registration");
    return;
  }
  if (const auto* rejected = std::get_if<wire::rejected>(&admission.outcome))
    return fail(error{errc::invalid_argument, "registration rejected (" +
                                                  std::string{to_string(rejected->reason)} +
                                                  "): " + rejected->detail});
  const auto& granted = std::get<wire::admitted>(admission.outcome);
  const wire::node_identity who{options_.role, granted.rank};
  const auto secret = session_.empty() || !granted.secret
                          ? std::nullopt
                          : unseal_secret(session_, *granted.secret, who, granted.node_id);
  if (!secret)
    return fail(error{errc::invalid_argument,
                      "the scheduler at " + where_ + " admitted this node as " +
                          wire::describe(who) +
                          ", but its secret does not open under this control link's session "
                          "key (is it a scheduler of this job?)"});
  admitted_ = granted;
  // A worker that joined the running job takes up the barriers where the job is.
  for (std::size_t group = 0;
       group < granted.first_barrier.size() && group < barriers_entered_.size(); ++group)
    barriers_entered_[group] =
        granted.first_barrier[group] > 0 ? granted.first_barrier[group] - 1 : 0;
  if (options_.role == wire::role::worker)
    key_ = node_key{*secret};
  else
    pending_.emplace_back(job_secret_opened{job_secret{*secret}});
  log_ =
      options_.log.named(node_name(wire::to_string(options_.role), admitted_->rank, options_.host));
  log_.info("admitted as node " + std::to_string(admitted_->node_id));
  if (granted.joined && options_.join_at_barrier && options_.role == wire::role::worker) {
    // Counted from the workers' next barrier on: it waits there, and the scheduler lists it in a
    // table only when that barrier completes, just before releasing it.
    wire::barrier arrival;
    arrival.request_id = next_request_id_++;
    arrival.group = wire::group::workers;
    arrival.barrier_id = ++barriers_entered_[wire::group::workers];
    arrival.sender_node_id = admitted_->node_id;
    join_barrier_request_ = arrival.request_id;
    log_.info("joins the running job at the workers' barrier " +
              std::to_string(arrival.barrier_id));
    send(std::move(arrival));
  }
  maybe_joined();
}

void agent_core::on_membership(const wire::membership& table) {
  // A repeated or older table (from a confused or hostile scheduler) must never undo a newer
  // one: a lost worker would come back to life.
  if (membership_ && membership_->epoch >= table.epoch)
    return;
  const bool first = !membership_;
  membership_ = table;
  std::size_t alive = 0;
  for (const auto& node : table.nodes)
    alive += node.alive ? 1 : 0;
  log_.info("membership epoch " + std::to_string(table.epoch) + ": " + std::to_string(alive) +
            " of " + std::to_string(table.nodes.size()) + " nodes alive");
  if (first)
    return maybe_joined();
  pending_.emplace_back(tell_subscribers{table});
}

void agent_core::maybe_joined() {
  if (!admitted_ || !membership_ || join_barrier_request_ || joined_ || failure_)
    return;
  joined_ = true;
  pending_.emplace_back(joined{*admitted_, *membership_, key_, join_gathered_});
}

/// A barrier's release: its gathered values go to the caller that asked for them.
void agent_core::on_release(const wire::barrier_release& release) {
  if (join_barrier_request_ && release.request_id == *join_barrier_request_) {
    // The barrier that took it in may be a later one than it aimed at: its ids go on from there.
    join_barrier_request_.reset();
    barriers_entered_[wire::group::workers] = release.barrier_id;
    join_gathered_ = release.gathered;
    return maybe_joined();
  }
  complete(release.request_id, ok(), release.gathered);
}

void agent_core::on_command(const wire::command& cmd) {
  if (cmd.kind != wire::command_kind::stop)
    return send(wire::error_reply{cmd.request_id, std::nullopt, wire::error_code::unsupported,
                                  "the node agent runs no checkpoint commands"});
  if (stopped_)
    return;
  stopped_ = true;
  finished_ = true;
  log_.info("stop received");
  pending_.emplace_back(job_stopped{});
  pending_.emplace_back(tell_subscribers{stop_news{}});
}

void agent_core::on_error(const wire::error_reply& err) {
  if (err.request_id != 0 && complete(err.request_id, from_wire(err)))
    return;
  if (join_barrier_request_ &&
      (err.request_id == *join_barrier_request_ ||
       (err.request_id == 0 && err.code == wire::error_code::shutting_down)))
    return fail(from_wire(err));
  // A refused registration, or unasked: the job failed (a lost peer, the startup timeout).
  // Anything else is the scheduler complaining about a frame of ours: worth a log, not the end
  // of the node.
  if ((err.request_id == registration_request_id && !admitted_) ||
      (err.request_id == 0 &&
       (err.code == wire::error_code::lost_peer || err.code == wire::error_code::timeout)))
    fail(from_wire(err));
  else
    log_.error("the scheduler reported: " + err.message);
}

agent_core::actions agent_core::on_closed(const std::string& reason,
                                          const std::optional<std::string>& refusal) {
  connected_ = false;
  if (!authenticated_) {
    // Not a lost scheduler: this node never got in. A refusal is the scheduler's answer to this
    // node's proofs (a wrong token), said as such.
    if (refusal)
      fail(
          error{errc::invalid_argument, "refused by the scheduler at " + where_ + ": " + *refusal});
    else
      fail(error{errc::peer_lost,
                 "the scheduler at " + where_ +
                     " closed the control link before its handshake was done: " + reason});
    return take();
  }
  if (finished_ || failure_) {
    log_.info("the scheduler left");
    // Nothing can answer a call still waiting (a barrier after done): say so now.
    for (const auto& [id, what] : waiting_)
      pending_.emplace_back(answer{id, left(what), std::nullopt});
    waiting_.clear();
    return take();
  }
  fail(error{errc::peer_lost, "scheduler (node 1) was lost: " + reason});
  return take();
}

result<agent_core::placed_call> agent_core::on_call(wire::message request, std::string what) {
  if (failure_)
    return *failure_;
  if (!connected_)
    return left(what);
  const std::uint64_t id = next_request_id_++;
  if (auto* field = wire::request_id_field(request))
    *field = id;
  if (auto* barrier = std::get_if<wire::barrier>(&request)) {
    // Every member calls barrier(group) in the same order (ps-lite's contract), so the ids of the
    // members agree.
    barrier->barrier_id = ++barriers_entered_[barrier->group & wire::group::all];
    barrier->sender_node_id = admitted_ ? admitted_->node_id : 0;
  }
  if (const auto* cmd = std::get_if<wire::command>(&request);
      cmd && cmd->kind == wire::command_kind::stop)
    done_request_ = id;
  waiting_.emplace(id, std::move(what));
  return placed_call{id, std::move(request)};
}

void agent_core::abandon(std::uint64_t request_id) {
  waiting_.erase(request_id);
}

agent_core::actions agent_core::on_local_failure(std::string why) {
  log_.error(why);
  send(wire::error_reply{0, std::nullopt, wire::error_code::internal, std::move(why)});
  return take();
}

agent_core::actions agent_core::on_tick(clock::time_point now) {
  if (!ticking())
    return {}; // nobody left to talk to
  if (!joined_ && now >= deadline_) {
    const auto waited = format_duration(options_.startup_timeout);
    fail(admitted_
             ? error{errc::timeout, "admitted as " + std::string{wire::to_string(options_.role)} +
                                        " " + std::to_string(admitted_->rank) +
                                        (join_barrier_request_
                                             ? " to join at the workers' next barrier, but the "
                                               "workers did not meet there within " +
                                                   waited + " (timeouts.startup)"
                                             : ", but no membership table from the scheduler at " +
                                                   where_ + " within " + waited)}
             : error{errc::timeout, "no answer to the registration from the scheduler at " +
                                        where_ + " within " + waited});
    return take();
  }
  if (admitted_) {
    send(wire::heartbeat{
        admitted_->node_id, ++heartbeat_sequence_,
        std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count()});
    const auto silent = std::chrono::duration_cast<milliseconds>(now - last_heard_);
    if (!finished_ && silent > options_.peer_timeout)
      fail(error{errc::peer_lost, "scheduler (node 1) was lost: nothing heard from it for " +
                                      format_duration(silent) + " (peer timeout " +
                                      format_duration(options_.peer_timeout) + ")"});
  }
  return take();
}

std::vector<agent_core::news> agent_core::news_for_new_subscriber() const {
  std::vector<news> told;
  if (stopped_)
    told.emplace_back(stop_news{});
  if (failure_ && failure_->code() == errc::peer_lost)
    told.emplace_back(lost_news{failure_->message()});
  return told;
}

bool agent_core::complete(std::uint64_t request_id, status outcome,
                          std::optional<std::vector<wire::gathered_values>> gathered) {
  auto found = waiting_.find(request_id);
  if (found == waiting_.end())
    return false;
  if (outcome && done_request_ == request_id)
    finished_ = true;
  pending_.emplace_back(answer{request_id, std::move(outcome), std::move(gathered)});
  waiting_.erase(found);
  return true;
}

void agent_core::fail(error err) {
  if (failure_)
    return;
  failure_ = err;
  log_.error(err.to_string());
  pending_.emplace_back(job_failed{err});
  for (const auto& [id, what] : waiting_)
    pending_.emplace_back(answer{id, err, std::nullopt});
  waiting_.clear();
  // Before join() returned, join()'s error says it all; a subscriber exists only after.
  if (joined_ && err.code() == errc::peer_lost)
    pending_.emplace_back(tell_subscribers{lost_news{err.message()}});
}

error agent_core::left(const std::string& what) const {
  return error{errc::peer_lost,
               what + ": the scheduler at " + where_ + " has left (the job ended)"};
}

void agent_core::send(wire::message msg) {
  if (connected_)
    pending_.emplace_back(to_scheduler{std::move(msg)});
}

agent_core::actions agent_core::take() {
  return std::exchange(pending_, {});
}

} // namespace troupe

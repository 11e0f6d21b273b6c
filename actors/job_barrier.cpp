#include "actors/job_barrier.hpp"

#include <algorithm>

#include <caf/actor_system.hpp>
#include <caf/typed_event_based_actor.hpp>

namespace troupe {

job_barriers::job_barriers(std::uint32_t num_servers, std::uint32_t num_workers)
    : live_servers_(num_servers), live_workers_(num_workers) {}

std::size_t job_barriers::expected(std::uint8_t group, std::uint64_t barrier_id) const noexcept {
  std::size_t joiners = 0;
  if ((group & wire::group::workers) != 0)
    for (const auto& joined : joined_)
      joiners += joined.counted && (group >= joined.first_barrier.size() ||
                                    joined.first_barrier[group] <= barrier_id);
  return ((group & wire::group::servers) != 0 ? live_servers_ : 0) +
         ((group & wire::group::workers) != 0 ? live_workers_ : 0) + joiners;
}

void job_barriers::join(std::uint32_t member, std::vector<std::uint64_t> first_barrier) {
  add_joiner(member, std::move(first_barrier), true);
}

void job_barriers::join_at_next_barrier(std::uint32_t member,
                                        std::vector<std::uint64_t> first_barrier) {
  add_joiner(member, std::move(first_barrier), false);
}

void job_barriers::add_joiner(std::uint32_t member, std::vector<std::uint64_t> first_barrier,
                              bool counted) {
  if (is_lost(member))
    return;
  for (const auto& joined : joined_)
    if (joined.member == member)
      return;
  joined_.push_back({member, std::move(first_barrier), counted, std::nullopt});
}

void job_barriers::take_in_joiners(const barrier_key& key, released& done) {
  // Only a barrier of the workers alone, and not the end of a worker's init or set_optimizer: a
  // joiner skips those (its store mirrors the job's start without them), so a barrier after
  // them is where its barrier ids and the others' agree.
  if (key.first != wire::group::workers)
    return;
  for (const auto& arrival : done)
    if (arrival.start)
      return;
  for (auto& joined : joined_) {
    if (joined.counted || !joined.waiting)
      continue;
    joined.counted = true;
    if (joined.first_barrier.size() <= wire::group::workers)
      joined.first_barrier.resize(wire::group::workers + 1, 1);
    joined.first_barrier[wire::group::workers] = key.second + 1;
    barrier_arrival arrival = std::move(*joined.waiting);
    joined.waiting.reset();
    arrival.barrier_id = key.second;
    arrival.joins = true;
    done.push_back(std::move(arrival));
  }
}

bool job_barriers::is_lost(std::uint32_t member) const {
  return std::find(lost_.begin(), lost_.end(), member) != lost_.end();
}

std::size_t job_barriers::pending_of(std::uint32_t member) const {
  std::size_t count = 0;
  for (const auto& [key, arrivals] : waiting_)
    for (const auto& arrival : arrivals)
      count += arrival.member == member ? 1 : 0;
  return count;
}

std::variant<job_barriers::released, job_barriers::refusal>
job_barriers::arrive(barrier_arrival arrival) {
  const std::string name = "barrier " + std::to_string(arrival.barrier_id) + " of group " +
                           std::to_string(arrival.group);
  if (is_lost(arrival.member))
    return refusal{"a lost member cannot arrive at " + name};
  for (auto& joined : joined_) {
    if (joined.member != arrival.member || joined.counted)
      continue;
    if (arrival.group != wire::group::workers)
      return refusal{"a worker that joins at a barrier arrives first at the workers' barrier, "
                     "not at " +
                     name};
    if (joined.waiting)
      return refusal{"a worker that joins at a barrier arrives once before it is taken in; " +
                     name + " is one too many"};
    joined.waiting = std::move(arrival);
    return released{};
  }
  const barrier_key key{arrival.group, arrival.barrier_id};
  auto found = waiting_.find(key);
  if (found != waiting_.end())
    for (const auto& earlier : found->second)
      if (earlier.member == arrival.member)
        return refusal{"already arrived at " + name};
  if (pending_of(arrival.member) >= max_pending_barriers_per_member)
    return refusal{"already waiting at " + std::to_string(max_pending_barriers_per_member) +
                   " barriers; " + name + " is one too many"};
  auto& arrivals = found != waiting_.end() ? found->second : waiting_[key];
  arrivals.push_back(std::move(arrival));
  if (arrivals.size() < expected(key.first, key.second))
    return released{};
  released done = std::move(arrivals);
  waiting_.erase(key);
  take_in_joiners(key, done);
  return done;
}

std::vector<job_barriers::released> job_barriers::lose(std::uint32_t member,
                                                       wire::role member_role) {
  std::vector<released> done;
  if (is_lost(member))
    return done;
  lost_.push_back(member);
  auto& live = member_role == wire::role::server ? live_servers_ : live_workers_;
  if (std::erase_if(joined_, [member](const joiner& j) { return j.member == member; }) == 0 &&
      member_role != wire::role::scheduler && live > 0)
    --live;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    auto& arrivals = it->second;
    std::erase_if(arrivals, [member](const auto& arrival) { return arrival.member == member; });
    if (arrivals.empty()) {
      it = waiting_.erase(it);
    } else if (arrivals.size() >= expected(it->first.first, it->first.second)) {
      done.push_back(std::move(arrivals));
      take_in_joiners(it->first, done.back());
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  return done;
}

namespace {

struct barrier_state {
  static inline const char* name = "troupe.job_barrier";
  std::unique_ptr<job_barriers> book;
  logger log;
  scheduler_actor scheduler;
};

using barrier_pointer = barrier_actor::stateful_pointer<barrier_state>;

void release(barrier_pointer self, job_barriers::released arrivals) {
  if (arrivals.empty())
    return;
  const auto& first = arrivals.front();
  self->state.log.debug([&] {
    return "barrier " + std::to_string(first.barrier_id) + " of group " +
           std::to_string(first.group) + " released " + std::to_string(arrivals.size()) +
           " members";
  });
  if (std::any_of(arrivals.begin(), arrivals.end(), [](const auto& a) { return a.joins; })) {
    // The workers must have the table that counts the joiner before anyone leaves the barrier.
    self->send(self->state.scheduler, barrier_held{std::move(arrivals)});
    return;
  }
  for (auto& [sink, message] : release_messages(arrivals))
    self->send(sink, std::move(message));
}

barrier_actor::behavior_type barrier_behavior(barrier_pointer self, std::uint32_t num_servers,
                                              std::uint32_t num_workers, logger log,
                                              scheduler_actor scheduler) {
  self->state.book = std::make_unique<job_barriers>(num_servers, num_workers);
  self->state.log = std::move(log);
  self->state.scheduler = std::move(scheduler);
  return {
      [self](barrier_arrival& arrival) {
        const auto sink = arrival.sink;
        const auto connection = arrival.connection;
        const auto request_id = arrival.request_id;
        auto outcome = self->state.book->arrive(std::move(arrival));
        if (auto* refused = std::get_if<job_barriers::refusal>(&outcome)) {
          self->send(sink,
                     envelope{wire::error_reply{request_id, std::nullopt,
                                                wire::error_code::invalid_argument, refused->why},
                              nullptr, connection});
          return;
        }
        release(self, std::move(std::get<job_barriers::released>(outcome)));
      },
      [self](barrier_member_joined& joined) {
        if (joined.at_next_barrier)
          self->state.book->join_at_next_barrier(joined.member, std::move(joined.first_barrier));
        else
          self->state.book->join(joined.member, std::move(joined.first_barrier));
      },
      [self](const barrier_member_lost& lost) {
        for (auto& arrivals : self->state.book->lose(lost.member, lost.member_role))
          release(self, std::move(arrivals));
      },
  };
}

} // namespace

std::vector<std::pair<reply_sink, envelope>>
release_messages(const std::vector<barrier_arrival>& arrivals) {
  // Every member gets every member's values (KVStore::gather_at_barrier), by role, then rank.
  std::vector<wire::gathered_values> gathered;
  for (const auto& arrival : arrivals)
    if (!arrival.values.empty())
      gathered.push_back({arrival.member_role, arrival.member_rank, arrival.values});
  std::sort(gathered.begin(), gathered.end(), [](const auto& a, const auto& b) {
    return std::pair{a.member_role, a.rank} < std::pair{b.member_role, b.rank};
  });
  std::vector<std::pair<reply_sink, envelope>> messages;
  messages.reserve(arrivals.size());
  for (const auto& arrival : arrivals)
    messages.emplace_back(arrival.sink,
                          envelope{wire::barrier_release{arrival.request_id, arrival.barrier_id,
                                                         arrival.group, gathered},
                                   nullptr, arrival.connection});
  return messages;
}

barrier_actor spawn_job_barrier(caf::actor_system& system, std::uint32_t num_servers,
                                std::uint32_t num_workers, logger log, scheduler_actor scheduler) {
  return system.spawn(barrier_behavior, num_servers, num_workers, std::move(log),
                      std::move(scheduler));
}

} // namespace troupe

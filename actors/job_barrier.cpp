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
      joiners += group >= joined.first_barrier.size() || joined.first_barrier[group] <= barrier_id;
  return ((group & wire::group::servers) != 0 ? live_servers_ : 0) +
         ((group & wire::group::workers) != 0 ? live_workers_ : 0) + joiners;
}

void job_barriers::join(std::uint32_t member, std::vector<std::uint64_t> first_barrier) {
  if (is_lost(member))
    return;
  for (const auto& joined : joined_)
    if (joined.member == member)
      return;
  joined_.push_back({member, std::move(first_barrier)});
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
};

using barrier_pointer = barrier_actor::stateful_pointer<barrier_state>;

void release(barrier_pointer self, const job_barriers::released& arrivals) {
  if (arrivals.empty())
    return;
  const auto& first = arrivals.front();
  self->state.log.debug([&] {
    return "barrier " + std::to_string(first.barrier_id) + " of group " +
           std::to_string(first.group) + " released " + std::to_string(arrivals.size()) +
           " members";
  });
  // Every member gets every member's values (KVStore::gather_at_barrier), by role, then rank.
  std::vector<wire::gathered_values> gathered;
  for (const auto& arrival : arrivals)
    if (!arrival.values.empty())
      gathered.push_back({arrival.member_role, arrival.member_rank, arrival.values});
  std::sort(gathered.begin(), gathered.end(), [](const auto& a, const auto& b) {
    return std::pair{a.member_role, a.rank} < std::pair{b.member_role, b.rank};
  });
  for (const auto& arrival : arrivals)
    self->send(arrival.sink, envelope{wire::barrier_release{arrival.request_id, arrival.barrier_id,
                                                            arrival.group, gathered},
                                      nullptr, arrival.connection});
}

barrier_actor::behavior_type barrier_behavior(barrier_pointer self, std::uint32_t num_servers,
                                              std::uint32_t num_workers, logger log) {
  self->state.book = std::make_unique<job_barriers>(num_servers, num_workers);
  self->state.log = std::move(log);
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
        release(self, std::get<job_barriers::released>(outcome));
      },
      [self](barrier_member_joined& joined) {
        self->state.book->join(joined.member, std::move(joined.first_barrier));
      },
      [self](const barrier_member_lost& lost) {
        for (const auto& arrivals : self->state.book->lose(lost.member, lost.member_role))
          release(self, arrivals);
      },
  };
}

} // namespace

barrier_actor spawn_job_barrier(caf::actor_system& system, std::uint32_t num_servers,
                                std::uint32_t num_workers, logger log) {
  return system.spawn(barrier_behavior, num_servers, num_workers, std::move(log));
}

} // namespace troupe

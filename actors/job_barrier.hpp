#pragma once
// The job barriers of one scheduler: MXNet's KVStore::barrier() (a barrier of the worker group),
// the init barrier, and ps-lite's barriers of any union of groups (scheduler 1, servers 2,
// workers 4) at the job's start and end.
//
// A barrier is named by (group, barrier_id): every member of the group sends barrier_id 1, then
// 2, ... (ps-lite's contract: the members call barrier(group) in the same order). It completes
// when every member it expects has arrived, and then each arrival is released with its own
// request id. The members it expects are the live ones: the configured number of servers and
// workers of the group, less those lost (the scheduler itself is always there). So a barrier
// sent before the job started waits for the nodes still registering, and after a worker is lost
// within the quorum the survivors' barriers complete without it: the loss releases every
// barrier it was holding up. A lost member's earlier arrivals no longer count.
//
// The scheduler checks that an arrival comes from an admitted member of its group before it
// forwards it; the barrier refuses what only it can see: a second arrival of a member at one
// barrier, or a member with too many barriers pending (bounded state per member).
//
// A worker that joins at a barrier (Registration.joinAtBarrier) is expected nowhere; its one
// arrival waits until a barrier of the worker group past the workers' start completes, which takes
// it in. The actor hands such a barrier to the scheduler (barrier_held) instead of releasing it:
// the scheduler first sends the table that counts the joiner, then releases it.
//
// job_barriers is the bookkeeping, callable without CAF; spawn_job_barrier wraps it in the
// barrier_actor of actors/protocols.hpp, which sends each release (or refusal) to the member's
// control connection itself.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <caf/fwd.hpp>

#include "actors/protocols.hpp"
#include "engine/log.hpp"
#include "schema/messages.hpp"

namespace troupe {

/// Most barriers one member may have pending at once. Legitimate nodes wait at one barrier at a
/// time (barrier() blocks); the bound keeps a misbehaving node from growing the table.
inline constexpr std::size_t max_pending_barriers_per_member = 8;

class job_barriers {
public:
  /// Expects `num_servers` servers and `num_workers` workers until some are lost.
  job_barriers(std::uint32_t num_servers, std::uint32_t num_workers);

  /// An arrival that was refused, and why (it changed nothing).
  struct refusal {
    std::string why;
  };
  /// What an arrival completes: every arrival of its barrier (this one included), or nothing.
  using released = std::vector<barrier_arrival>;

  /// Records `arrival`. Precondition (checked by the scheduler): arrival.group is a non-zero
  /// union of wire::group bits including the member's role.
  std::variant<released, refusal> arrive(barrier_arrival arrival);

  /// `member` is lost: it is expected nowhere from now on and its arrivals are forgotten.
  /// Returns the barriers this completes, each as the list of its arrivals to release. Losing a
  /// member twice changes nothing.
  std::vector<released> lose(std::uint32_t member, wire::role member_role);
  /// A worker joined the running job: the barriers of group union g are expected to wait for it
  /// from id first_barrier[g] on (1 beyond the list), those before are not.
  void join(std::uint32_t member, std::vector<std::uint64_t> first_barrier);
  /// A worker joins at the workers' next barrier (Registration.joinAtBarrier): no barrier waits
  /// for it, and its one arrival waits for the first barrier of the worker group to complete
  /// that is not a start barrier (barrier_entry::start); that completion takes it in (its
  /// arrival, renumbered to that barrier and marked `joins`), and from the next barrier of the
  /// worker group on it is expected like every worker (other groups: from first_barrier[g]).
  void join_at_next_barrier(std::uint32_t member, std::vector<std::uint64_t> first_barrier);

  /// How many members barrier `barrier_id` of `group` waits for now (by default: a barrier
  /// later than every joiner's first).
  std::size_t
  expected(std::uint8_t group,
           std::uint64_t barrier_id = std::numeric_limits<std::uint64_t>::max()) const noexcept;
  /// Barriers with at least one arrival that have not completed.
  std::size_t pending() const noexcept { return waiting_.size(); }

private:
  using barrier_key = std::pair<std::uint8_t, std::uint64_t>; // group, barrier id

  bool is_lost(std::uint32_t member) const;
  /// join and join_at_next_barrier: a joiner counted at once or not until a barrier takes it in.
  /// A lost member, or one already joined, changes nothing.
  void add_joiner(std::uint32_t member, std::vector<std::uint64_t> first_barrier, bool counted);
  std::size_t pending_of(std::uint32_t member) const;
  /// `done` completes barrier `key`: takes in the joiners waiting for a barrier, if it counts
  /// them.
  void take_in_joiners(const std::pair<std::uint8_t, std::uint64_t>& key, released& done);

  std::uint32_t live_servers_;
  std::uint32_t live_workers_;
  /// Workers that joined the running job and are not lost, with their first barrier per group.
  struct joiner {
    std::uint32_t member = 0;
    std::vector<std::uint64_t> first_barrier;
    /// False while it waits to join at a barrier (join_at_next_barrier), with its arrival once
    /// it came.
    bool counted = true;
    std::optional<barrier_arrival> waiting;
  };
  std::vector<joiner> joined_;
  std::vector<std::uint32_t> lost_;
  std::map<barrier_key, std::vector<barrier_arrival>> waiting_;
};

/// What releasing `arrivals` sends: to each arrival's sink, on its connection, the release of
/// its request with every member's gathered values (by role, then rank; members that shared
/// none are left out).
std::vector<std::pair<reply_sink, envelope>>
release_messages(const std::vector<barrier_arrival>& arrivals);

/// Spawns the barrier actor of a scheduler. A barrier whose release takes in a worker that
/// joins at it goes to `scheduler` instead (barrier_held), which releases it. The actor quits
/// only when told to (an exit message); the scheduler stops it when the job ends.
barrier_actor spawn_job_barrier(caf::actor_system& system, std::uint32_t num_servers,
                                std::uint32_t num_workers, logger log, scheduler_actor scheduler);

} // namespace troupe

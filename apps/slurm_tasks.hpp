#pragma once
// Slurm for troupe-launch: what one task of `srun troupe-launch --launcher slurm -n W -s S --
// COMMAND` is in the job. srun starts 1 + S + W copies of troupe-launch, one per task; each reads
// the variables Slurm gives its task and becomes one node (apps/troupe_launch.cpp):
//
//   SLURM_PROCID 0            the scheduler, on the first node of the step
//   SLURM_PROCID 1 .. S       server 0 .. S-1
//   SLURM_PROCID S+1 .. S+W   worker 0 .. W-1
//
// The scheduler's address is the first name of the step's node list (SLURM_STEP_NODELIST, else
// SLURM_JOB_NODELIST or SLURM_NODELIST), which Slurm gives in its compressed form
// ("node[01-04,07],gpu3"); expand_nodelist reads it. Task 0 runs there under srun's default block
// distribution; place_slurm_task checks that with SLURMD_NODENAME where Slurm sets it.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/config/config.hpp"
#include "engine/error.hpp"

namespace troupe::launch {

/// Most host names a node list may expand to.
inline constexpr std::size_t max_nodelist_hosts = 65536;

/// The host names of a Slurm node list in its compressed form, in order: "node[01-04,07],gpu3"
/// is node01, node02, node03, node04, node07, gpu3. A range keeps the width of its first number
/// ("[08-10]": 08, 09, 10); a name may hold several bracket groups ("r[1-2]n[1-2]": r1n1, r1n2,
/// r2n1, r2n2, as Slurm's hostlist orders them). Names are made of letters, digits, '.', '-'
/// and '_'. Errors (errc::invalid_argument, one line naming the list and what is wrong): an
/// empty list or name, an unclosed, nested or empty bracket group, a range that runs backwards
/// or whose bounds are not numbers of at most 9 digits, any other character, more than
/// `max_hosts` names (checked before they are made).
result<std::vector<std::string>> expand_nodelist(std::string_view list,
                                                 std::size_t max_hosts = max_nodelist_hosts);

/// What one Slurm task is in the job.
struct slurm_task {
  node_role role = node_role::worker;
  /// The node's index among its role (its rank hint); 0 for the scheduler.
  int index = 0;
  /// The first node of the step: where the scheduler runs, and its address.
  std::string scheduler_host;
  /// This task's node (SLURMD_NODENAME); empty when Slurm did not set it.
  std::string node_name;
  /// A scheduler port every task computes alike from SLURM_JOB_ID (slurm_job_port), for a job
  /// whose configuration names none; nullopt without SLURM_JOB_ID.
  std::optional<std::uint16_t> job_port;
};

/// The scheduler port of Slurm job `job_id` when the configuration names none: 20000 plus the
/// job id modulo 10000, so that every task finds the same port without talking, and two jobs
/// sharing a first node seldom collide (below Linux's ephemeral ports, 32768 and up).
std::uint16_t slurm_job_port(std::uint64_t job_id) noexcept;

/// Task SLURM_PROCID of SLURM_NTASKS in a job of `num_workers` workers and `num_servers`
/// servers, from the variables `env` holds (see the file comment). Errors (errc::invalid_argument,
/// one line naming the variable): SLURM_PROCID or SLURM_NTASKS missing or not a number (not
/// under srun), SLURM_NTASKS other than 1 + S + W (naming the srun -n that fits), no node list or
/// a broken one, task 0 on a node other than the first of the list.
result<slurm_task> place_slurm_task(const env_lookup& env, int num_workers, int num_servers);

} // namespace troupe::launch

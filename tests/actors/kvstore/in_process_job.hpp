#pragma once
// A whole distributed job inside one test process: S server nodes (each with its shards) and W
// dist_kvstore workers linked to them in-process, plus a barrier among the workers' threads. The
// workers run the same code as across the network; only the links differ. Problems
// seen on the workers' threads are collected for the test's thread to assert.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/send.hpp>

#include "actors/kvstore/dist_kvstore.hpp"
#include "actors/server_node.hpp"

namespace troupe::testing {

/// Problems seen on worker threads, asserted on the test's thread (Boost.Test is not
/// thread-safe).
struct problems {
  std::mutex mutex;
  std::vector<std::string> seen;

  void add(std::string what) {
    std::lock_guard lock{mutex};
    seen.push_back(std::move(what));
  }
  /// Records a failed status with its context.
  bool check(const status& outcome, const std::string& context) {
    if (outcome)
      return true;
    add(context + ": " + outcome.error().to_string());
    return false;
  }
  /// The first ten problems, one a line.
  std::string report() {
    std::lock_guard lock{mutex};
    std::ostringstream out;
    for (std::size_t i = 0; i < seen.size() && i < 10; ++i)
      out << seen[i] << "\n";
    return out.str();
  }
};

/// A reusable barrier for `parties` threads whose wait gives up after a timeout.
class thread_barrier {
public:
  explicit thread_barrier(std::uint32_t parties) : parties_(parties) {}

  status wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock{mutex_};
    auto generation = generation_;
    if (++arrived_ == parties_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
      return ok();
    }
    if (!changed_.wait_for(lock, timeout, [&] { return generation_ != generation; }))
      return error{errc::timeout, "barrier: not every worker arrived"};
    return ok();
  }

private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::uint32_t parties_;
  std::uint32_t arrived_ = 0;
  std::uint64_t generation_ = 0;
};

/// How an in-process job runs, beyond its type and size.
struct in_process_options {
  std::uint32_t shards = 2;
  std::int64_t bigarray_bound = 1'000'000;
  std::size_t chunk_bytes = std::size_t{1} << 20;
  /// The workers' send window per server (data.send_window_bytes).
  std::size_t send_window_bytes = default_send_window_bytes;
  /// data.slice_bytes (0: keys are not cut) and data.slice_credit (0: no bound).
  std::size_t slice_bytes = 0;
  std::uint32_t slice_credit = default_slice_credit;
  /// The workers' request timeout.
  std::chrono::milliseconds timeout{20'000};
  /// sync.* of the cluster configuration (worker_setup's fields).
  std::uint32_t quorum = 0;
  bool rescale_quorum = false;
  std::int64_t max_staleness = -1;
  std::uint32_t max_rounds_ahead = 2;
  /// The servers' checkpoint directory (checkpoint_schedule::dir); empty: none.
  std::filesystem::path checkpoint_dir;
  /// Ranks whose stores act as workers that joined the running job (worker_setup::joined): they
  /// pull their keys at init and skip the start barriers, which wait for the other ranks only.
  std::vector<std::uint32_t> joined_ranks;
  /// Puts an actor between the servers and worker `rank`'s replies: it gets the job's actor
  /// system and the worker's handle, and returns the sink the servers answer to (the worker
  /// itself when empty).
  std::function<caf::actor(caf::actor_system& system, std::uint32_t rank, const caf::actor& worker)>
      reply_path;
  /// Puts an actor between worker `rank` and its link to server `server`: it gets the job's actor
  /// system and that link, and returns the link the worker sends to (the link itself when empty).
  std::function<link_actor(caf::actor_system& system, std::uint32_t rank, std::uint32_t server,
                           const link_actor& link)>
      request_path;
};

inline in_process_options make_options(std::uint32_t shards, std::int64_t bigarray_bound,
                                       std::size_t chunk_bytes) {
  in_process_options options;
  options.shards = shards;
  options.bigarray_bound = bigarray_bound;
  options.chunk_bytes = chunk_bytes;
  return options;
}

struct in_process_job {
  caf::actor_system_config config;
  caf::actor_system system{config};
  std::vector<std::unique_ptr<server_node>> servers;
  thread_barrier barrier;
  std::vector<std::unique_ptr<dist_kvstore>> workers;
  /// The actors options.reply_path and options.request_path put between servers and workers;
  /// stopped with the job.
  std::vector<caf::actor> reply_paths;

  in_process_job(std::string type, std::uint32_t num_workers, std::uint32_t num_servers,
                 std::uint32_t shards = 2, std::int64_t bigarray_bound = 1'000'000,
                 std::size_t chunk_bytes = std::size_t{1} << 20)
      : in_process_job(std::move(type), num_workers, num_servers,
                       make_options(shards, bigarray_bound, chunk_bytes)) {}

  in_process_job(std::string type, std::uint32_t num_workers, std::uint32_t num_servers,
                 const in_process_options& options)
      : barrier(num_workers - static_cast<std::uint32_t>(options.joined_ranks.size())) {
    auto mode = type.find("async") != std::string::npos ? consistency::async : consistency::sync;
    for (std::uint32_t s = 0; s < num_servers; ++s) {
      server_node_options server;
      server.num_workers = num_workers;
      server.shards = options.shards;
      server.num_servers = num_servers;
      server.server_rank = s;
      server.mode = mode;
      server.chunk_bytes = options.chunk_bytes;
      server.checkpoint.dir = options.checkpoint_dir;
      servers.push_back(std::make_unique<server_node>(system, std::move(server)));
    }
    for (std::uint32_t rank = 0; rank < num_workers; ++rank) {
      worker_setup setup;
      setup.system = &system;
      setup.type = type;
      setup.rank = rank;
      setup.num_workers = num_workers;
      setup.num_servers = num_servers;
      setup.bigarray_bound = options.bigarray_bound;
      setup.chunk_bytes = options.chunk_bytes;
      setup.send_window_bytes = options.send_window_bytes;
      setup.slice_bytes = options.slice_bytes;
      setup.slice_credit = options.slice_credit;
      setup.timeout = options.timeout;
      setup.quorum = options.quorum;
      setup.rescale_quorum = options.rescale_quorum;
      setup.max_staleness = options.max_staleness;
      setup.max_rounds_ahead = options.max_rounds_ahead;
      setup.joined = std::find(options.joined_ranks.begin(), options.joined_ranks.end(), rank) !=
                     options.joined_ranks.end();
      setup.connect_servers =
          [this, rank, path = options.reply_path,
           requests = options.request_path](const caf::actor& worker) -> result<server_links> {
        caf::actor replies = worker;
        if (path) {
          replies = path(system, rank, worker);
          reply_paths.push_back(replies);
        }
        server_links links;
        for (std::uint32_t s = 0; s < servers.size(); ++s) {
          auto link =
              spawn_local_link(system, servers[s]->router(), caf::actor_cast<reply_sink>(replies));
          if (requests) {
            link = requests(system, rank, s, link);
            reply_paths.push_back(caf::actor_cast<caf::actor>(link));
          }
          links.links.push_back(link);
        }
        return links;
      };
      setup.barrier = [this] { return barrier.wait(std::chrono::milliseconds{20000}); };
      workers.push_back(dist_kvstore::create(std::move(setup)).value());
    }
  }

  /// Every server's shard counters, summed.
  shard_stats stats() const {
    shard_stats total;
    for (const auto& server : servers)
      total += server->stats(std::chrono::seconds{10}).value();
    return total;
  }

  ~in_process_job() {
    for (auto& worker : workers)
      (void)worker->finalize();
    workers.clear();
    for (auto& path : reply_paths)
      caf::anon_send_exit(path, caf::exit_reason::user_shutdown);
    servers.clear();
  }

  /// Runs body(rank, store) on one thread per worker and joins them all.
  void run(const std::function<void(std::uint32_t, kvstore&)>& body) {
    std::vector<std::thread> threads;
    for (std::uint32_t rank = 0; rank < workers.size(); ++rank)
      threads.emplace_back([&, rank] { body(rank, *workers[rank]); });
    for (auto& thread : threads)
      thread.join();
  }
};

} // namespace troupe::testing

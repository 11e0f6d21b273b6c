#include "actors/dist_job.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>
#include <unistd.h>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/config/local_address.hpp"
#include "actors/data_link.hpp"
#include "actors/logic/job_trace.hpp"
#include "actors/logic/node_identity.hpp"
#include "actors/node_agent.hpp"
#include "actors/range_mover.hpp"
#include "actors/scheduler.hpp"
#include "actors/server_node.hpp"
#include "engine/serialize.hpp"

namespace troupe {
namespace {

/// The actor system of one node process.
struct node_runtime {
  caf::actor_system_config config;
  std::unique_ptr<caf::actor_system> system;

  node_runtime() {
    // The middleman runs troupe's framed links; no BASP port is opened. A lost node is
    // noticed by the control plane: closed connections and its heartbeats (node_agent).
    config.load<caf::io::middleman>();
    tune_for_data_path(config);
    system = std::make_unique<caf::actor_system>(config);
  }
};

/// The address this node gives its peers (and names itself by in logs).
std::string advertised_host(const cluster_config& config) {
  return config.node_host.empty() ? config.bind_address : config.node_host;
}

agent_options agent_options_for(const cluster_config& config, wire::role role,
                                std::uint16_t data_port,
                                std::shared_ptr<const tls_credentials> tls) {
  agent_options options;
  options.tls = std::move(tls);
  options.scheduler_host = config.scheduler_host;
  options.scheduler_port = config.scheduler_port.value_or(0);
  options.role = role;
  options.job_id = config.job_id;
  options.auth_token = config.auth_token;
  options.host = advertised_host(config);
  options.data_port = data_port;
  options.rank_hint = config.rank_hint;
  options.recovering = role == wire::role::server && config.checkpoint_recover;
  options.join_at_barrier = role == wire::role::worker && config.join_at_barrier;
  options.connect_timeout = config.connect_timeout;
  options.startup_timeout = config.startup_timeout;
  options.heartbeat_interval = config.heartbeat_interval;
  options.peer_timeout = config.peer_timeout;
  options.log =
      logger{node_name(wire::to_string(role), std::nullopt, options.host), config.verbose};
  return options;
}

/// The tuning of a node's data links; under TLS, `tls` with the role their peers act in.
data_link_tuning tuning_for(const cluster_config& config, link_tls tls) {
  data_link_tuning tuning;
  tuning.limits.max_frame_bytes = static_cast<std::size_t>(config.max_frame_bytes);
  // Under TLS, tensors stay inside it unless the configuration says otherwise: an arena is
  // readable by any process of the same user (docs/RELIABILITY.md, "TLS").
  tuning.shm_arena_bytes = tls.enabled() && !config.tls_allow_shared_memory
                               ? 0
                               : static_cast<std::size_t>(config.shm_arena_bytes);
  tuning.receive_window_bytes = static_cast<std::size_t>(config.link_window_bytes);
  tuning.io_spin = std::chrono::microseconds{config.io_spin_us};
  tuning.fuse_item_bytes = static_cast<std::size_t>(config.fuse_item_bytes);
  tuning.fuse_frame_bytes = static_cast<std::size_t>(config.fuse_frame_bytes);
  tuning.secret = link_secret(config.auth_token);
  tuning.tls = std::move(tls);
  tuning.log = logger(node_name("node", std::nullopt, advertised_host(config)), config.verbose);
  return tuning;
}

/// Where a server's shard failures go: to its agent (failed_atom), which tells the scheduler; the
/// shards exist before the agent does, so a failure before the join waits here. Any thread.
class shard_failure_relay {
public:
  void report(const std::string& why) {
    std::lock_guard lock(mutex_);
    if (agent_)
      caf::anon_send(*agent_, failed_atom::value, why);
    else
      early_.push_back(why);
  }
  void attach(const node_agent_actor& agent) {
    std::lock_guard lock(mutex_);
    agent_ = agent;
    for (auto& why : early_)
      caf::anon_send(agent, failed_atom::value, std::move(why));
    early_.clear();
  }

private:
  std::mutex mutex_;
  std::optional<node_agent_actor> agent_;
  std::vector<std::string> early_;
};

/// What a worker's store owns besides itself, destroyed after it: the agent before the system.
struct worker_resources {
  std::unique_ptr<node_runtime> runtime;
  std::unique_ptr<node_agent> agent;
  ~worker_resources() { agent.reset(); }
};

/// A server's subscription to its agent: membership updates go to every shard (a lost worker
/// within the quorum no longer holds up rounds and staleness bounds) and to its data port (a lost
/// worker takes no new connections).
job_listener::behavior_type server_listener_actor(job_listener::pointer,
                                                  std::shared_ptr<const server_node> node,
                                                  caf::actor data_port, node_agent_actor agent) {
  return {
      [](peer_lost_atom, const std::string&) {}, // run_server sees the failure through the agent
      [](stop_atom) {},                          // ... and the stop
      [node, data_port, agent](const wire::membership& table) {
        node->broadcast(table);
        caf::anon_send(data_port, table);
        // The shards' lanes hold back what comes after it until the shards have the table: a
        // worker that joined may be told of it now (Membership.requestId).
        if (table.request_id != 0)
          caf::anon_send(agent, held_atom::value, table.request_id);
      },
  };
}

/// SIGUSR1 (troupe-node): a server prints its summary at its next look, within a second.
std::atomic<bool> summary_asked{false};
/// SIGUSR2 (troupe-node): a server asks to leave the job at its next look.
std::atomic<bool> leave_asked{false};

/// observe.trace: this process records spans, written to its node file at the end of the job.
void start_job_trace(const cluster_config& config, const char* role, std::uint32_t rank) {
  if (config.trace_file.empty())
    return;
  auto& trace = job_trace::process();
  trace.set_node(role, rank);
  trace.start(config.trace_file);
}

void write_job_trace(const logger& log) {
  auto& trace = job_trace::process();
  if (!trace.enabled())
    return;
  auto written = trace.write();
  if (!written)
    log.error("the job trace: " + written.error().message());
  else
    log.info("wrote " + std::to_string(trace.size()) + " trace spans to " + *written +
             (trace.dropped() > 0 ? " (" + std::to_string(trace.dropped()) + " dropped)" : ""));
}

/// The q-quantile of dist_async's leads (shard_stats::lead_counts), in pushes.
std::uint64_t lead_quantile(const lead_histogram& counts, double q) {
  std::uint64_t total = 0;
  for (auto c : counts)
    total += c;
  const auto rank = std::max<std::uint64_t>(
      1, static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(total))));
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    seen += counts[i];
    if (seen >= rank)
      return i;
  }
  return counts.size() - 1;
}

/// The server's summary: its shards' counters summed, dist_async's staleness, what its links
/// refused and how they moved tensors, and the busiest keys' traffic. Asked with a short bound,
/// since the launcher gives a finished server little time to exit.
void log_server_summary(const server_node& node, const logger& log,
                        std::chrono::milliseconds request_timeout) {
  if (!log.enabled(log_level::info))
    return;
  auto stats = node.stats(std::min(request_timeout, std::chrono::milliseconds{1'000}));
  if (!stats) {
    log.info("shard counters unavailable: " + stats.error().to_string());
    return;
  }
  log.info("served " + std::to_string(node.shards().size()) +
           " shards: " + std::to_string(stats->updates) + " updates, " +
           std::to_string(stats->late_pushes_dropped) + " late pushes dropped, max lead " +
           std::to_string(stats->max_lead) + " rounds, " + std::to_string(stats->pulls_expired) +
           " pulls expired, " + std::to_string(stats->requests_refused) + " requests refused" +
           (stats->inits_dropped > 0
                ? ", " + std::to_string(stats->inits_dropped) + " unfinished inits dropped"
                : std::string{}) +
           (stats->checkpoints_written > 0
                ? ", " + std::to_string(stats->checkpoints_written) + " checkpoints written"
                : std::string{}));
  if (std::any_of(stats->lead_counts.begin(), stats->lead_counts.end(),
                  [](std::uint64_t c) { return c > 0; }))
    log.info("dist_async staleness (pushes ahead of the slowest live worker on arrival): p50 " +
             std::to_string(lead_quantile(stats->lead_counts, 0.5)) + ", p99 " +
             std::to_string(lead_quantile(stats->lead_counts, 0.99)) + ", max " +
             std::to_string(stats->max_lead));
  const auto refused = process_link_refusals();
  log.info("links: " + std::to_string(refused.bad_frames) + " bad frames refused, " +
           std::to_string(refused.peers_closed) + " peers closed for them");
  log.info(describe_tensor_bytes(process_link_tensor_bytes()));
  auto keys = stats->keys;
  constexpr std::size_t shown = 32;
  std::sort(keys.begin(), keys.end(), [](const key_traffic& a, const key_traffic& b) {
    return a.push_bytes + a.pull_bytes > b.push_bytes + b.pull_bytes;
  });
  for (std::size_t i = 0; i < std::min(keys.size(), shown); ++i)
    log.info("key " + std::to_string(keys[i].key) + ": " + std::to_string(keys[i].pushes) +
             " pushes, " + std::to_string(keys[i].push_bytes) + " bytes in; " +
             std::to_string(keys[i].pulls) + " pulls, " + std::to_string(keys[i].pull_bytes) +
             " bytes out");
  if (keys.size() > shown)
    log.info("and " + std::to_string(keys.size() - shown) + " keys with less traffic");
}

} // namespace

void ask_for_summary() noexcept {
  summary_asked.store(true);
}

void ask_to_leave() noexcept {
  leave_asked.store(true);
}

result<job_outcome> run_scheduler(const cluster_config& config,
                                  const std::function<void(std::uint16_t port)>& on_listening,
                                  std::function<void(std::uint32_t rank)> on_worker_lost) {
  if (auto valid = validate_for_role(config, node_role::scheduler); !valid)
    return valid.error();
  auto tls = load_tls_credentials(config, node_role::scheduler);
  if (!tls)
    return tls.error();
  node_runtime runtime;
  scheduler_options options;
  options.host = config.scheduler_host;
  // The configuration makes it scheduler.host unless node.bind says otherwise.
  options.bind = config.bind_address;
  options.port = config.scheduler_port.value_or(0);
  options.num_workers = static_cast<std::uint32_t>(config.num_workers.value_or(1));
  options.max_workers = static_cast<std::uint32_t>(config.worker_capacity());
  options.quorum = static_cast<std::uint32_t>(config.quorum.value_or(0));
  options.num_servers = static_cast<std::uint32_t>(config.num_servers.value_or(1));
  options.max_servers = static_cast<std::uint32_t>(config.key_range_count());
  options.job_id = config.job_id;
  options.auth_token = config.auth_token;
  options.tls = std::move(*tls);
  options.startup_timeout = config.startup_timeout;
  options.peer_timeout = config.peer_timeout;
  options.heartbeat_interval = config.heartbeat_interval;
  options.drain_timeout = config.request_timeout;
  options.server_rejoin = config.server_rejoin;
  options.log = logger{node_name("scheduler", std::nullopt, config.scheduler_host), config.verbose};
  options.on_worker_lost = std::move(on_worker_lost);
  auto handle = spawn_scheduler(*runtime.system, options);
  if (!handle)
    return handle.error();
  if (on_listening)
    on_listening(handle->port());
  // The scheduler bounds every wait of the job itself (startup, heartbeats, drain); its own
  // lifetime is the job's.
  for (;;)
    if (auto outcome = handle->wait(std::chrono::seconds{1}))
      return *outcome;
}

int scheduler_exit_code(const result<job_outcome>& outcome) noexcept {
  if (!outcome)
    return 1;
  switch (outcome->end) {
  case job_end::finished:
    return 0;
  case job_end::finished_with_losses:
    return 3;
  case job_end::failed:
    return 1;
  }
  return 1;
}

/// node.server_device as a context this process has, or an error naming the key and why.
result<context> server_update_device(const cluster_config& config) {
  const auto device = parse_context(config.server_device);
  if (!device)
    return error{errc::invalid_argument, "node.server_device (--server-device) '" +
                                             config.server_device +
                                             "' is not a device like cpu(0) or gpu(0)"};
  if (auto available = check_available(*device); !available)
    return error{available.error().code(),
                 "node.server_device (--server-device): " + available.error().message()};
  return *device;
}

/// checkpoint.dir, created (mode 700) when missing, and writable; or an error naming the key.
status prepare_checkpoint_dir(const cluster_config& config) {
  if (config.checkpoint_dir.empty())
    return ok();
  const std::filesystem::path directory{config.checkpoint_dir};
  auto refused = [&](const std::string& why) {
    return error{errc::invalid_argument,
                 "checkpoint.dir (--checkpoint-dir) '" + config.checkpoint_dir + "': " + why};
  };
  std::error_code failure;
  if (!std::filesystem::exists(directory, failure)) {
    if (!std::filesystem::create_directories(directory, failure) && failure)
      return refused("cannot create it: " + failure.message());
    std::filesystem::permissions(directory, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace, failure);
  }
  if (!std::filesystem::is_directory(directory, failure))
    return refused("not a directory");
  if (::access(directory.c_str(), W_OK | X_OK) != 0)
    return refused(std::string{"not writable: "} + std::strerror(errno));
  return ok();
}

result<std::vector<shard_snapshot>> load_server_checkpoint(const cluster_config& config) {
  if (!config.checkpoint_recover)
    return std::vector<shard_snapshot>{};
  if (auto valid = validate_for_role(config, node_role::server); !valid)
    return valid.error();
  shard_layout layout;
  layout.num_servers = static_cast<std::uint32_t>(config.num_servers.value_or(1));
  layout.server_rank = static_cast<std::uint32_t>(config.rank_hint);
  layout.shards_per_server = static_cast<std::uint32_t>(config.shards_per_server);
  layout.num_workers = static_cast<std::uint32_t>(config.num_workers.value_or(1));
  layout.num_ranges = static_cast<std::uint32_t>(config.key_range_count());
  std::vector<shard_snapshot> snapshots;
  for (std::uint32_t i = 0; i < layout.shards_per_server; ++i) {
    layout.shard_index = i;
    const auto path = checkpoint_file(config.checkpoint_dir, layout);
    auto refused = [&](const std::string& why) {
      return error{errc::invalid_argument,
                   "checkpoint.recover (--recover): " + path.string() + ": " + why};
    };
    auto bytes = read_file(path.string());
    if (!bytes)
      return refused(bytes.error().message());
    auto snapshot = decode_snapshot(*bytes, path.string());
    if (!snapshot)
      return refused(snapshot.error().message());
    if (snapshot->kind != snapshot_kind::checkpoint)
      return refused("it holds optimizer states, not a checkpoint");
    if (auto differs = layout_differences(snapshot->layout, layout); !differs.empty())
      return refused("it was written by a server of another layout: " + differs);
    snapshots.push_back(std::move(*snapshot));
  }
  return snapshots;
}

/// What a server needs to hand key ranges over (elastic servers), learnt as it joins: the job
/// secret its key derives from, its rank and the latest membership table. Filled on the agent's
/// thread, read there too.
struct hand_over_context {
  std::mutex lock;
  job_secret secret;
  std::optional<std::uint32_t> rank;
  std::optional<wire::membership> table;
};

/// The move the scheduler's hand-over order asks of this server: to the data port the table lists
/// for the receiving server, linked as this server with its key.
result<range_move> range_move_for(const cluster_config& config,
                                  const std::shared_ptr<const tls_credentials>& tls,
                                  const server_node& node, hand_over_context& handing,
                                  const wire::hand_over& order) {
  std::lock_guard hold{handing.lock};
  if (!handing.rank || handing.secret.empty() || !handing.table)
    return error{errc::invalid_argument,
                 "hand-over of key ranges: this server has not finished joining the job"};
  const auto& nodes = handing.table->nodes;
  const auto to = std::find_if(nodes.begin(), nodes.end(), [&](const wire::node_info& n) {
    return n.node_role == wire::role::server && n.rank == order.to_server;
  });
  if (to == nodes.end() || !to->alive || to->left || order.to_server == *handing.rank)
    return error{errc::invalid_argument, "hand-over of key ranges to server " +
                                             std::to_string(order.to_server) +
                                             ": the membership table lists no such other server "
                                             "alive"};
  range_move move;
  move.ranges = order.ranges;
  move.shards = node.shards();
  move.host = to->host;
  move.port = to->data_port;
  auto tuning = tuning_for(config, {tls, {node_role::server}});
  const wire::node_identity self{wire::role::server, *handing.rank};
  tuning.node = node_credentials{self, derive_node_key(tuning.secret, handing.secret, self)};
  move.link = data_link_options{tuning, 0};
  move.chunk_bytes = static_cast<std::size_t>(config.chunk_bytes);
  // The shards wait for their keys' round boundaries, which the workers' next pushes bring.
  move.timeout = config.request_timeout * 2;
  move.log = logger{node_name("server", *handing.rank, advertised_host(config)), config.verbose};
  return move;
}

status run_server(const cluster_config& config, std::vector<shard_snapshot> restore) {
  if (auto valid = validate_for_role(config, node_role::server); !valid)
    return valid;
  const auto update_device = server_update_device(config);
  if (!update_device)
    return update_device.error();
  auto tls = load_tls_credentials(config, node_role::server);
  if (!tls)
    return tls.error();
  node_runtime runtime;
  auto& system = *runtime.system;
  const std::string host = advertised_host(config);
  server_node_options node_options;
  node_options.num_workers = static_cast<std::uint32_t>(config.num_workers.value_or(1));
  node_options.max_workers = static_cast<std::uint32_t>(config.worker_capacity());
  node_options.shards = static_cast<std::uint32_t>(config.shards_per_server);
  node_options.mode = consistency::sync;
  node_options.chunk_bytes = static_cast<std::size_t>(config.chunk_bytes);
  // A waiting pull belongs to a request that gives up after timeouts.request.
  node_options.pull_timeout = config.request_timeout;
  node_options.update_device = *update_device;
  node_options.num_servers = static_cast<std::uint32_t>(config.num_servers.value_or(1));
  node_options.num_ranges = static_cast<std::uint32_t>(config.key_range_count());
  node_options.checkpoint = {config.checkpoint_dir,
                             static_cast<std::uint64_t>(config.checkpoint_every_rounds),
                             config.checkpoint_every};
  // A recovering server's shards restore files of its rank before the scheduler confirms it.
  if (config.checkpoint_recover)
    node_options.server_rank = static_cast<std::uint32_t>(config.rank_hint);
  for (auto& snapshot : restore)
    node_options.restore.push_back(std::make_shared<const shard_snapshot>(std::move(snapshot)));
  restore.clear();
  // The rank comes with the agent, which needs the data port, which needs the shards' router:
  // the shards are named before the rank is known.
  node_options.max_store_bytes = static_cast<std::uint64_t>(config.max_store_bytes);
  node_options.max_value_bytes = static_cast<std::uint64_t>(config.max_value_bytes);
  // An init that misses bytes is as stalled as a frame that does.
  node_options.stalled_init = config.stalled_frame_timeout;
  node_options.log = logger{node_name("server", std::nullopt, host), config.verbose};
  auto failures = std::make_shared<shard_failure_relay>();
  node_options.on_shard_failure = [failures](const std::string& why) { failures->report(why); };
  auto node = std::make_shared<const server_node>(system, std::move(node_options));
  data_server_options data_options;
  data_options.route = node->router();
  data_options.take_request = [router = node->router()](envelope& request,
                                                        const reply_sink& broker) {
    return router.take(request, broker);
  };
  // The shards drop what a closed connection left unfinished (inits, pushes).
  data_options.on_disconnect = [router = node->router()](std::uint64_t connection) {
    router.connection_closed(connection);
  };
  // Each connection proves the worker it is, and acts only as that worker
  // (actors/logic/node_identity.hpp); the job secret comes with this server's admission.
  data_options.require_node_proof = true;
  data_options.authorize = request_refusal;
  data_options.tuning = tuning_for(config, {*tls, {node_role::worker, node_role::server}});
  data_options.receive_budget_bytes = static_cast<std::size_t>(config.receive_budget_bytes);
  data_options.max_send_queue_bytes = static_cast<std::size_t>(config.max_send_queue_bytes);
  data_options.stalled_frame_timeout = config.stalled_frame_timeout;
  data_options.min_frame_rate = static_cast<std::uint64_t>(config.min_frame_rate);
  data_options.frame_grace = config.frame_grace;
  // Tensor chunks (and their headers) are read whole, in place, however large they are set.
  data_options.receive_step_bytes =
      std::max(data_options.receive_step_bytes,
               static_cast<std::size_t>(config.chunk_bytes) + (std::size_t{64} << 10));
  auto data = spawn_data_server(system, config.bind_address, config.data_port, data_options);
  if (!data) {
    if (nonlocal_address_reason(config.bind_address).empty())
      return data.error();
    // Most often a hostfile name that does not resolve, on its own host, to that host.
    return error{data.error().code(),
                 data.error().message() +
                     "; a server listens on DMLC_NODE_HOST ([node] host) or [node] bind, which "
                     "must be an address of this host: troupe-launch's ssh mode sets "
                     "DMLC_NODE_HOST to the host's name in the hostfile, and each name there must "
                     "resolve, on the host it names, to one of that host's own addresses (add it "
                     "to /etc/hosts there, or write addresses in the hostfile)"};
  }
  auto joining = agent_options_for(config, wire::role::server, data->port, *tls);
  auto handing = std::make_shared<hand_over_context>();
  joining.on_job_secret = [broker = data->broker, handing](const job_secret& secret) {
    caf::anon_send(broker, secret);
    std::lock_guard hold{handing->lock};
    handing->secret = secret;
  };
  joining.on_table = [handing](const wire::membership& table) {
    std::lock_guard hold{handing->lock};
    handing->table = table;
  };
  joining.on_hand_over = [&system, &config, tls = *tls, node, handing](
                             const wire::hand_over& order, std::function<void(status)> answer) {
    auto move = range_move_for(config, tls, *node, *handing, order);
    if (!move)
      return answer(move.error());
    move_key_ranges(system, std::move(*move), std::move(answer));
  };
  auto agent = node_agent::join(system, joining);
  if (!agent) {
    caf::anon_send(data->broker, stop_atom::value);
    return agent.error();
  }
  if (config.checkpoint_recover &&
      (*agent)->rank() != static_cast<std::uint32_t>(config.rank_hint)) {
    caf::anon_send(data->broker, stop_atom::value);
    return error{errc::internal, "recovering the checkpoint of server rank " +
                                     std::to_string(config.rank_hint) +
                                     ", the scheduler admitted this server as rank " +
                                     std::to_string((*agent)->rank())};
  }
  failures->attach((*agent)->actor());
  node->set_rank(static_cast<std::uint32_t>((*agent)->rank()));
  {
    std::lock_guard hold{handing->lock};
    handing->rank = static_cast<std::uint32_t>((*agent)->rank());
  }
  // A recovering server's first table may list workers lost before it.
  caf::anon_send(data->broker, (*agent)->membership());
  node->broadcast((*agent)->membership()); // ... and workers that joined before it
  auto listener = system.spawn(server_listener_actor, node, data->broker, (*agent)->actor());
  (*agent)->subscribe(listener);
  const auto name = node_name("server", (*agent)->rank(), host);
  start_job_trace(config, "server", (*agent)->rank());
  status outcome;
  for (;;) {
    if ((*agent)->wait_for_stop(std::chrono::seconds{1}))
      break;
    if (summary_asked.exchange(false))
      log_server_summary(*node, logger{name, std::max(config.verbose, 1)}, config.request_timeout);
    if (leave_asked.exchange(false)) {
      // Answered at once; the stop comes once the key ranges have moved to the other servers.
      const logger log{name, std::max(config.verbose, 1)};
      if (auto asked = (*agent)->ask_to_leave(config.request_timeout); asked)
        log.info("asked to leave the job: its key ranges move to the other servers, then it stops");
      else
        log.error("could not leave the job: " + asked.error().message());
    }
    if (auto failure = (*agent)->failure()) {
      outcome = *failure;
      // The scheduler told every node at once; a moment's grace lets the workers hear the lost
      // node named before they see this server's connections close.
      std::this_thread::sleep_for(
          std::min(config.request_timeout / 4, std::chrono::milliseconds{500}));
      break;
    }
  }
  log_server_summary(*node,
                     logger{name, config.summary ? std::max(config.verbose, 1) : config.verbose},
                     config.request_timeout);
  write_job_trace(logger{name, config.verbose});
  caf::anon_send(data->broker, stop_atom::value);
  caf::anon_send_exit(listener, caf::exit_reason::user_shutdown);
  agent->reset();
  return outcome;
}

status check_node_config(const cluster_config& config) {
  if (!config.role || *config.role == node_role::worker)
    return error{errc::invalid_argument,
                 "the configuration names no scheduler or server role (DMLC_ROLE, [job] role or "
                 "--role)"};
  const auto role = *config.role;
  if (auto valid = validate_for_role(config, role); !valid)
    return valid;
  if (role == node_role::scheduler)
    return check_port_free(config.bind_address, config.scheduler_port.value_or(0));
  if (auto device = server_update_device(config); !device)
    return device.error();
  if (auto directory = prepare_checkpoint_dir(config); !directory)
    return directory;
  if (config.checkpoint_recover) {
    // Only whether the files are there: reading and checking them (a 100 MB shard takes a good
    // fraction of a second) is load_server_checkpoint's, once.
    shard_layout layout;
    layout.server_rank = static_cast<std::uint32_t>(config.rank_hint);
    for (int i = 0; i < config.shards_per_server; ++i) {
      layout.shard_index = static_cast<std::uint32_t>(i);
      const auto path = checkpoint_file(config.checkpoint_dir, layout);
      std::error_code failure;
      if (!std::filesystem::is_regular_file(path, failure))
        return error{errc::invalid_argument, "checkpoint.recover (--recover): " + path.string() +
                                                 " does not exist: no checkpoint of server rank " +
                                                 std::to_string(config.rank_hint) + " to recover"};
    }
  }
  return check_port_free(config.bind_address, config.data_port);
}

int serve_node(const cluster_config& config, std::vector<shard_snapshot> restore,
               const std::function<void(std::uint16_t port)>& on_listening,
               std::function<void(std::uint32_t rank)> on_worker_lost) {
  if (config.auth_token.empty()) {
    const std::string& listening = config.bind_address;
    if (!is_loopback(listening))
      logger{"troupe", 0}.warning(
          "listening on " + listening +
          " without a job token (--insecure): any host that reaches the port can join the job "
          "and read and change its values");
  }
  if (config.role == node_role::scheduler) {
    auto outcome = run_scheduler(config, on_listening, std::move(on_worker_lost));
    // The scheduler has logged its summary line (at error level unless every worker finished).
    const logger log{node_name("scheduler", std::nullopt, config.scheduler_host), config.verbose};
    if (!outcome)
      log.error(outcome.error().to_string());
    else if (outcome->failure)
      log.error(outcome->failure->to_string());
    return scheduler_exit_code(outcome);
  }
  if (config.role == node_role::server) {
    auto outcome = run_server(config, std::move(restore));
    if (outcome)
      return 0;
    logger{node_name("server", std::nullopt, advertised_host(config)), config.verbose}.error(
        outcome.error().to_string());
    return 1;
  }
  logger{"troupe", config.verbose}.error(check_node_config(config).error().to_string());
  return 2;
}

std::optional<int> serve_if_node_role(int argc, const char* const* argv) {
  // The cluster flags among the program's arguments; the rest is the program's business.
  config_overrides flags;
  CLI::App app;
  app.set_help_flag();
  app.allow_extras();
  add_config_flags(app, flags);
  std::optional<error> flag_error;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& failure) {
    flag_error = error{errc::invalid_argument, failure.what()};
    flags = {};
  }
  const auto environment = process_environment();
  auto config = load_config(std::nullopt, environment, flags);
  // The role, even from a configuration that does not load: a scheduler or a server must say
  // why it cannot serve rather than carry on as a worker.
  std::optional<node_role> role;
  std::optional<std::string> role_text;
  if (config)
    role = config->role;
  else if (auto flag = flags.values.find("job.role"); flag != flags.values.end())
    role_text = flag->second;
  else if (auto variable = environment("DMLC_ROLE"))
    role_text = *variable;
  // A configuration that stops the node is the answer to the command line, said as the program
  // says a bad flag: its name, the message, one line.
  auto usage_error = [argc, argv](const error& why) {
    const std::string program =
        argc > 0 ? std::filesystem::path(argv[0]).filename().string() : std::string("troupe");
    std::fprintf(stderr, "%s: %s\n", program.c_str(), why.message().c_str());
    return 2;
  };
  if (role_text) {
    role = parse_role(*role_text);
    // A role nobody can read: neither a worker's program nor a node may carry on with it.
    if (!role)
      return usage_error(config.error());
  }
  if (!role || *role == node_role::worker)
    return std::nullopt;

  if (flag_error)
    return usage_error(*flag_error);
  if (!config)
    return usage_error(config.error());
  if (auto valid = check_node_config(*config); !valid)
    return usage_error(valid.error());
  auto restore = load_server_checkpoint(*config);
  if (!restore)
    return usage_error(restore.error());
  return serve_node(*config, std::move(*restore));
}

result<worker_setup> join_worker(const std::string& type, const cluster_config& config) {
  if (auto valid = validate_for_role(config, node_role::worker); !valid)
    return valid.error();
  auto tls = load_tls_credentials(config, node_role::worker);
  if (!tls)
    return tls.error();
  auto resources = std::make_shared<worker_resources>();
  resources->runtime = std::make_unique<node_runtime>();
  auto& system = *resources->runtime->system;
  auto workers_now = std::make_shared<std::atomic<std::uint32_t>>(0);
  // The agent's thread writes the ranks in the job, the store's caller reads them.
  struct ranks_in_job {
    std::mutex mutex;
    std::vector<int> ranks;
  };
  auto ranks_in = std::make_shared<ranks_in_job>();
  auto joining = agent_options_for(config, wire::role::worker, 0, *tls);
  joining.on_table = [workers_now, ranks_in](const wire::membership& table) {
    workers_now->store(table.num_workers, std::memory_order_relaxed);
    std::vector<int> ranks;
    for (const auto& node : table.nodes)
      if (node.node_role == wire::role::worker && node.alive && !node.left)
        ranks.push_back(static_cast<int>(node.rank));
    std::sort(ranks.begin(), ranks.end());
    const std::lock_guard lock{ranks_in->mutex};
    ranks_in->ranks = std::move(ranks);
  };
  auto agent = node_agent::join(system, joining);
  if (!agent)
    return agent.error();
  resources->agent = std::move(*agent);
  auto* agent_ptr = resources->agent.get();
  const auto& membership = agent_ptr->membership();

  std::vector<wire::node_info> servers;
  for (const auto& node : membership.nodes)
    if (node.node_role == wire::role::server)
      servers.push_back(node);
  std::sort(servers.begin(), servers.end(),
            [](const auto& a, const auto& b) { return a.rank < b.rank; });

  worker_setup setup;
  setup.system = &system;
  setup.type = type;
  setup.rank = agent_ptr->rank();
  setup.num_workers = membership.num_workers;
  setup.num_servers = membership.num_servers;
  // The table's ranges are in key order (membership_key_ranges); a table of one range per server
  // in server order is ps-lite's layout, which an empty list says.
  if (membership.key_ranges.size() > membership.num_servers) {
    auto ranges = membership.key_ranges;
    std::sort(ranges.begin(), ranges.end(),
              [](const auto& a, const auto& b) { return a.begin < b.begin; });
    for (const auto& range : ranges)
      setup.range_owner.push_back(range.server_rank);
  }
  setup.joined = agent_ptr->joined_running_job();
  setup.workers_now = [workers_now] { return workers_now->load(std::memory_order_relaxed); };
  setup.ranks_in = [ranks_in] {
    const std::lock_guard lock{ranks_in->mutex};
    return ranks_in->ranks;
  };
  setup.gathered_at_join = agent_ptr->gathered_at_join();
  setup.bigarray_bound = config.bigarray_bound;
  setup.chunk_bytes = static_cast<std::size_t>(config.chunk_bytes);
  setup.max_frame_bytes = static_cast<std::uint64_t>(config.max_frame_bytes);
  setup.slice_bytes = static_cast<std::size_t>(config.slice_bytes);
  setup.send_window_bytes = static_cast<std::size_t>(config.send_window_bytes);
  setup.slice_credit = static_cast<std::uint32_t>(config.slice_credit);
  setup.fuse_item_bytes = static_cast<std::size_t>(config.fuse_item_bytes);
  setup.fuse_frame_bytes = static_cast<std::size_t>(config.fuse_frame_bytes);
  setup.timeout = config.request_timeout;
  setup.quorum = static_cast<std::uint32_t>(config.quorum.value_or(0));
  setup.rescale_quorum = config.rescale_quorum;
  setup.max_staleness = config.max_staleness.value_or(-1);
  setup.max_rounds_ahead = static_cast<std::uint32_t>(config.max_rounds_ahead);
  auto tuning = tuning_for(config, {*tls, {node_role::server}});
  // Every data link proves this worker's node key, which only its admission gave it.
  tuning.node = node_credentials{{wire::role::worker, agent_ptr->rank()}, agent_ptr->key()};
  setup.connect_servers = [&system, servers,
                           tuning](const caf::actor& receiver) -> result<server_links> {
    server_links opened;
    for (const auto& server : servers) {
      data_link_options options{tuning, server.rank + 1};
      options.lane = std::make_shared<link_lane>();
      auto link = connect_data_link(system, server.host, server.data_port, receiver, options);
      const std::string name =
          wire::describe(server) + " at " + server.host + ":" + std::to_string(server.data_port);
      if (!link) {
        for (auto& open : opened.links)
          caf::anon_send_exit(open, caf::exit_reason::user_shutdown);
        return error{link.error().code(), name + ": " + link.error().message()};
      }
      opened.links.push_back(caf::actor_cast<link_actor>(*link));
      opened.lanes.push_back(std::move(options.lane));
      opened.names.push_back(name);
    }
    return opened;
  };
  setup.server_rejoin = config.server_rejoin;
  setup.reconnect_server = [&system, tuning](const wire::node_info& server,
                                             const caf::actor& receiver) -> result<link_actor> {
    data_link_options options{tuning, server.rank + 1};
    auto link = connect_data_link(system, server.host, server.data_port, receiver, options);
    if (!link)
      return link.error();
    return caf::actor_cast<link_actor>(*link);
  };
  // A barrier waits for the slowest worker of the job, so it is bounded by the startup timeout,
  // the longest wait the configuration grants; a lost peer ends it sooner.
  auto barrier_timeout = config.startup_timeout;
  setup.barrier = [agent_ptr, barrier_timeout] {
    return agent_ptr->barrier(wire::group::workers, barrier_timeout);
  };
  setup.start_barrier = [agent_ptr, barrier_timeout] {
    return agent_ptr->barrier(wire::group::workers, barrier_timeout, true);
  };
  setup.gather = [agent_ptr, barrier_timeout](std::span<const double> values) {
    return agent_ptr->barrier_gather(wire::group::workers, values, barrier_timeout);
  };
  setup.on_started = [agent_ptr](const worker_actor& worker) { agent_ptr->subscribe(worker); };
  auto request_timeout = config.request_timeout;
  setup.announce_settings = [agent_ptr, request_timeout](const wire::sync_settings& settings) {
    return agent_ptr->send_sync_settings(settings, request_timeout);
  };
  const auto name = node_name("worker", agent_ptr->rank(), config.node_host);
  start_job_trace(config, "worker", agent_ptr->rank());
  setup.on_finalize = [agent_ptr, request_timeout,
                       log = logger{name, config.verbose}](std::uint64_t rounds) {
    write_job_trace(log);
    return agent_ptr->notify_done(request_timeout, rounds);
  };
  setup.owned_resources = resources;
  setup.log = logger{name, config.verbose};
  if (config.summary)
    setup.summary_log = logger{name, std::max(config.verbose, 1)};
  return setup;
}

} // namespace troupe

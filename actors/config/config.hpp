#pragma once
// The cluster configuration of a troupe job: one typed struct for every role, read from three
// layers, later wins:
//
//   1. a TOML file (docs/cluster.sample.toml lists every key with its default),
//   2. the environment: ps-lite's DMLC_* variables, PS_VERBOSE, MXNET_KVSTORE_BIGARRAY_BOUND and
//      a few TROUPE_* ones (see config_keys() or `--help`),
//   3. command-line flags (add_config_flags gives every binary the same ones).
//
//   troupe::config_overrides flags;
//   CLI::App app{"..."};
//   troupe::add_config_flags(app, flags);
//   app.parse(argc, argv);
//   auto cfg = troupe::load_config(std::nullopt, troupe::process_environment(), flags);
//   if (!cfg) { std::cerr << cfg.error().message() << "\n"; return 2; }
//
// Every error is one line that names where the bad value came from: `file:line:column` for the
// file, the variable for the environment, the flag for the command line. Unknown keys in the file
// are errors, so a typo is never silently ignored. The environment is read in one place only
// (read through an `env_lookup`, so tests pass a map and never touch the process environment).
//
// As in ps-lite, DMLC_NODE_HOST beats DMLC_INTERFACE, and the scheduler ignores DMLC_INTERFACE
// (it is reached at DMLC_PS_ROOT_URI).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "engine/error.hpp"

namespace CLI {
class App;
class Validator;
} // namespace CLI

namespace troupe {

/// The three kinds of node of a job, with ps-lite's names.
enum class node_role : std::uint8_t { scheduler, server, worker };

/// "scheduler", "server" or "worker".
std::string_view to_string(node_role role) noexcept;

/// The role named by `text`, if it is one of the three names.
std::optional<node_role> parse_role(std::string_view text) noexcept;

/// Everything a node needs to know about its job. The defaults are those of
/// docs/cluster.sample.toml; the comment of each field is its help text (config_keys() carries the
/// same text for `--help`). Durations are in milliseconds; sizes in bytes.
struct cluster_config {
  // [job]
  /// This node's role (DMLC_ROLE). Unset: the program decides (a program that creates a dist_*
  /// KVStore is a worker).
  std::optional<node_role> role;
  /// Number of workers, the size of a sync round (DMLC_NUM_WORKER). Required for a job.
  std::optional<int> num_workers;
  /// Most workers the job may have while it runs (TROUPE_MAX_WORKERS): workers beyond num_workers
  /// join the running job, each with a fresh rank below it. Unset: num_workers (no worker joins).
  std::optional<int> max_workers;
  /// max_workers, or num_workers when unset.
  int worker_capacity() const { return max_workers.value_or(num_workers.value_or(1)); }
  /// A worker that joins the running job is counted only from the workers' next barrier on
  /// (TROUPE_JOIN_AT_BARRIER): it waits there, and every key counts it from the round after it.
  /// For programs that cut their data per epoch at a barrier (train_mnist sets it). False: it
  /// counts from the next round each key has not begun.
  bool join_at_barrier = false;
  /// Number of server processes, each owning a key range (DMLC_NUM_SERVER). Required for a job.
  std::optional<int> num_servers;
  /// The key ranges the job's keys are placed over (TROUPE_MAX_SERVERS): MXNet's rule over this
  /// many ranges, each held whole by one server (range r by server r mod num_servers at the
  /// start). Unset: num_servers, MXNet's placement exactly.
  std::optional<int> max_servers;
  /// max_servers, or num_servers when unset.
  int key_range_count() const { return max_servers.value_or(num_servers.value_or(1)); }
  /// Name of the job; nodes of another job are refused by the scheduler.
  std::string job_id = "troupe";
  /// Shared secret every node presents when it registers; empty: none. When read from
  /// `job.token_file`, this holds the file's contents without the trailing newline.
  std::string auth_token;
  /// The file `auth_token` was read from, if any (kept so messages can name it). It must be
  /// private: a token file that group or others may read or write is refused.
  std::string auth_token_file;
  /// Lets a scheduler or server listen on an address other than loopback without a token
  /// (validate_for_role refuses that otherwise).
  bool insecure = false;

  // [scheduler]
  /// Address of the scheduler (DMLC_PS_ROOT_URI).
  std::string scheduler_host = "127.0.0.1";
  /// Port of the scheduler (DMLC_PS_ROOT_PORT). Required for a job; 0 lets a scheduler pick a
  /// free port, which only a test that discovers it can use.
  std::optional<std::uint16_t> scheduler_port;

  // [node]
  /// Address this node gives peers to reach it (DMLC_NODE_HOST, or the IPv4 address of
  /// DMLC_INTERFACE). For the scheduler it is `scheduler_host`. Empty when nothing names it and
  /// the bind address is a wildcard.
  std::string node_host;
  /// The network interface `node_host` was taken from (DMLC_INTERFACE), if any.
  std::string node_interface;
  /// Address every listener of this node binds. Default 127.0.0.1; when no bind address is
  /// given but the configuration names this node's address (node host or interface; for the
  /// scheduler, the scheduler host), that address.
  std::string bind_address = "127.0.0.1";
  /// Port of this node's data listener (PORT); 0: a free port chosen at start.
  std::uint16_t data_port = 0;
  /// The rank this node asks the scheduler for, or -1 (TROUPE_RANK_HINT, set by troupe-launch).
  int rank_hint = -1;
  /// Server shards (actors, each owning a slice of the server's key range) per server process.
  /// Default: the number of hardware threads.
  int shards_per_server = default_shards();
  /// Servers: the device that keeps each key's value and runs its update when the optimizer is
  /// on the servers ("cpu(0)", "gpu(0)"); parsed and checked when the server starts, since this
  /// library knows no devices.
  std::string server_device = "cpu(0)";
  /// Logging: 0 quiet, 1 connections, 2 every message (PS_VERBOSE).
  int verbose = 0;

  // [timeouts]
  /// How long a request may wait for its answer, from when it was sent. A dist_sync request waits
  /// for the slowest worker, so this is generous; a lost node is noticed by peer_timeout.
  std::chrono::milliseconds request_timeout{30'000};
  /// A node (or the scheduler) that sends nothing, heartbeats included, for this long is lost.
  std::chrono::milliseconds peer_timeout{5'000};
  /// Interval of the heartbeats between a node and the scheduler; shorter than peer_timeout.
  std::chrono::milliseconds heartbeat_interval{500};
  /// How long a node keeps trying (with backoff) to connect to a peer that refuses.
  std::chrono::milliseconds connect_timeout{10'000};
  /// How long the job waits for all nodes to register at start-up.
  std::chrono::milliseconds startup_timeout{60'000};
  /// A listener closes a peer's connection that began a frame and sent nothing more for this
  /// long (a slow-loris peer); silence between frames is fine. A server also drops an init that
  /// misses bytes and got none for this long. 0: never.
  std::chrono::milliseconds stalled_frame_timeout{30'000};
  /// A frame may take this long before min_frame_rate applies to it (longer than peer_timeout:
  /// a sender silent for longer is lost anyway).
  std::chrono::milliseconds frame_grace{10'000};
  /// How long the scheduler keeps a lost server's rank open for a server restarted from its
  /// checkpoint (checkpoint.recover), and workers hold their calls to it; 0: a lost server fails
  /// the job.
  std::chrono::milliseconds server_rejoin{0};

  // [data]
  /// Arrays with at least this many elements are split over all servers
  /// (MXNET_KVSTORE_BIGARRAY_BOUND).
  std::int64_t bigarray_bound = 1'000'000;
  /// Largest frame a node accepts from the network; bigger frames are refused.
  std::int64_t max_frame_bytes = 256 * 1024 * 1024;
  /// Size of the chunks big tensors travel in; at most max_frame_bytes.
  std::int64_t chunk_bytes = 1024 * 1024;
  /// Keys larger than this are cut into slices of at most this many bytes, each its own ps-key
  /// with its own round (actors/logic/key_placement.hpp); 0: keys are not cut.
  std::int64_t slice_bytes = 512 * 1024;
  /// Bytes of tensor a worker hands each server's link at a time; the rest waits in its send
  /// queue, ordered by priority. 0: no bound.
  std::int64_t send_window_bytes = 4 * 1024 * 1024;
  /// dist_sync: pushes of one key's slices on one server whose answers a worker awaits at once
  /// (worker_core.hpp, "Slice credit"); 0: no bound.
  std::int64_t slice_credit = 4;
  /// Shared-memory arena per direction of a data connection whose ends share a host (tensors
  /// then skip the socket); 0 turns the fast path off.
  std::int64_t shm_arena_bytes = 64 * 1024 * 1024;
  /// Microseconds a node's network thread polls its sockets after each received frame before
  /// it sleeps (actors/io_spin.hpp); 0: it sleeps at once.
  std::int64_t io_spin_us = 0;
  /// Fusion: requests to one server (and a server's answers to one worker) that are ready
  /// together travel in one frame of at most fuse_frame_bytes of tensor, each of at most
  /// fuse_item_bytes (docs/data-path.md, "Fusion"); fuse_frame_bytes 0: no fusion.
  std::int64_t fuse_item_bytes = 16 * 1024;
  std::int64_t fuse_frame_bytes = 256 * 1024;
  /// Receive window of every connection: a peer may have this many bytes of frames in flight
  /// before the receiver releases some (a single larger frame goes alone).
  std::int64_t link_window_bytes = 64 * 1024 * 1024;
  /// Bytes of received frames a listener holds unreleased over all its connections; a frame
  /// beyond it waits (its connection stops being read). At least max_frame_bytes.
  std::int64_t receive_budget_bytes = std::int64_t{1} << 30;
  /// Bytes per second a frame must arrive at once it is older than frame_grace (this node's
  /// own delays do not count); a listener closes a slower peer. 0: no rate rule.
  std::int64_t min_frame_rate = 64 * 1024;
  /// Bytes of replies a listener queues for one peer before its further requests wait; a peer
  /// that reads none of them for stalled_frame is disconnected. At least max_frame_bytes.
  std::int64_t max_send_queue_bytes = 256 * 1024 * 1024;
  /// Servers: declared bytes of key values (all shards together, inits under way included) a
  /// server takes; an init beyond it is refused. 0: half of the machine's memory.
  std::int64_t max_store_bytes = 0;
  /// Servers: the largest value one key may declare at its init.
  std::int64_t max_value_bytes = std::int64_t{1} << 32;

  // [sync]
  /// dist_sync: a round closes as soon as this many workers have pushed all of it; every mode:
  /// the job goes on while at least this many workers are alive. Unset: num_workers (fail fast).
  std::optional<int> quorum;
  /// Scale a quorum round's sum by num_workers / quorum.
  bool rescale_quorum = false;
  /// dist_async: a worker's pull for round t waits until every live worker has pushed round
  /// t - max_staleness. Unset: none (plain async).
  std::optional<int> max_staleness;
  /// Rounds beyond the current one a server accepts pushes for from one worker.
  int max_rounds_ahead = 2;

  // [checkpoint]
  /// Servers: the directory of their checkpoints and of save_optimizer_states' files; empty: the
  /// servers write no files.
  std::string checkpoint_dir;
  /// Servers: a checkpoint each time every key of a shard has completed this many more rounds
  /// (dist_async: pushes applied); 0: not by rounds.
  std::int64_t checkpoint_every_rounds = 0;
  /// Servers: a checkpoint when this long has passed since the last and a key changed; 0: never.
  std::chrono::milliseconds checkpoint_every{0};
  /// Servers: load this server's last checkpoint (of rank rank_hint) before joining, and join as
  /// the recovering server of that rank (troupe-node --recover).
  bool checkpoint_recover = false;

  // [tls]
  /// Every connection of the node, control and data, runs TLS 1.3 with certificates at both ends
  /// (actors/config/tls_credentials.hpp); the job token's handshake still runs inside it.
  bool tls_enabled = false;
  /// The job's CA (PEM): the only issuer whose certificates a node accepts from its peers.
  std::string tls_ca_file;
  /// This node's certificate (PEM, the node's own first, then any intermediate CAs) and its
  /// private key, which must be private like a token file (chmod 600). "{role}" in any of the
  /// three paths stands for this node's role, so one cluster file serves every role.
  std::string tls_cert_file;
  std::string tls_key_file;
  /// Let same-host peers move tensors through shared-memory arenas under TLS; off, they go
  /// through the encrypted socket (docs/RELIABILITY.md, "TLS", says why that is the default).
  bool tls_allow_shared_memory = false;

  // [observe]
  /// observe.trace: the job trace's file prefix (actors/logic/job_trace.hpp); empty: none.
  std::string trace_file;
  /// observe.summary: print the end-of-job traffic summary.
  bool summary = false;

  /// Hardware threads of this machine, at least 1.
  static int default_shards() noexcept;

  friend bool operator==(const cluster_config&, const cluster_config&) = default;
};

/// One configuration key: where it lives in the file, which variable and flag set it, its help
/// text and its default as the sample file writes it.
struct config_key {
  std::string_view section;      ///< TOML table: "job", "scheduler", "node", "timeouts", "data",
                                 ///< "sync", "checkpoint"
  std::string_view name;         ///< key inside the table
  std::string_view env;          ///< environment variable, or empty
  std::string_view flag;         ///< command-line flag ("--num-workers"), or empty
  std::string_view value_name;   ///< placeholder in help: "N", "HOST", "DURATION"...
  std::string_view default_text; ///< the default as TOML, or empty when the key has none
  std::string_view help;
};

/// Every key, in the order of the sample file.
std::span<const config_key> config_keys() noexcept;

/// Looks up one environment variable; nullopt when it is not set.
using env_lookup = std::function<std::optional<std::string>(std::string_view name)>;

/// The process environment (getenv). The only place troupe reads its environment.
env_lookup process_environment();

/// An env_lookup over a fixed map, for tests and for launchers that build a child's environment.
env_lookup environment_from(std::map<std::string, std::string, std::less<>> variables);

/// Values given on the command line, as text: load_config parses and checks them the same way
/// as environment values, so every layer reports a bad value alike.
struct config_overrides {
  /// --config FILE.
  std::optional<std::filesystem::path> config_file;
  /// Flag values by key ("job.num_workers" -> "4"); a flag given twice keeps the last value.
  std::map<std::string, std::string, std::less<>> values;
  /// The flag that set each key, for messages ("--num-workers").
  std::map<std::string, std::string, std::less<>> flags;

  /// Sets key `section.name` as if its flag had been given.
  void set(std::string_view key, std::string value);
};

/// Adds --config and one flag per configuration key (config_keys()) to `app`, in an option group
/// "Cluster configuration". The flags write into `out`, which must outlive the parse.
void add_config_flags(CLI::App& app, config_overrides& out);

/// Parses `argv` into `app` as every troupe program does. nullopt: the program goes on. Otherwise
/// the code the program returns at once: 0 after --help (printed on stdout), 2 after a usage error
/// (an unknown flag, a bad value CLI11 checks), printed as the one line "<program>: <what is
/// wrong>" on stderr, as the program's other usage errors are.
std::optional<int> parse_command_line(CLI::App& app, std::string_view program, int argc,
                                      const char* const* argv);

/// Checks of a floating-point flag's value, for `option->check(...)`: a finite number above 0, or
/// at least 0. CLI11's PositiveNumber and NonNegativeNumber would print their range, whose upper
/// bound is the largest double written out in 309 digits; these say what is wanted ("--lr: -0.1
/// is not a positive number").
CLI::Validator positive_number();
CLI::Validator non_negative_number();

/// The configuration from defaults < file < environment < flags.
///
/// The file is `file` if given, else `flags.config_file`, else the one TROUPE_CONFIG names, else
/// none. Errors (errc::io_error for an unreadable file, naming --config or TROUPE_CONFIG when the
/// path came from there; errc::corrupt_data for a file that is not TOML, naming the key of the
/// broken line when it is a plain `key = ...`; errc::invalid_argument for an unknown key or a bad
/// value) carry one line naming the file position, the variable or the flag. The token stays
/// private: a token file (job.token_file) that group or others may read or write is refused, and
/// so is a non-empty job.token in a cluster file they may read or write (TROUPE_JOB_TOKEN is
/// allowed); no message shows a token. data.chunk_bytes is checked with wire::chunker's rule
/// (wire::valid_chunk_bytes). Does no network activity beyond reading the addresses of the local
/// interfaces (for DMLC_INTERFACE).
result<cluster_config> load_config(const std::optional<std::filesystem::path>& file,
                                   const env_lookup& env, const config_overrides& flags);

/// Most bytes a file that sets a node up may hold: a cluster file, a token file, a TLS CA,
/// certificate or key file (each a few KiB). Reading stops there, so a wrong path (a log, a
/// device like /dev/zero) is refused instead of filling the node's memory.
inline constexpr std::size_t max_setup_file_bytes = std::size_t{1} << 20;

/// The contents of the file at `path`, read whole. errc::io_error "cannot read <what> <path>:
/// <why>" when it cannot be read (a directory is "not a regular file"); errc::invalid_argument
/// naming the file when it holds more than max_setup_file_bytes.
result<std::string> read_file(const std::string& path, std::string_view what);

/// As read_file, for a file that must stay private (a token file, a TLS key):
/// errc::invalid_argument naming the file, its mode and the fix (chmod 600) when group or others
/// may read or write it. The mode checked is that of the file read (one descriptor).
result<std::string> read_private_file(const std::string& path, std::string_view what);

/// Fills `out` with random bytes from the kernel (getrandom): job tokens and link nonces.
/// Errors: errc::io_error naming why, when the kernel has none to give.
status fill_random(std::span<std::uint8_t> out);

/// Whether a listener bound to `address` is reachable from this machine only: 127.0.0.0/8, ::1
/// (also as [::1] or ::ffff:127.x.y.z) or "localhost". Any other name counts as reachable from
/// other hosts: names are not resolved.
bool is_loopback(std::string_view address);

/// Whether `cfg` lets a node of `role` join a job: says, in one line, every missing value (a
/// server without DMLC_PS_ROOT_PORT...) with the variable, key and flag that set it. A scheduler
/// or server that would listen on an address other than loopback (127.0.0.0/8, ::1, localhost)
/// without a job token is refused unless `insecure` is set; workers do not listen. With
/// tls.enabled, the node's TLS files are loaded and checked as load_tls_credentials does
/// (actors/config/tls_credentials.hpp): readable, the key private and matching the certificate,
/// the certificate from the CA and naming `role`.
status validate_for_role(const cluster_config& cfg, node_role role);

/// The configuration of a worker process as kvstore::create(type, flags) reads it (the file
/// `flags` or TROUPE_CONFIG names, the environment `env`, `flags`), checked with
/// validate_for_role(worker). A program that will create a dist_* store calls it first with
/// process_environment(), so that a bad or missing value is its usage error (one line, exit 2)
/// and not a failure of create.
result<cluster_config> load_worker_config(const env_lookup& env, const config_overrides& flags);

/// Whether a TCP listener could bind `host`:`port` now (bind with SO_REUSEADDR, then close).
/// errc::io_error naming the address when the port is in use or the address is not local;
/// port 0 is always free. Used to fail before any network activity.
status check_port_free(const std::string& host, std::uint16_t port);

/// The IPv4 address of network interface `name` ("lo" -> "127.0.0.1"); errc::invalid_argument
/// naming the interface and listing those present when it has none.
result<std::string> interface_ipv4(std::string_view name);

/// A duration as the configuration writes it: an integer with a unit, "250ms", "5s", "2m", "1h".
result<std::chrono::milliseconds> parse_duration(std::string_view text);

/// "500ms", "5s", "2m": the shortest exact form, as parse_duration reads it.
std::string format_duration(std::chrono::milliseconds value);

} // namespace troupe

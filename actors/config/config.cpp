#include "actors/config/config.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <arpa/inet.h>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits>
#include <memory>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sstream>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <thread>
#include <toml++/toml.h>
#include <unistd.h>
#include <utility>
#include <vector>

#include "actors/config/local_address.hpp"
#include "actors/config/tls_credentials.hpp"
#include "schema/chunking.hpp"

namespace troupe {

std::string_view to_string(node_role role) noexcept {
  switch (role) {
  case node_role::scheduler:
    return "scheduler";
  case node_role::server:
    return "server";
  case node_role::worker:
    return "worker";
  }
  return "unknown";
}

std::optional<node_role> parse_role(std::string_view text) noexcept {
  for (auto role : {node_role::scheduler, node_role::server, node_role::worker})
    if (text == to_string(role))
      return role;
  return std::nullopt;
}

int cluster_config::default_shards() noexcept {
  return std::max(1u, std::thread::hardware_concurrency());
}

namespace {

// --- values as the layers give them ------------------------------------------------------------

/// One value from one layer: text from the environment or a flag (parsed here), or a typed TOML
/// value (TOML says whether it is a string or a number, so "4" in the file is not a number).
struct literal {
  enum class form : std::uint8_t { text, toml_string, toml_integer, toml_other };
  form kind = form::text;
  std::string text;         ///< text and toml_string: the string; toml_other: its TOML form
  std::int64_t integer = 0; ///< toml_integer
};

/// How a value appears after "got" in a message.
std::string describe(const literal& value) {
  switch (value.kind) {
  case literal::form::text:
  case literal::form::toml_string:
    return '"' + value.text + '"';
  case literal::form::toml_integer:
    return std::to_string(value.integer);
  case literal::form::toml_other:
    return value.text;
  }
  return value.text;
}

/// How a secret's value appears after "got": its size only, never its text.
std::string describe_secret(const literal& value) {
  if (value.kind == literal::form::text || value.kind == literal::form::toml_string)
    return "a value of " + std::to_string(value.text.size()) + " bytes (not shown)";
  return "a value that is not a string (not shown)";
}

/// A whole-string decimal integer; nullopt for anything else ("", "4x", "0x10", " 4").
std::optional<std::int64_t> parse_integer(std::string_view text) {
  std::int64_t out = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (!text.empty() && text.front() == '+')
    ++first;
  auto [end, ec] = std::from_chars(first, last, out);
  if (ec != std::errc{} || end != last || first == last)
    return std::nullopt;
  return out;
}

/// An integer from TOML, or from text in the environment and on the command line.
std::optional<std::int64_t> integer_of(const literal& value) {
  switch (value.kind) {
  case literal::form::toml_integer:
    return value.integer;
  case literal::form::text:
    return parse_integer(value.text);
  default:
    return std::nullopt;
  }
}

/// A string from TOML, or text; a TOML number is not a string.
std::optional<std::string> string_of(const literal& value) {
  if (value.kind == literal::form::text || value.kind == literal::form::toml_string)
    return value.text;
  return std::nullopt;
}

/// "16MiB", "4096", "1GiB": a byte count with an optional binary suffix.
std::optional<std::int64_t> parse_bytes(std::string_view text) {
  struct suffix {
    std::string_view name;
    std::int64_t factor;
  };
  static constexpr suffix suffixes[] = {
      {"GiB", std::int64_t{1} << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}};
  std::int64_t factor = 1;
  for (const auto& s : suffixes) {
    if (text.size() > s.name.size() && text.ends_with(s.name)) {
      text.remove_suffix(s.name.size());
      factor = s.factor;
      break;
    }
  }
  auto count = parse_integer(text);
  if (!count || *count < 0 || *count > std::numeric_limits<std::int64_t>::max() / factor)
    return std::nullopt;
  return *count * factor;
}

bool has_space(std::string_view text) {
  return std::any_of(text.begin(), text.end(),
                     [](unsigned char c) { return std::isspace(c) || std::iscntrl(c); });
}

// --- the keys ----------------------------------------------------------------------------------

/// Stores a value into the config; on a bad value, returns what was expected ("a positive
/// integer") for the message "<subject> must be <expected>, got <value>".
using setter = std::function<std::optional<std::string>(cluster_config&, const literal&)>;

struct field {
  config_key key;
  setter set;
  /// The key this one replaces when a later layer sets it: DMLC_NODE_HOST and DMLC_INTERFACE
  /// name one address two ways, as do job.token and job.token_file.
  std::string_view replaces;
  /// The member of `replaces`, reset to its default when this key replaces it.
  std::string cluster_config::*replaced = nullptr;
  /// A secret (the job token): messages never show its value.
  bool secret = false;
};

template <class T>
void assign(T& target, std::int64_t value) {
  target = static_cast<T>(value);
}
template <class T>
void assign(std::optional<T>& target, std::int64_t value) {
  target = static_cast<T>(value);
}

template <class M>
setter integer_setter(M cluster_config::*member, std::int64_t min, std::int64_t max,
                      std::string expectation) {
  return [=](cluster_config& cfg, const literal& value) -> std::optional<std::string> {
    auto parsed = integer_of(value);
    if (!parsed || *parsed < min || *parsed > max)
      return expectation;
    assign(cfg.*member, *parsed);
    return std::nullopt;
  };
}

setter bytes_setter(std::int64_t cluster_config::*member, std::int64_t min) {
  return [=](cluster_config& cfg, const literal& value) -> std::optional<std::string> {
    std::optional<std::int64_t> parsed =
        value.kind == literal::form::toml_integer ? std::optional{value.integer} : std::nullopt;
    if (auto text = string_of(value))
      parsed = parse_bytes(*text);
    if (!parsed || *parsed < min)
      return "a size in bytes of at least " + std::to_string(min) +
             " (an integer, or a string such as \"16MiB\")";
    cfg.*member = *parsed;
    return std::nullopt;
  };
}

/// data.chunk_bytes: a size as bytes_setter reads it, which wire::chunker must also accept
/// (wire::valid_chunk_bytes), so that a size the chunker refuses is refused here and not at the
/// first tensor that needs chunking.
setter chunk_bytes_setter(std::int64_t min) {
  return [min, size = bytes_setter(&cluster_config::chunk_bytes, min)](
             cluster_config& cfg, const literal& value) -> std::optional<std::string> {
    const std::int64_t before = cfg.chunk_bytes;
    if (auto expected = size(cfg, value))
      return expected;
    if (!wire::valid_chunk_bytes(static_cast<std::size_t>(cfg.chunk_bytes))) {
      cfg.chunk_bytes = before;
      return "a size in bytes that wire::chunker accepts: a multiple of 8 from " +
             std::to_string(min) + " to " + std::to_string(wire::max_chunk_bytes);
    }
    return std::nullopt;
  };
}

/// `zero_turns_off`: "0s" (any zero duration) is allowed and means never.
setter duration_setter(std::chrono::milliseconds cluster_config::*member,
                       bool zero_turns_off = false) {
  return [=](cluster_config& cfg, const literal& value) -> std::optional<std::string> {
    auto text = string_of(value);
    auto parsed =
        text ? parse_duration(*text)
             : result<std::chrono::milliseconds>{error{errc::invalid_argument, "not a string"}};
    if (!parsed || parsed->count() < 0 || (parsed->count() == 0 && !zero_turns_off))
      return zero_turns_off ? "a duration such as \"30s\" or \"10m\", or \"0s\" for never"
                            : "a positive duration such as \"500ms\", \"5s\" or \"2m\"";
    cfg.*member = *parsed;
    return std::nullopt;
  };
}

/// A string checked by `valid`, stored as given.
setter string_setter(std::string cluster_config::*member, bool (*valid)(std::string_view),
                     std::string expectation) {
  return [=](cluster_config& cfg, const literal& value) -> std::optional<std::string> {
    auto text = string_of(value);
    if (!text || !valid(*text))
      return expectation;
    cfg.*member = *text;
    return std::nullopt;
  };
}

bool valid_host(std::string_view text) {
  return !text.empty() && text.size() <= 253 && !has_space(text);
}
bool valid_interface(std::string_view text) {
  return !text.empty() && text.size() < IFNAMSIZ && !has_space(text) &&
         text.find('/') == std::string_view::npos;
}
bool valid_device_name(std::string_view text) {
  return !text.empty() && text.size() <= 32 && !has_space(text);
}
bool valid_job_id(std::string_view text) {
  return !text.empty() && text.size() <= 64 &&
         std::all_of(text.begin(), text.end(), [](unsigned char c) {
           return std::isalnum(c) || c == '.' || c == '_' || c == '-';
         });
}
bool valid_token(std::string_view text) {
  return text.find('\n') == std::string_view::npos && text.find('\0') == std::string_view::npos;
}
bool valid_path(std::string_view text) {
  return !text.empty() && text.find('\0') == std::string_view::npos;
}

setter bool_setter(bool cluster_config::*member) {
  return [=](cluster_config& cfg, const literal& value) -> std::optional<std::string> {
    const std::string& text = value.text;
    const bool toml_bool = value.kind == literal::form::toml_other;
    const bool env_text = value.kind == literal::form::text;
    if ((toml_bool || env_text) && text == "true")
      cfg.*member = true;
    else if ((toml_bool || env_text) && text == "false")
      cfg.*member = false;
    else if (env_text && text == "1")
      cfg.*member = true;
    else if (env_text && text == "0")
      cfg.*member = false;
    else
      return "true or false";
    return std::nullopt;
  };
}

setter role_setter() {
  return [](cluster_config& cfg, const literal& value) -> std::optional<std::string> {
    auto text = string_of(value);
    auto role = text ? parse_role(*text) : std::nullopt;
    if (!role)
      return "one of \"scheduler\", \"server\", \"worker\"";
    cfg.role = role;
    return std::nullopt;
  };
}

constexpr std::int64_t max_nodes = 100'000;

constexpr const char* positive = "a positive integer";
constexpr const char* port = "a port number from 0 to 65535";

/// The keys of [job], in the order of docs/cluster.sample.toml.
void add_job_fields(std::vector<field>& t) {
  t.push_back({{"job", "role", "DMLC_ROLE", "--role", "ROLE", "",
                "This node's role: scheduler, server or worker. Unset, a program that creates "
                "a dist_* KVStore is a worker."},
               role_setter(),
               {}});
  t.push_back({{"job", "num_workers", "DMLC_NUM_WORKER", "--num-workers", "N", "",
                "Number of workers, the size of a sync round. Required for a job."},
               integer_setter(&cluster_config::num_workers, 1, max_nodes, positive),
               {}});
  t.push_back({{"job", "max_workers", "TROUPE_MAX_WORKERS", "--max-workers", "N", "",
                "Most workers the job may have while it runs: workers beyond num_workers join "
                "the running job (each with a fresh rank below max_workers), and servers keep "
                "room for them. Unset: num_workers (no worker joins)."},
               integer_setter(&cluster_config::max_workers, 1, max_nodes, positive),
               {}});
  t.push_back(
      {{"job", "join_at_barrier", "TROUPE_JOIN_AT_BARRIER", "--join-at-barrier", "BOOL", "false",
        "A worker that joins the running job waits at the workers' next barrier and is "
        "counted from the round after it (for programs that cut their data per epoch at "
        "a barrier). False: it counts from the next round each key has not begun."},
       bool_setter(&cluster_config::join_at_barrier),
       {}});
  t.push_back({{"job", "num_servers", "DMLC_NUM_SERVER", "--num-servers", "N", "",
                "Number of server processes, each owning a key range. Required for a job."},
               integer_setter(&cluster_config::num_servers, 1, max_nodes, positive),
               {}});
  t.push_back({{"job", "max_servers", "TROUPE_MAX_SERVERS", "--max-servers", "N", "",
                "The key ranges keys are placed over: MXNet's rule over N ranges, each held "
                "whole by one server (range r by server r mod num_servers). Unset: num_servers "
                "(MXNet's placement exactly)."},
               integer_setter(&cluster_config::max_servers, 1, max_nodes, positive),
               {}});
  t.push_back({{"job", "id", "TROUPE_JOB_ID", "--job-id", "ID", "\"troupe\"",
                "Name of the job; the scheduler refuses nodes of another job."},
               string_setter(&cluster_config::job_id, valid_job_id,
                             "a job id of 1 to 64 letters, digits, '.', '_' or '-'"),
               {}});
  t.push_back({{"job", "token", "TROUPE_JOB_TOKEN", "", "TOKEN", "\"\"",
                "Shared secret every node presents when it registers; empty: none. No flag: "
                "a flag would show in `ps`; in a cluster file, only a file that group and others "
                "cannot read (mode 600)."},
               string_setter(&cluster_config::auth_token, valid_token, "a token without newlines"),
               "job.token_file",
               &cluster_config::auth_token_file,
               true});
  t.push_back({{"job", "token_file", "", "--token-file", "FILE", "",
                "File whose contents (without the trailing newline) are the token; replaces "
                "job.token. Group and others must not read or write it (chmod 600)."},
               string_setter(&cluster_config::auth_token_file, valid_path, "a file path"),
               "job.token",
               &cluster_config::auth_token});
  t.push_back({{"job", "insecure", "TROUPE_INSECURE", "--insecure", "BOOL", "false",
                "Let a scheduler or server listen on an address other than loopback without a "
                "job token: any host that reaches it can join the job and read its data."},
               bool_setter(&cluster_config::insecure),
               {}});
}

/// The keys of [scheduler], in the order of docs/cluster.sample.toml.
void add_scheduler_fields(std::vector<field>& t) {
  t.push_back(
      {{"scheduler", "host", "DMLC_PS_ROOT_URI", "--scheduler-host", "HOST", "\"127.0.0.1\"",
        "Address of the scheduler."},
       string_setter(&cluster_config::scheduler_host, valid_host, "a host name or IP address"),
       {}});
  t.push_back({{"scheduler", "port", "DMLC_PS_ROOT_PORT", "--scheduler-port", "PORT", "",
                "Port of the scheduler. Required for a job; 0 lets a scheduler pick a free "
                "port (for tests that discover it)."},
               integer_setter(&cluster_config::scheduler_port, 0, 65535, port),
               {}});
}

/// The keys of [node], in the order of docs/cluster.sample.toml.
void add_node_fields(std::vector<field>& t) {
  t.push_back({{"node", "host", "DMLC_NODE_HOST", "--host", "HOST", "",
                "Address peers use to reach this node; beats node.interface. The scheduler "
                "is reached at scheduler.host instead."},
               string_setter(&cluster_config::node_host, valid_host, "a host name or IP address"),
               "node.interface",
               &cluster_config::node_interface});
  t.push_back({{"node", "interface", "DMLC_INTERFACE", "--interface", "NAME", "",
                "Network interface whose IPv4 address is this node's address (ignored by "
                "the scheduler, as in ps-lite)."},
               string_setter(&cluster_config::node_interface, valid_interface,
                             "an interface name such as \"eth0\""),
               "node.host",
               &cluster_config::node_host});
  t.push_back(
      {{"node", "bind", "", "--bind", "ADDRESS", "\"127.0.0.1\"",
        "Address every listener binds. Unset: this node's address when the "
        "configuration names one, else 127.0.0.1."},
       string_setter(&cluster_config::bind_address, valid_host, "a host name or IP address"),
       {}});
  t.push_back({{"node", "port", "PORT", "--port", "PORT", "0",
                "Port of this node's data listener; 0: a free port."},
               integer_setter(&cluster_config::data_port, 0, 65535, port),
               {}});
  t.push_back(
      {{"node", "rank_hint", "TROUPE_RANK_HINT", "--rank-hint", "RANK", "-1",
        "Rank to ask the scheduler for (troupe-launch numbers its nodes); granted when "
        "free, else the next free one; -1: none."},
       integer_setter(&cluster_config::rank_hint, -1, max_nodes - 1, "a rank >= 0, or -1 for none"),
       {}});
  t.push_back(
      {{"node", "shards", "", "--shards", "N", "",
        "Server shards per server process. Default: the hardware threads."},
       integer_setter(&cluster_config::shards_per_server, 1, 4096, "an integer from 1 to 4096"),
       {}});
  t.push_back(
      {{"node", "server_device", "", "--server-device", "CONTEXT", "\"cpu(0)\"",
        "Servers: the device that keeps each key's value and runs its update when the optimizer "
        "is on the servers, e.g. gpu(0); the host keeps a copy to answer pulls from."},
       string_setter(&cluster_config::server_device, valid_device_name,
                     "a device such as \"cpu(0)\" or \"gpu(0)\""),
       {}});
  t.push_back({{"node", "verbose", "PS_VERBOSE", "--verbose", "LEVEL", "0",
                "Logging: 0 quiet, 1 connections, 2 every message."},
               integer_setter(&cluster_config::verbose, 0, 2, "0, 1 or 2"),
               {}});
}

/// The keys of [timeouts], in the order of docs/cluster.sample.toml.
void add_timeouts_fields(std::vector<field>& t) {
  t.push_back({{"timeouts", "request", "", "--timeout", "DURATION", "\"30s\"",
                "How long a request waits for its answer, from when it was sent (a dist_sync "
                "request waits for the slowest worker)."},
               duration_setter(&cluster_config::request_timeout),
               {}});
  t.push_back({{"timeouts", "peer", "", "--peer-timeout", "DURATION", "\"5s\"",
                "A node silent this long (heartbeats included) is lost."},
               duration_setter(&cluster_config::peer_timeout),
               {}});
  t.push_back({{"timeouts", "heartbeat", "", "--heartbeat", "DURATION", "\"500ms\"",
                "Interval of heartbeats between nodes and the scheduler; shorter than "
                "timeouts.peer."},
               duration_setter(&cluster_config::heartbeat_interval),
               {}});
  t.push_back({{"timeouts", "connect", "", "--connect-timeout", "DURATION", "\"10s\"",
                "How long a node keeps retrying, with backoff, a peer that refuses to connect."},
               duration_setter(&cluster_config::connect_timeout),
               {}});
  t.push_back({{"timeouts", "startup", "", "--startup-timeout", "DURATION", "\"60s\"",
                "How long the job waits for all nodes to register."},
               duration_setter(&cluster_config::startup_timeout),
               {}});
  t.push_back({{"timeouts", "stalled_frame", "", "--stalled-frame-timeout", "DURATION", "\"30s\"",
                "A listener closes a connection whose peer began a frame and sent nothing more "
                "for this long; silence between frames is fine. A server also drops an init "
                "that misses bytes and got none for this long. \"0s\": never."},
               duration_setter(&cluster_config::stalled_frame_timeout, true),
               {}});
  t.push_back({{"timeouts", "frame_grace", "", "--frame-grace", "DURATION", "\"10s\"",
                "How long a frame may take before data.min_frame_rate applies to it; longer "
                "than timeouts.peer, since a sender silent for longer is lost anyway."},
               duration_setter(&cluster_config::frame_grace, true),
               {}});
  t.push_back({{"timeouts", "server_rejoin", "", "--server-rejoin", "DURATION", "\"0s\"",
                "How long the job waits for a lost server to come back from its checkpoint "
                "(troupe-node --recover) before it fails; workers hold their calls meanwhile. "
                "\"0s\": a lost server fails the job."},
               duration_setter(&cluster_config::server_rejoin, true),
               {}});
}

/// The keys of [data], in the order of docs/cluster.sample.toml.
void add_data_fields(std::vector<field>& t) {
  t.push_back({{"data", "bigarray_bound", "MXNET_KVSTORE_BIGARRAY_BOUND", "--bigarray-bound", "N",
                "1000000",
                "Arrays of at least this many elements are split over all "
                "servers."},
               integer_setter(&cluster_config::bigarray_bound, 1,
                              std::numeric_limits<std::int64_t>::max(), positive),
               {}});
  t.push_back({{"data", "max_frame_bytes", "", "--max-frame-bytes", "BYTES", "\"256MiB\"",
                "Largest frame accepted from the network."},
               bytes_setter(&cluster_config::max_frame_bytes, 4096),
               {}});
  t.push_back({{"data", "chunk_bytes", "", "--chunk-bytes", "BYTES", "\"1MiB\"",
                "Size of the chunks big tensors travel in: a multiple of 8, at most "
                "data.max_frame_bytes."},
               chunk_bytes_setter(4096),
               {}});
  t.push_back({{"data", "slice_bytes", "", "--slice-bytes", "BYTES", "\"512KiB\"",
                "Keys larger than this are cut into slices of at most this size, each summed, "
                "updated and pulled on its own, so that a key's first slices come back while its "
                "last ones are still pushed. Every worker of a job must use the same value. 0: "
                "keys are not cut (MXNet's placement)."},
               bytes_setter(&cluster_config::slice_bytes, 0),
               {}});
  t.push_back({{"data", "send_window_bytes", "", "--send-window-bytes", "BYTES", "\"4MiB\"",
                "Bytes of tensor a worker hands each server's link at a time; the rest waits in "
                "its send queue, where a request of higher priority overtakes the chunks of "
                "lower ones. 0: no bound."},
               bytes_setter(&cluster_config::send_window_bytes, 0),
               {}});
  t.push_back(
      {{"data", "slice_credit", "", "--slice-credit", "N", "4",
        "dist_sync with several workers: a worker sends a push of a key's slice to a server "
        "only while fewer than N pushes of that key's slices on that server wait for their "
        "answer (the value once the round closed), so that no worker runs ahead of the "
        "slowest one and the servers answer while the workers upload. 0: no bound."},
       integer_setter(&cluster_config::slice_credit, 0, 1'000'000, "an integer from 0 to 1000000"),
       {}});
  t.push_back({{"data", "shm_arena_bytes", "", "--shm-arena-bytes", "BYTES", "\"64MiB\"",
                "Shared-memory arena per direction of a data connection between processes on "
                "one host: tensors of 64 KiB and more skip the socket. 0 turns it off."},
               bytes_setter(&cluster_config::shm_arena_bytes, 0),
               {}});
  t.push_back({{"data", "io_spin_us", "", "--io-spin-us", "MICROSECONDS", "0",
                "After each frame it receives, a node's network thread polls its sockets for "
                "this long before it sleeps, so that the next frame of a small round trip is "
                "found without a wake-up; it gives its core to any other ready thread between "
                "polls. 50 cuts a 4 KiB round trip by a third on idle cores, but where other "
                "threads compute on the node's cores a burst of small requests ran 5-8x slower. "
                "0: it sleeps at once."},
               integer_setter(&cluster_config::io_spin_us, 0, 10'000, "an integer from 0 to 10000"),
               {}});
  t.push_back({{"data", "fuse_item_bytes", "", "--fuse-item-bytes", "BYTES", "\"16KiB\"",
                "Requests whose tensor holds at most this many bytes (a worker's push, pull and "
                "pushpull, a server's answers) travel fused with others ready at the same time, "
                "in one frame: see data.fuse_frame_bytes."},
               bytes_setter(&cluster_config::fuse_item_bytes, 0),
               {}});
  t.push_back({{"data", "fuse_frame_bytes", "", "--fuse-frame-bytes", "BYTES", "\"256KiB\"",
                "Most bytes of tensor in one fused frame. Small requests to one server that are "
                "ready together (the keys of one call, what waits for the send window, a server's "
                "answers to one read) leave in one frame; none waits to be fused. 0: every "
                "request in a frame of its own."},
               bytes_setter(&cluster_config::fuse_frame_bytes, 0),
               {}});
  t.push_back({{"data", "link_window_bytes", "", "--link-window-bytes", "BYTES", "\"64MiB\"",
                "Receive window of every connection: bytes of frames a peer may have in flight "
                "before the receiver releases some."},
               bytes_setter(&cluster_config::link_window_bytes, 65536),
               {}});
  t.push_back({{"data", "receive_budget_bytes", "", "--receive-budget-bytes", "BYTES", "\"1GiB\"",
                "Bytes of received frames a listener holds unreleased over all its connections; a "
                "frame beyond it waits. At least data.max_frame_bytes."},
               bytes_setter(&cluster_config::receive_budget_bytes, 4096),
               {}});
  t.push_back({{"data", "min_frame_rate", "", "--min-frame-rate", "BYTES", "\"64KiB\"",
                "Bytes per second a frame must arrive at once it is older than "
                "timeouts.frame_grace (time this node holds it up does not count); a listener "
                "closes a slower peer. 64 KiB/s is 0.5 Mbit/s, below any link a job trains over. "
                "0: no rate rule."},
               bytes_setter(&cluster_config::min_frame_rate, 0),
               {}});
  t.push_back({{"data", "max_send_queue_bytes", "", "--max-send-queue-bytes", "BYTES", "\"256MiB\"",
                "Bytes of replies a listener queues for one peer; a peer that does not read them "
                "is disconnected beyond it. At least data.max_frame_bytes."},
               bytes_setter(&cluster_config::max_send_queue_bytes, 4096),
               {}});
  t.push_back({{"data", "max_store_bytes", "", "--max-store-bytes", "BYTES", "0",
                "Servers: declared bytes of key values a server takes (all its shards, inits "
                "under way included); an init beyond it is refused. 0: half of the machine's "
                "memory."},
               bytes_setter(&cluster_config::max_store_bytes, 0),
               {}});
  t.push_back({{"data", "max_value_bytes", "", "--max-value-bytes", "BYTES", "\"4GiB\"",
                "Servers: the largest value one key may declare at its init; a larger one is "
                "refused."},
               bytes_setter(&cluster_config::max_value_bytes, 1),
               {}});
}

/// The keys of [sync], in the order of docs/cluster.sample.toml.
void add_sync_fields(std::vector<field>& t) {
  t.push_back({{"sync", "quorum", "TROUPE_QUORUM", "--quorum", "K", "",
                "dist_sync: a round closes when K workers have pushed all of it; every mode: "
                "the job goes on while K workers live. Default: the number of workers."},
               integer_setter(&cluster_config::quorum, 1, max_nodes, positive),
               {}});
  t.push_back({{"sync", "rescale_quorum", "TROUPE_RESCALE_QUORUM", "--rescale-quorum", "BOOL",
                "false", "Scale a quorum round's sum by num_workers / quorum."},
               bool_setter(&cluster_config::rescale_quorum),
               {}});
  t.push_back(
      {{"sync", "max_staleness", "TROUPE_MAX_STALENESS", "--max-staleness", "S", "",
        "dist_async: a pull for round t waits until every live worker pushed round "
        "t - S. Default: none."},
       integer_setter(&cluster_config::max_staleness, 0, 1'000'000, "an integer from 0 to 1000000"),
       {}});
  t.push_back({{"sync", "max_rounds_ahead", "TROUPE_MAX_ROUNDS_AHEAD", "--max-rounds-ahead", "N",
                "2", "Rounds beyond the current one a server accepts pushes for from a worker."},
               integer_setter(&cluster_config::max_rounds_ahead, 1, 1'000'000, positive),
               {}});
}

/// The keys of [checkpoint], in the order of docs/cluster.sample.toml.
void add_checkpoint_fields(std::vector<field>& t) {
  t.push_back({{"checkpoint", "dir", "TROUPE_CHECKPOINT_DIR", "--checkpoint-dir", "DIR", "",
                "Servers: the directory of their checkpoints and of the files "
                "save_optimizer_states writes (created, mode 700, when missing); a server writes "
                "nowhere else. Unset: servers write no files."},
               string_setter(&cluster_config::checkpoint_dir, valid_path, "a directory path"),
               {}});
  t.push_back({{"checkpoint", "every_rounds", "", "--checkpoint-every-rounds", "K", "0",
                "Servers: each shard writes a checkpoint when all its keys have completed K more "
                "rounds (dist_async: K more pushes applied per key); 0: not by rounds."},
               integer_setter(&cluster_config::checkpoint_every_rounds, 0, 1'000'000'000,
                              "an integer from 0 to 1000000000"),
               {}});
  t.push_back({{"checkpoint", "every", "", "--checkpoint-every", "DURATION", "\"0s\"",
                "Servers: each shard writes a checkpoint when this long has passed since its "
                "last one and a key has changed; \"0s\": not by time."},
               duration_setter(&cluster_config::checkpoint_every, true),
               {}});
  t.push_back({{"checkpoint", "recover", "TROUPE_RECOVER", "--recover", "BOOL", "false",
                "Servers: start from this server's last checkpoint in checkpoint.dir (the rank "
                "node.rank_hint names) and take the place of the lost server of that rank."},
               bool_setter(&cluster_config::checkpoint_recover),
               {}});
}

/// The keys of [tls], in the order of docs/cluster.sample.toml.
void add_tls_fields(std::vector<field>& t) {
  t.push_back({{"tls", "enabled", "TROUPE_TLS", "--tls", "BOOL", "false",
                "Every connection, control and data, runs TLS 1.3 with certificates from "
                "tls.ca_file's CA at both ends, each naming its node's role."},
               bool_setter(&cluster_config::tls_enabled),
               {}});
  t.push_back({{"tls", "ca_file", "TROUPE_TLS_CA", "--tls-ca", "FILE", "",
                "The job's CA certificate (PEM): peers must present a certificate it signed."},
               string_setter(&cluster_config::tls_ca_file, valid_path, "a file path"),
               {}});
  t.push_back({{"tls", "cert_file", "TROUPE_TLS_CERT", "--tls-cert", "FILE", "",
                "This node's certificate (PEM), naming its role (scripts/make-tls-certs.sh); "
                "{role} in the path stands for the node's role."},
               string_setter(&cluster_config::tls_cert_file, valid_path, "a file path"),
               {}});
  t.push_back({{"tls", "key_file", "TROUPE_TLS_KEY", "--tls-key", "FILE", "",
                "The private key of tls.cert_file (PEM); group and others must not read or write "
                "it (chmod 600). {role} stands for the node's role."},
               string_setter(&cluster_config::tls_key_file, valid_path, "a file path"),
               {}});
  t.push_back({{"tls", "allow_shared_memory", "", "--tls-allow-shared-memory", "BOOL", "false",
                "Under TLS, let same-host peers still move tensors through shared-memory arenas "
                "(any process of the same user can read them); off, they go through TLS."},
               bool_setter(&cluster_config::tls_allow_shared_memory),
               {}});
}

/// The keys of [observe], in the order of docs/cluster.sample.toml.
void add_observe_fields(std::vector<field>& t) {
  t.push_back({{"observe", "trace", "TROUPE_TRACE", "--trace", "FILE", "",
                "Servers and workers record every key's push, merge, update and pull as Chrome "
                "trace spans and write them to FILE.<role>-<rank> at the end of the job "
                "(troupe-launch --trace FILE merges them into FILE). Unset: no trace."},
               string_setter(&cluster_config::trace_file, valid_path, "a file path"),
               {}});
  t.push_back({{"observe", "summary", "TROUPE_SUMMARY", "--summary", "BOOL", "false",
                "Servers and workers print their traffic summary at the end of the job (servers "
                "also on SIGUSR1), whatever node.verbose says."},
               bool_setter(&cluster_config::summary),
               {}});
}

/// Every key, in the order of docs/cluster.sample.toml. Immutable after first use.
const std::vector<field>& fields() {
  static const std::vector<field> table = [] {
    std::vector<field> t;
    add_job_fields(t);
    add_scheduler_fields(t);
    add_node_fields(t);
    add_timeouts_fields(t);
    add_data_fields(t);
    add_sync_fields(t);
    add_checkpoint_fields(t);
    add_tls_fields(t);
    add_observe_fields(t);
    return t;
  }();
  return table;
}

std::string dotted(const config_key& key) {
  return std::string(key.section) + '.' + std::string(key.name);
}

const field* find_field(std::string_view section, std::string_view name) {
  for (const auto& f : fields())
    if (f.key.section == section && f.key.name == name)
      return &f;
  return nullptr;
}

const field* find_field(std::string_view dotted_key) {
  auto dot = dotted_key.find('.');
  if (dot == std::string_view::npos)
    return nullptr;
  return find_field(dotted_key.substr(0, dot), dotted_key.substr(dot + 1));
}

std::string section_list() {
  std::string out;
  for (const auto& f : fields()) {
    std::string section = "[" + std::string(f.key.section) + "]";
    if (out.find(section) == std::string::npos)
      out += (out.empty() ? "" : ", ") + section;
  }
  return out;
}

// --- layering ----------------------------------------------------------------------------------

enum class layer : std::uint8_t { file = 1, env = 2, flags = 3 };

/// Where a value came from, for messages: "cluster.toml:7:15: job.num_workers",
/// "DMLC_NUM_WORKER", "--num-workers".
struct origin {
  std::string where;   ///< "file:line:column", or empty for env and flags
  std::string subject; ///< the key, variable or flag
  layer from = layer::file;

  std::string prefix() const { return where.empty() ? subject : where + ": " + subject; }
};

/// The config being built, with the origin of every value a layer set.
struct builder {
  cluster_config cfg;
  std::map<std::string, origin, std::less<>> origins;

  status apply(const field& f, const literal& value, origin from) {
    if (auto expected = f.set(cfg, value))
      return error{errc::invalid_argument,
                   from.prefix() + " must be " + *expected + ", got " +
                       (f.secret ? describe_secret(value) : describe(value))};
    if (!f.replaces.empty()) {
      // A later layer naming the address (or token) one way drops what an earlier layer said
      // the other way; within one layer, resolve() decides.
      auto other = origins.find(f.replaces);
      if (other != origins.end() && other->second.from < from.from) {
        cfg.*f.replaced = cluster_config{}.*f.replaced;
        origins.erase(other);
      }
    }
    origins[dotted(f.key)] = std::move(from);
    return ok();
  }

  const origin* origin_of(std::string_view key) const {
    auto found = origins.find(key);
    return found == origins.end() ? nullptr : &found->second;
  }
};

std::string position(const std::string& file, const toml::source_position& at) {
  return file + ":" + std::to_string(at.line) + ":" + std::to_string(at.column);
}

literal literal_of(const toml::node& node) {
  if (auto s = node.as_string())
    return {literal::form::toml_string, s->get(), 0};
  if (auto i = node.as_integer())
    return {literal::form::toml_integer, {}, i->get()};
  if (node.is_array())
    return {literal::form::toml_other, "an array", 0};
  if (node.is_table())
    return {literal::form::toml_other, "a table", 0};
  std::ostringstream text;
  node.visit([&](const auto& value) { text << value; });
  return {literal::form::toml_other, text.str(), 0};
}

/// A file's contents and its permission bits, read through one descriptor (so the mode is that
/// of the file read).
struct file_contents {
  std::string text;
  mode_t mode = 0; ///< permission bits, & 07777
};

/// Reads the file at `path` whole; errc::io_error "cannot read <what> <path>: <why>" when it
/// cannot (a directory is "not a regular file"), errc::invalid_argument when it holds more than
/// max_setup_file_bytes (checked on its size and again while reading, so /dev/zero or a file that
/// grows ends too).
result<file_contents> read_whole_file(const std::string& path, const std::string& what) {
  const std::string cannot = "cannot read " + what + " " + path + ": ";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return error{errc::io_error, cannot + std::strerror(errno)};
  std::unique_ptr<int, void (*)(int*)> guard{&fd, [](int* open) { ::close(*open); }};
  struct stat info {};
  if (::fstat(fd, &info) != 0)
    return error{errc::io_error, cannot + std::strerror(errno)};
  if (S_ISDIR(info.st_mode))
    return error{errc::io_error, cannot + "not a regular file"};
  const auto too_large = [&] {
    return error{errc::invalid_argument, what + " " + path + " holds more than " +
                                             std::to_string(max_setup_file_bytes >> 20) +
                                             " MiB, more than any " + what + " needs"};
  };
  if (info.st_size > static_cast<off_t>(max_setup_file_bytes))
    return too_large();
  file_contents out;
  out.mode = info.st_mode & 07777;
  char buffer[4096];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return error{errc::io_error, cannot + std::strerror(errno)};
    if (n == 0)
      return out;
    if (out.text.size() + static_cast<std::size_t>(n) > max_setup_file_bytes)
      return too_large();
    out.text.append(buffer, static_cast<std::size_t>(n));
  }
}

/// Whether group or others may read or write a file with permission bits `mode`.
bool open_to_others(mode_t mode) {
  return (mode & 077) != 0;
}

/// Permission bits as chmod writes them: "0644".
std::string octal_mode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

/// The key that line `number` (from 1) of TOML `text` sets, as "section.key" (or "key" before
/// any table), when the line is a plain `key = ...`: what a parse error on that line (a number
/// too big for 64 bits, an unterminated string) is about.
std::optional<std::string> key_on_line(std::string_view text, std::size_t number) {
  auto is_key_char = [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '-'; };
  auto trimmed = [](std::string_view line) {
    const auto first = line.find_first_not_of(" \t");
    return first == std::string_view::npos ? std::string_view{} : line.substr(first);
  };
  std::string section;
  std::size_t start = 0;
  for (std::size_t line_number = 1; start <= text.size(); ++line_number) {
    const auto end = std::min(text.find('\n', start), text.size());
    const std::string_view line = trimmed(text.substr(start, end - start));
    start = end + 1;
    if (line_number < number) {
      if (line.starts_with('[') && !line.starts_with("[[") &&
          line.find(']') != std::string_view::npos)
        section = trimmed(line.substr(1, line.find(']') - 1));
      continue;
    }
    const auto key_end = std::find_if_not(line.begin(), line.end(), is_key_char) - line.begin();
    const std::string_view key = line.substr(0, static_cast<std::size_t>(key_end));
    if (key.empty() || !trimmed(line.substr(key.size())).starts_with('='))
      return std::nullopt;
    while (!section.empty() && (section.back() == ' ' || section.back() == '\t'))
      section.pop_back();
    return section.empty() ? std::string(key) : section + "." + std::string(key);
  }
  return std::nullopt;
}

/// Applies the cluster file at `path`. `named_by` is what named the file ("--config",
/// "TROUPE_CONFIG"; empty: the caller), so that an unreadable file says where its path came from.
status apply_file(builder& b, const std::filesystem::path& path, std::string_view named_by) {
  const std::string name = path.string();
  auto file = read_whole_file(name, "config file");
  if (!file)
    return named_by.empty()
               ? file.error()
               : error{file.error().code(), std::string(named_by) + ": " + file.error().message()};
  toml::table root;
  try {
    root = toml::parse(file->text, name);
  } catch (const toml::parse_error& err) {
    // One line, whatever the parser says, naming the key of the line when it is a plain one.
    std::string description{err.description()};
    std::replace(description.begin(), description.end(), '\n', ' ');
    std::string where = position(name, err.source().begin);
    if (auto key = key_on_line(file->text, err.source().begin.line))
      where += ": " + *key;
    return error{errc::corrupt_data, where + ": " + description};
  }
  for (auto&& [section_key, section_node] : root) {
    const std::string section{section_key.str()};
    auto* section_table = section_node.as_table();
    bool known = false;
    for (const auto& f : fields())
      known = known || f.key.section == section;
    if (!known || !section_table) {
      std::string msg = position(name, section_key.source().begin) + ": ";
      if (known)
        msg += "[" + section + "] must be a table";
      else if (!section_table) {
        msg += "unknown key '" + section + "' outside any section";
        for (const auto& f : fields())
          if (f.key.name == section) {
            msg += " (it belongs in [" + std::string(f.key.section) + "])";
            break;
          }
      } else {
        msg += "unknown section [" + section + "] (sections: " + section_list() + ")";
      }
      return error{errc::invalid_argument, msg};
    }
    for (auto&& [key, node] : *section_table) {
      const field* f = find_field(section, key.str());
      if (!f)
        return error{errc::invalid_argument, position(name, key.source().begin) +
                                                 ": unknown key '" + std::string(key.str()) +
                                                 "' in [" + section + "]"};
      const literal value = literal_of(node);
      if (f->secret && value.kind == literal::form::toml_string && !value.text.empty() &&
          open_to_others(file->mode))
        return error{errc::invalid_argument,
                     position(name, node.source().begin) + ": " + dotted(f->key) +
                         " is set in a config file that group or others may read or write (mode " +
                         octal_mode(file->mode) +
                         "): put the token in a private file named by job.token_file (chmod 600) "
                         "or in TROUPE_JOB_TOKEN, or chmod 600 " +
                         name};
      auto applied =
          b.apply(*f, value, {position(name, node.source().begin), dotted(f->key), layer::file});
      if (!applied)
        return applied;
    }
  }
  return ok();
}

/// The environment, read once: the configuration file it names and every variable of a key.
struct environment_values {
  std::optional<std::filesystem::path> config_file;
  std::vector<std::pair<const field*, std::string>> values;
};

/// The one place troupe reads environment variables. An empty variable counts as unset, as
/// launch scripts often export empty ones.
environment_values read_environment(const env_lookup& env) {
  environment_values out;
  auto get = [&](std::string_view name) -> std::optional<std::string> {
    auto value = env(name);
    if (value && value->empty())
      return std::nullopt;
    return value;
  };
  if (auto file = get("TROUPE_CONFIG"))
    out.config_file = *file;
  for (const auto& f : fields())
    if (!f.key.env.empty())
      if (auto value = get(f.key.env))
        out.values.emplace_back(&f, std::move(*value));
  return out;
}

bool is_wildcard(std::string_view address) {
  return address == "0.0.0.0" || address == "::" || address == "[::]";
}

/// "a", "a and b", "a, b and c".
std::string listed(const std::vector<std::string>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i)
    out += (i == 0 ? "" : i + 1 == items.size() ? " and " : ", ") + items[i];
  return out;
}

/// "DMLC_PS_ROOT_PORT ([scheduler] port or --scheduler-port)".
std::string naming(std::string_view dotted_key) {
  const field* f = find_field(dotted_key);
  const auto& k = f->key;
  std::string toml = "[" + std::string(k.section) + "] " + std::string(k.name);
  std::string out = k.env.empty() ? toml : std::string(k.env) + " (" + toml;
  if (!k.flag.empty())
    out += (k.env.empty() ? " (" : " or ") + std::string(k.flag) + ")";
  else if (!k.env.empty())
    out += ")";
  return out;
}

/// Derived values and checks across keys, once every layer is in.
status resolve(builder& b) {
  auto& cfg = b.cfg;
  if (!cfg.auth_token_file.empty()) {
    const origin* file_origin = b.origin_of("job.token_file");
    if (const origin* token_origin = b.origin_of("job.token"))
      return error{errc::invalid_argument, token_origin->prefix() + " and " +
                                               file_origin->prefix() +
                                               " both set the token; keep one"};
    // Only the token's owner may read it: a token others can read lets them join the job.
    auto file = read_private_file(cfg.auth_token_file, "token file");
    if (!file)
      return error{file.error().code(), file_origin->prefix() + ": " + file.error().message()};
    std::string token = std::move(*file);
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r'))
      token.pop_back();
    if (token.empty() || !valid_token(token))
      return error{errc::invalid_argument, file_origin->prefix() + ": token file " +
                                               cfg.auth_token_file +
                                               " must hold one non-empty line"};
    cfg.auth_token = std::move(token);
  }

  const bool scheduler = cfg.role == node_role::scheduler;
  if (scheduler) {
    // ps-lite: the scheduler is reached at DMLC_PS_ROOT_URI and ignores DMLC_INTERFACE.
    cfg.node_host = cfg.scheduler_host;
    if (!b.origin_of("node.bind") && b.origin_of("scheduler.host"))
      cfg.bind_address = cfg.scheduler_host;
  } else {
    if (cfg.node_host.empty() && !cfg.node_interface.empty()) {
      auto address = interface_ipv4(cfg.node_interface);
      if (!address)
        return error{address.error().code(),
                     b.origin_of("node.interface")->prefix() + ": " + address.error().message()};
      cfg.node_host = *address;
    }
    if (!b.origin_of("node.bind") && !cfg.node_host.empty())
      cfg.bind_address = cfg.node_host;
    if (cfg.node_host.empty() && !is_wildcard(cfg.bind_address))
      cfg.node_host = cfg.bind_address;
  }

  // "--heartbeat (5s)", or "timeouts.request (5s, the default)".
  auto named = [&](std::string_view key, const std::string& value) {
    const origin* o = b.origin_of(key);
    return o ? o->prefix() + " (" + value + ")"
             : std::string(key) + " (" + value + ", the default)";
  };
  if (cfg.heartbeat_interval >= cfg.peer_timeout)
    return error{errc::invalid_argument,
                 named("timeouts.heartbeat", format_duration(cfg.heartbeat_interval)) +
                     " must be shorter than " +
                     named("timeouts.peer", format_duration(cfg.peer_timeout))};
  if (cfg.quorum && cfg.num_workers && *cfg.quorum > *cfg.num_workers)
    return error{errc::invalid_argument,
                 named("sync.quorum", std::to_string(*cfg.quorum)) + " must not exceed " +
                     named("job.num_workers", std::to_string(*cfg.num_workers))};
  if (cfg.max_workers && cfg.num_workers && *cfg.max_workers < *cfg.num_workers)
    return error{errc::invalid_argument,
                 named("job.max_workers", std::to_string(*cfg.max_workers)) +
                     " must not be below " +
                     named("job.num_workers", std::to_string(*cfg.num_workers))};
  if (cfg.max_servers && cfg.num_servers && *cfg.max_servers < *cfg.num_servers)
    return error{errc::invalid_argument,
                 named("job.max_servers", std::to_string(*cfg.max_servers)) +
                     " must not be below " +
                     named("job.num_servers", std::to_string(*cfg.num_servers))};
  if (cfg.chunk_bytes > cfg.max_frame_bytes)
    return error{errc::invalid_argument,
                 named("data.chunk_bytes", std::to_string(cfg.chunk_bytes)) + " must not exceed " +
                     named("data.max_frame_bytes", std::to_string(cfg.max_frame_bytes))};
  // A bound on frames below the frame cap: refused when given, raised to the cap when it is
  // the default (so that a larger data.max_frame_bytes alone does not need them set too).
  for (const auto& [key, bytes] :
       {std::pair{"data.receive_budget_bytes", &cfg.receive_budget_bytes},
        std::pair{"data.max_send_queue_bytes", &cfg.max_send_queue_bytes}}) {
    if (*bytes >= cfg.max_frame_bytes)
      continue;
    if (b.origin_of(key) == nullptr) {
      *bytes = cfg.max_frame_bytes;
      continue;
    }
    return error{errc::invalid_argument,
                 named(key, std::to_string(*bytes)) + " must not be below " +
                     named("data.max_frame_bytes", std::to_string(cfg.max_frame_bytes))};
  }
  if (cfg.tls_enabled) {
    std::vector<std::string> missing;
    for (const auto& [path, key] : {std::pair{&cfg.tls_ca_file, "tls.ca_file"},
                                    std::pair{&cfg.tls_cert_file, "tls.cert_file"},
                                    std::pair{&cfg.tls_key_file, "tls.key_file"}})
      if (path->empty())
        missing.push_back(naming(key));
    if (!missing.empty()) {
      return error{errc::invalid_argument, b.origin_of("tls.enabled")->prefix() +
                                               " turns TLS on, which needs " + listed(missing)};
    }
  }
  return ok();
}

} // namespace

result<std::string> read_file(const std::string& path, std::string_view what) {
  auto file = read_whole_file(path, std::string(what));
  if (!file)
    return file.error();
  return std::move(file->text);
}

result<std::string> read_private_file(const std::string& path, std::string_view what) {
  auto file = read_whole_file(path, std::string(what));
  if (!file)
    return file.error();
  if (open_to_others(file->mode))
    return error{errc::invalid_argument, std::string(what) + " " + path +
                                             " may be read or written by group or others (mode " +
                                             octal_mode(file->mode) + "); run chmod 600 " + path};
  return std::move(file->text);
}

status fill_random(std::span<std::uint8_t> out) {
  std::size_t filled = 0;
  while (filled < out.size()) {
    const ssize_t got = ::getrandom(out.data() + filled, out.size() - filled, 0);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      return error{errc::io_error, std::string("getrandom: ") + std::strerror(errno)};
    filled += static_cast<std::size_t>(got);
  }
  return ok();
}

bool is_loopback(std::string_view address) {
  if (address == "localhost")
    return true;
  std::string text{address};
  if (text.size() > 2 && text.front() == '[' && text.back() == ']')
    text = text.substr(1, text.size() - 2);
  in_addr v4{};
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1)
    return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, text.c_str(), &v6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  return false;
}

std::span<const config_key> config_keys() noexcept {
  static const std::vector<config_key> keys = [] {
    std::vector<config_key> out;
    for (const auto& f : fields())
      out.push_back(f.key);
    return out;
  }();
  return keys;
}

env_lookup process_environment() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (!value)
      return std::nullopt;
    return std::string(value);
  };
}

env_lookup environment_from(std::map<std::string, std::string, std::less<>> variables) {
  return [vars = std::move(variables)](std::string_view name) -> std::optional<std::string> {
    auto found = vars.find(name);
    if (found == vars.end())
      return std::nullopt;
    return found->second;
  };
}

void config_overrides::set(std::string_view key, std::string value) {
  values[std::string(key)] = std::move(value);
}

void add_config_flags(CLI::App& app, config_overrides& out) {
  const std::string group = "Cluster configuration";
  app.add_option_function<std::string>(
         "--config", [&out](const std::string& path) { out.config_file = path; },
         "Cluster config file (TOML; docs/cluster.sample.toml lists every key). Default: "
         "$TROUPE_CONFIG. Later layers win: file < environment < flags.")
      ->type_name("FILE")
      ->group(group);
  for (const auto& f : fields()) {
    const auto& k = f.key;
    if (k.flag.empty())
      continue;
    std::string help = std::string(k.help) + " [" + dotted(k) + "]";
    if (!k.env.empty())
      help += " (env " + std::string(k.env) + ")";
    if (!k.default_text.empty())
      help += " Default: " + std::string(k.default_text) + ".";
    std::string key = dotted(k);
    std::string flag{k.flag};
    auto* option = app.add_option_function<std::string>(
                          flag,
                          [&out, key, flag](const std::string& value) {
                            out.set(key, value);
                            out.flags[key] = flag;
                          },
                          help)
                       ->type_name(std::string(k.value_name))
                       ->group(group);
    // A boolean flag alone means true: `--insecure` is `--insecure true`.
    if (k.value_name == "BOOL")
      option->expected(0, 1)->default_str("true");
  }
}

std::optional<int> parse_command_line(CLI::App& app, std::string_view program, int argc,
                                      const char* const* argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& failure) {
    // --help (the only request of its kind troupe's programs define): the text goes to stdout
    // and 0 back to the caller, whose main returns it; nothing here ends the process.
    if (failure.get_exit_code() == 0) {
      std::fputs(app.help().c_str(), stdout);
      return 0;
    }
    // CLI11's own exit codes and its "Run with --help" line would break the usage contract.
    std::string what = failure.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(program.size()), program.data(),
                 what.c_str());
    return 2;
  }
  return std::nullopt;
}

namespace {

/// A validator of finite numbers that `accepts`, saying "<value> is not <wanted>" otherwise.
CLI::Validator number_check(bool (*accepts)(double), const char* wanted, const char* type_name) {
  return CLI::Validator(
      [accepts, wanted](std::string& input) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(input, value) || !std::isfinite(value) || !accepts(value))
          return input + " is not " + wanted;
        return {};
      },
      type_name);
}

} // namespace

CLI::Validator positive_number() {
  return number_check([](double v) { return v > 0; }, "a positive number", "POSITIVE");
}

CLI::Validator non_negative_number() {
  return number_check([](double v) { return v >= 0; }, "a number of at least 0", "NONNEGATIVE");
}

result<cluster_config> load_config(const std::optional<std::filesystem::path>& file,
                                   const env_lookup& env, const config_overrides& flags) {
  builder b;
  environment_values environment = read_environment(env);

  std::optional<std::filesystem::path> path = file;
  std::string_view named_by;
  if (!path && flags.config_file) {
    path = flags.config_file;
    named_by = "--config";
  }
  if (!path && environment.config_file) {
    path = environment.config_file;
    named_by = "TROUPE_CONFIG";
  }
  if (path)
    if (auto applied = apply_file(b, *path, named_by); !applied)
      return applied.error();

  // Within the environment DMLC_NODE_HOST beats DMLC_INTERFACE: resolve() prefers node.host.
  for (const auto& [f, value] : environment.values)
    if (auto applied =
            b.apply(*f, {literal::form::text, value, 0}, {{}, std::string(f->key.env), layer::env});
        !applied)
      return applied.error();

  for (const auto& [key, value] : flags.values) {
    const field* f = find_field(key);
    if (!f)
      return error{errc::invalid_argument, "unknown configuration key '" + key + "'"};
    auto flag = flags.flags.find(key);
    std::string subject = flag != flags.flags.end() ? flag->second
                          : f->key.flag.empty()     ? key
                                                    : std::string(f->key.flag);
    if (auto applied = b.apply(*f, {literal::form::text, value, 0}, {{}, subject, layer::flags});
        !applied)
      return applied.error();
  }

  if (auto resolved = resolve(b); !resolved)
    return resolved.error();
  return std::move(b.cfg);
}

status validate_for_role(const cluster_config& cfg, node_role role) {
  const std::string who = "a " + std::string(to_string(role));
  if (cfg.role && *cfg.role != role)
    return error{errc::invalid_argument, "the configuration names role " +
                                             std::string(to_string(*cfg.role)) + " (" +
                                             naming("job.role") + "), but this node is " + who};
  std::vector<std::string> missing;
  if (!cfg.scheduler_port)
    missing.push_back(naming("scheduler.port"));
  if (!cfg.num_workers)
    missing.push_back(naming("job.num_workers"));
  if (!cfg.num_servers)
    missing.push_back(naming("job.num_servers"));
  if (!missing.empty())
    return error{errc::invalid_argument, who + " needs " + listed(missing)};
  if (role != node_role::scheduler && *cfg.scheduler_port == 0)
    return error{errc::invalid_argument,
                 who + " cannot reach a scheduler on port 0: " + naming("scheduler.port") +
                     " = 0 only lets a test's scheduler pick a free port"};
  if (role == node_role::server && cfg.node_host.empty())
    return error{errc::invalid_argument,
                 who + " listening on " + cfg.bind_address + " needs " + naming("node.host") +
                     " or " + naming("node.interface") + " so that workers know where to connect"};
  // Workers keep a copy of every push until a checkpoint holds it: without periodic
  // checkpoints, waiting for a lost server would keep them all.
  if (cfg.server_rejoin.count() > 0 && cfg.checkpoint_every_rounds == 0 &&
      cfg.checkpoint_every.count() == 0)
    return error{errc::invalid_argument,
                 naming("timeouts.server_rejoin") + " needs periodic checkpoints (" +
                     naming("checkpoint.every_rounds") + " or " + naming("checkpoint.every") +
                     "): a server comes back from its last checkpoint"};
  if (role == node_role::server && cfg.checkpoint_recover &&
      (cfg.checkpoint_dir.empty() || cfg.rank_hint < 0))
    return error{errc::invalid_argument,
                 who + " recovering from its checkpoint (" + naming("checkpoint.recover") +
                     ") needs " + naming("checkpoint.dir") + " and " + naming("node.rank_hint") +
                     ", the rank whose checkpoint it loads"};
  // A scheduler or server that other hosts can reach admits whoever registers unless the job
  // has a token. The scheduler listens on scheduler.host; node.bind is checked too, so that a
  // scheduler told to bind every address is refused whichever of the two it uses.
  if (role != node_role::worker && cfg.auth_token.empty() && !cfg.insecure) {
    std::vector<std::string> listening{cfg.bind_address};
    if (role == node_role::scheduler)
      listening.insert(listening.begin(), cfg.scheduler_host);
    for (const auto& address : listening)
      if (!is_loopback(address))
        return error{errc::invalid_argument,
                     who + " listening on " + address +
                         " without a job token lets any host join and read the job; set "
                         "job.token_file or TROUPE_JOB_TOKEN, or pass --insecure"};
  }
  if (auto tls = load_tls_credentials(cfg, role); !tls)
    return tls.error();
  return ok();
}

result<cluster_config> load_worker_config(const env_lookup& env, const config_overrides& flags) {
  auto config = load_config(std::nullopt, env, flags);
  if (!config)
    return config.error();
  if (auto valid = validate_for_role(*config, node_role::worker); !valid)
    return valid.error();
  return config;
}

status check_port_free(const std::string& host, std::uint16_t port) {
  if (port == 0)
    return ok();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    return error{errc::io_error, "cannot resolve " + host + ": " + ::gai_strerror(rc)};
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard{found, &::freeaddrinfo};
  int fd = ::socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, found->ai_protocol);
  if (fd < 0)
    return error{errc::io_error, std::string("cannot open a socket: ") + std::strerror(errno)};
  int one = 1;
  // Listeners set SO_REUSEADDR, so a port in TIME_WAIT is free for them and for this check.
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = ::bind(fd, found->ai_addr, found->ai_addrlen);
  int bind_errno = errno;
  ::close(fd);
  if (rc == 0)
    return ok();
  if (bind_errno == EADDRINUSE)
    return error{errc::io_error, "port " + service + " on " + host + " is in use"};
  if (bind_errno == EADDRNOTAVAIL) {
    auto why = nonlocal_address_reason(host);
    return error{errc::io_error, why.empty() ? host + " is not an address of this machine" : why};
  }
  return error{errc::io_error,
               "cannot bind " + host + ":" + service + ": " + std::strerror(bind_errno)};
}

result<std::string> interface_ipv4(std::string_view name) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0)
    return error{errc::io_error,
                 std::string("cannot list network interfaces: ") + std::strerror(errno)};
  std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)> guard{list, &::freeifaddrs};
  std::vector<std::string> with_ipv4;
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET)
      continue;
    if (it->ifa_name == name) {
      char text[INET_ADDRSTRLEN] = {};
      const auto* addr = reinterpret_cast<const sockaddr_in*>(it->ifa_addr);
      ::inet_ntop(AF_INET, &addr->sin_addr, text, sizeof text);
      return std::string(text);
    }
    if (std::find(with_ipv4.begin(), with_ipv4.end(), it->ifa_name) == with_ipv4.end())
      with_ipv4.emplace_back(it->ifa_name);
  }
  std::string present;
  for (const auto& n : with_ipv4)
    present += (present.empty() ? "" : ", ") + n;
  return error{errc::invalid_argument, "no network interface \"" + std::string(name) +
                                           "\" with an IPv4 address (interfaces with one: " +
                                           (present.empty() ? "none" : present) + ")"};
}

result<std::chrono::milliseconds> parse_duration(std::string_view text) {
  struct unit {
    std::string_view name;
    std::int64_t ms;
  };
  // "ms" before "m" and "s": the longest suffix that matches.
  static constexpr unit units[] = {{"ms", 1}, {"s", 1000}, {"m", 60'000}, {"h", 3'600'000}};
  for (const auto& u : units) {
    if (text.size() <= u.name.size() || !text.ends_with(u.name))
      continue;
    auto count = parse_integer(text.substr(0, text.size() - u.name.size()));
    if (!count)
      break;
    if (*count < 0 || *count > std::numeric_limits<std::int64_t>::max() / u.ms)
      break;
    return std::chrono::milliseconds{*count * u.ms};
  }
  return error{errc::invalid_argument, "\"" + std::string(text) +
                                           "\" is not a duration such as \"500ms\", \"5s\", "
                                           "\"2m\" or \"1h\""};
}

std::string format_duration(std::chrono::milliseconds value) {
  const auto ms = value.count();
  if (ms != 0 && ms % 3'600'000 == 0)
    return std::to_string(ms / 3'600'000) + "h";
  if (ms != 0 && ms % 60'000 == 0)
    return std::to_string(ms / 60'000) + "m";
  if (ms != 0 && ms % 1000 == 0)
    return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

} // namespace troupe

// frame_bench: pushes and push+pulls through troupe's data path (actors/data_link: Cap'n Proto
// frames over CAF broker connections) between two processes on loopback, measured the way
// bench/tcp_baseline measures raw sockets, so the two can be compared from one run
// (bench/run_frame_bench.sh prints the ratios).
//
//   build/bench/frame_bench [--sizes 4096,1048576,16777216,134217728] [--repeats 9]
//                           [--ops push,pushpull] [--chunk 1048576] [--threads 2]
//                           [--scheduler stealing|sharing] [--caf-defaults]
//                           [--write-chunk 4194304] [--in-flight 8388608]
//                           [--shm-arena 67108864 (0: tensors through the socket)]
//                           [--window 67108864 (receive window of both ends; 0: no credit)]
//
// A forked server process runs a data server whose handler answers each push frame with an ack
// and each pushpull frame with a pull_reply carrying a tensor chunk of the same size (from a
// pre-faulted buffer of its own). The client sends a tensor from a pre-faulted buffer, in chunks
// of --chunk bytes (the schema chunker's default, 1 MiB) for big sizes, and waits for every
// reply. One JSON line per op and size (engine/json_line.hpp):
//   median_gbps   payload bytes per second of one direction (the tensor's size / time), as
//                 tcp_baseline's figure;
//   wire_gbps     bytes per second over both directions (2x size for pushpull), the figure to set
//                 against tcp_baseline for a push+pull;
//   median_rtt_us median time of one whole push (or push+pull) including its replies.
// Round -1 of each size warms up (buffers are pooled and pre-faulted after it, as in a job).
// Both processes run their actor systems with troupe::tune_for_data_path unless --caf-defaults.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <utility>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/data_link.hpp"
#include "engine/json_line.hpp"
#include "engine/log.hpp"
#include "schema/chunking.hpp"

using namespace troupe;

namespace {

[[noreturn]] void die(const std::string& what) {
  logger{"frame_bench", 0}.error(what);
  std::exit(1);
}

/// A float32 tensor buffer with every page touched (a first write to fresh memory is far slower
/// than to warm memory here), owned through shared_ptr so that envelopes can keep it alive.
std::shared_ptr<std::vector<float>> prefaulted(std::size_t bytes) {
  auto buffer = std::make_shared<std::vector<float>>(bytes / sizeof(float));
  for (std::size_t i = 0; i < buffer->size(); i += 1024)
    (*buffer)[i] = static_cast<float>(i);
  return buffer;
}

wire::tensor_chunk whole_tensor(const std::vector<float>& values, std::size_t bytes) {
  wire::tensor_chunk t;
  t.type = wire::dtype::float32;
  t.shape = {static_cast<std::int64_t>(bytes / sizeof(float))};
  t.total_bytes = bytes;
  t.data = std::as_bytes(std::span(values)).first(bytes);
  return t;
}

/// CAF settings of both processes.
struct system_settings {
  int threads = 2;
  std::string policy = "stealing";
  /// Leave the scheduler as CAF configures it (skip tune_for_data_path).
  bool caf_defaults = false;
  /// Write pacing of both ends (data_link_tuning).
  std::size_t write_chunk_bytes = data_link_tuning{}.write_chunk_bytes;
  std::size_t max_bytes_in_flight = data_link_tuning{}.max_bytes_in_flight;
  /// Same-host arena per direction; 0 measures the socket path.
  std::size_t shm_arena_bytes = data_link_tuning{}.shm_arena_bytes;
  /// Receive window of both ends; 0 turns the credit off.
  std::size_t receive_window_bytes = data_link_tuning{}.receive_window_bytes;
};

data_link_tuning make_tuning(const system_settings& settings, std::size_t largest) {
  data_link_tuning tuning;
  tuning.limits.max_frame_bytes = std::max<std::size_t>(largest, 1 << 20) + (1 << 20);
  tuning.write_chunk_bytes = settings.write_chunk_bytes;
  tuning.max_bytes_in_flight = settings.max_bytes_in_flight;
  tuning.shm_arena_bytes = settings.shm_arena_bytes;
  tuning.receive_window_bytes = settings.receive_window_bytes;
  return tuning;
}

caf::actor_system_config make_config(const system_settings& settings) {
  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  // As many scheduler threads as cores on small nodes (--threads, 2 by default).
  cfg.set("scheduler.max-threads", settings.threads);
  cfg.set("scheduler.policy", caf::atom_from_string(settings.policy));
  if (!settings.caf_defaults)
    tune_for_data_path(cfg);
  return cfg;
}

// --- server process --------------------------------------------------------------------------

/// The server's request handler: an ack for a push chunk, the same slice of its own tensor for a
/// pushpull chunk.
caf::behavior bench_handler(caf::event_based_actor* self, std::shared_ptr<std::vector<float>> own) {
  return {[=](envelope& request, const reply_sink& reply_to) {
    if (const auto* push = std::get_if<wire::push>(&request.msg)) {
      self->send(reply_to, envelope{wire::ack{push->request_id}, nullptr, request.connection});
    } else if (const auto* pp = std::get_if<wire::pushpull>(&request.msg)) {
      wire::pull_reply reply;
      reply.request_id = pp->request_id;
      reply.key = pp->key;
      reply.round = pp->round;
      reply.tensor = pp->tensor;
      reply.tensor.data =
          std::as_bytes(std::span(*own)).subspan(pp->tensor.offset, pp->tensor.data.size());
      self->send(reply_to, envelope{std::move(reply), own, request.connection});
    } else {
      self->send(reply_to,
                 envelope{wire::error_reply{0, std::nullopt, wire::error_code::unsupported,
                                            "frame_bench serves push and pushpull"},
                          nullptr, request.connection});
    }
  }};
}

[[noreturn]] void serve(int port_pipe, std::size_t largest, const system_settings& settings) {
  auto cfg = make_config(settings);
  {
    caf::actor_system sys{cfg};
    auto handler = sys.spawn(bench_handler, prefaulted(largest));
    caf::scoped_actor self{sys};
    auto done = caf::actor_cast<caf::actor>(self);
    data_server_options options;
    options.route = [handler](const envelope&) {
      return caf::actor_cast<request_handler>(handler);
    };
    options.on_disconnect = [done](std::uint64_t) { caf::anon_send(done, stop_atom::value); };
    options.tuning = make_tuning(settings, largest);
    auto server = spawn_data_server(sys, "127.0.0.1", 0, std::move(options));
    if (!server)
      die(server.error().to_string());
    const std::uint16_t port = server->port;
    if (::write(port_pipe, &port, sizeof port) != sizeof port)
      die("cannot report the port");
    ::close(port_pipe);
    // Serve until the client's connection closes (or an hour, should the client vanish).
    self->receive([](stop_atom) {}, caf::after(std::chrono::seconds(3600)) >> [] {});
    caf::anon_send(server->broker, stop_atom::value);
    caf::anon_send_exit(handler, caf::exit_reason::user_shutdown);
  }
  std::_Exit(0);
}

// --- client process --------------------------------------------------------------------------

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

/// Sends one tensor of `bytes` as `op` (push or pushpull) in chunks and waits for every reply.
/// Returns the seconds it took, or dies on a failure reply or a timeout.
double round_trip(caf::scoped_actor& self, const caf::actor& link, const std::string& op,
                  const std::shared_ptr<std::vector<float>>& tensor, std::size_t bytes,
                  std::size_t chunk_bytes, std::uint64_t request_id) {
  wire::message whole;
  if (op == "push")
    whole = wire::push{request_id, 1, 0, 0, whole_tensor(*tensor, bytes)};
  else
    whole = wire::pushpull{request_id, 1, 0, 0, whole_tensor(*tensor, bytes)};
  const auto start = std::chrono::steady_clock::now();
  wire::chunker chunks(std::move(whole), chunk_bytes);
  for (std::size_t i = 0; i < chunks.chunk_count(); ++i)
    self->send(link, envelope{chunks.chunk(i), tensor, 0});
  std::size_t pending = chunks.chunk_count();
  std::size_t reply_bytes = 0;
  while (pending > 0) {
    self->receive(
        [&](envelope& reply) {
          if (const auto* error = std::get_if<wire::error_reply>(&reply.msg))
            die("server answered with an error: " + error->message);
          if (const auto* pull = std::get_if<wire::pull_reply>(&reply.msg))
            reply_bytes += pull->tensor.data.size();
          --pending;
        },
        [&](link_down_atom, std::uint64_t, const std::string& reason) { die(reason); },
        caf::after(std::chrono::seconds(60)) >> [&] { die("no reply within 60 s"); });
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  if (op == "pushpull" && reply_bytes != bytes)
    die("pull replies carried " + std::to_string(reply_bytes) + " bytes, not " +
        std::to_string(bytes));
  return took.count();
}

/// The JSON line of one op and size: `seconds` of each measured round trip.
void print_result(const std::string& op, std::size_t size, std::size_t chunk_bytes,
                  const std::vector<double>& seconds) {
  const double mid = median(seconds);
  const auto [fastest, slowest] = std::minmax_element(seconds.begin(), seconds.end());
  const double directions = op == "pushpull" ? 2.0 : 1.0;
  json_line::object line;
  line["bench"] = "frame_bench";
  line["op"] = op;
  line["bytes"] = size;
  line["chunk_bytes"] = std::min(size, chunk_bytes);
  line["repeats"] = seconds.size();
  line["median_gbps"] = json_line::fixed(size / mid / 1e9, 3);
  line["min_gbps"] = json_line::fixed(size / *slowest / 1e9, 3);
  line["max_gbps"] = json_line::fixed(size / *fastest / 1e9, 3);
  line["wire_gbps"] = json_line::fixed(directions * size / mid / 1e9, 3);
  line["median_rtt_us"] = json_line::fixed(mid * 1e6, 1);
  json_line::print(line);
}

/// What the client measures: every op at every size.
struct measurements {
  std::vector<std::size_t> sizes{4096, 1u << 20, 16u << 20, 128u << 20};
  std::vector<std::string> ops{"push", "pushpull"};
  int repeats = 9;
  std::size_t chunk_bytes = wire::default_chunk_bytes;

  std::size_t largest() const { return *std::max_element(sizes.begin(), sizes.end()); }
};

/// Dies naming the first size, op or chunk size that the measurements cannot use.
void check(const measurements& m) {
  for (auto size : m.sizes)
    if (size == 0 || size % 4 != 0)
      die("size " + std::to_string(size) + " is not a positive multiple of 4");
  for (const auto& op : m.ops)
    if (op != "push" && op != "pushpull")
      die("unknown op " + op);
  if (!wire::valid_chunk_bytes(m.chunk_bytes))
    die("chunk size " + std::to_string(m.chunk_bytes) + " is not a multiple of 8 in [8, 512 MiB)");
}

/// Forks the server process; its pid and the port it listens on. Called before any actor system
/// exists: threads do not survive fork.
std::pair<pid_t, std::uint16_t> start_server(std::size_t largest, const system_settings& settings) {
  int port_pipe[2];
  if (::pipe(port_pipe) != 0)
    die("pipe failed");
  pid_t server = ::fork();
  if (server < 0)
    die("fork failed");
  if (server == 0) {
    ::close(port_pipe[0]);
    serve(port_pipe[1], largest, settings);
  }
  ::close(port_pipe[1]);
  std::uint16_t port = 0;
  if (::read(port_pipe[0], &port, sizeof port) != sizeof port)
    die("the server process did not report its port");
  ::close(port_pipe[0]);
  return {server, port};
}

/// The client: connects a data link to the server at `port`, measures every op and size (round
/// -1 of each warms up), one JSON line each, then closes the link.
void run_client(std::uint16_t port, const measurements& m, const system_settings& settings) {
  auto cfg = make_config(settings);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  data_link_options options;
  options.tuning = make_tuning(settings, m.largest());
  auto link = connect_data_link(sys, "127.0.0.1", port, caf::actor_cast<caf::actor>(self), options);
  if (!link)
    die(link.error().to_string());
  auto tensor = prefaulted(m.largest());
  std::uint64_t request_id = 0;
  for (const auto& op : m.ops) {
    for (auto size : m.sizes) {
      // Small payloads repeat more, so their medians rest on enough samples.
      const int rounds = size <= (64u << 10) ? std::max(m.repeats, 2000) : m.repeats;
      std::vector<double> seconds;
      for (int round = -1; round < rounds; ++round) {
        auto took = round_trip(self, *link, op, tensor, size, m.chunk_bytes, ++request_id);
        if (round >= 0)
          seconds.push_back(took);
      }
      print_result(op, size, m.chunk_bytes, seconds);
    }
  }
  self->send(*link, stop_atom::value);
  self->receive([](link_down_atom, std::uint64_t, const std::string&) {},
                caf::after(std::chrono::seconds(5)) >> [] {});
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"data path (actors/data_link) loopback benchmark"};
  measurements m;
  system_settings settings;
  app.add_option("--sizes", m.sizes, "payload sizes in bytes (multiples of 4)")->delimiter(',');
  app.add_option("--ops", m.ops, "push, pushpull or both")->delimiter(',');
  app.add_option("--repeats", m.repeats, "measured repetitions per size")
      ->check(CLI::Range(1, 100000));
  app.add_option("--chunk", m.chunk_bytes, "tensor chunk bytes (multiple of 8)");
  app.add_option("--threads", settings.threads, "CAF scheduler threads per process")
      ->check(CLI::Range(1, 64));
  app.add_option("--scheduler", settings.policy, "CAF scheduler policy of both processes")
      ->check(CLI::IsMember({"stealing", "sharing"}));
  app.add_option("--write-chunk", settings.write_chunk_bytes,
                 "bytes appended to a connection's write buffer per step");
  app.add_option("--in-flight", settings.max_bytes_in_flight,
                 "most bytes per connection handed to CAF and not yet written");
  app.add_option("--shm-arena", settings.shm_arena_bytes,
                 "same-host shared-memory arena per direction (0: through the socket)");
  app.add_option("--window", settings.receive_window_bytes,
                 "receive window of both ends in bytes (0: no credit flow control)");
  app.add_flag("--caf-defaults", settings.caf_defaults,
               "keep CAF's scheduler polling (skip troupe::tune_for_data_path)");
  CLI11_PARSE(app, argc, argv);
  check(m);

  const auto [server, port] = start_server(m.largest(), settings);
  run_client(port, m, settings);
  int status = 0;
  ::waitpid(server, &status, 0);
  return 0;
}

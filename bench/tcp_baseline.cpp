// tcp_baseline: what the loopback wire carries with plain blocking sockets, the baseline that
// troupe's data path is measured against (BENCHMARKS.md).
//
//   build/bench/tcp_baseline [--sizes 4096,16777216,134217728] [--repeats 9] [--port 0]
//   build/bench/tcp_baseline --pingpong [--sizes 4096] [--repeats 2000] [--spin-us 50]
//   build/bench/tcp_baseline --serve-on ADDRESS [--port P] [--sizes ...]   (one side, two hosts)
//   build/bench/tcp_baseline --connect ADDRESS --port P [--sizes ...] [--repeats 9]
//
// The two-sided form measures the stream between two hosts (bench/run_hosts_bench.sh runs it
// between network namespaces): the server prints {"listening":PORT} and serves one client.
//
// A forked server process receives length-prefixed payloads into a pre-faulted buffer and
// answers each with an 8-byte ack; the client sends from a pre-faulted buffer in 4 MiB writes
// (TCP_NODELAY on both sides). One JSON line per size: median and spread of the push
// (payload + ack) rate in GB/s, the median round trip in microseconds, and machine_cpu_s, the
// CPU-seconds the whole machine was busy over the measured repetitions (both ends and the
// kernel, when nothing else runs: bench/machine_cpu.hpp).
//
// --pingpong measures the plain round trip instead, what a small pushpull is compared with
// (bench/run_latency_bench.sh): the client sends `size` bytes in one send, the server, blocked in
// recv, sends the same bytes back in one send, and the client's recv returns; no header or ack per
// round trip (one header announces a run of them). Its lines are {"bench":"tcp_pingpong",...}
// with the median round trip. With --spin-us N both ends poll the socket (non-blocking recv) for
// up to N µs before they block, as troupe's caller polls its request before sleeping: on an idle
// machine a blocked recv is woken from a deep sleep of its core and the plain round trip moves
// between 14 and 50 µs from minute to minute, while polling readers stay awake (the line carries
// "spin_us").

#include <CLI/CLI.hpp>
#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <string>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "engine/json_line.hpp"
#include "engine/log.hpp"
#include "machine_cpu.hpp"

namespace {

constexpr std::size_t io_chunk = 4u << 20;

/// Ends the process after logging what failed and why (errno).
[[noreturn]] void die(const char* what) {
  troupe::logger{"tcp_baseline", 0}.error(std::string(what) + ": " + std::strerror(errno));
  std::exit(1);
}

void send_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    auto sent = ::send(fd, data, std::min(size, io_chunk), 0);
    if (sent <= 0)
      die("send");
    data += sent;
    size -= static_cast<std::size_t>(sent);
  }
}

bool recv_all(int fd, char* data, std::size_t size) {
  while (size > 0) {
    auto got = ::recv(fd, data, std::min(size, io_chunk), 0);
    if (got <= 0)
      return false;
    data += got;
    size -= static_cast<std::size_t>(got);
  }
  return true;
}

/// recv_all that first polls with non-blocking reads for up to `spin` before it blocks.
bool recv_all_polling(int fd, char* data, std::size_t size, std::chrono::microseconds spin) {
  const auto give_up = std::chrono::steady_clock::now() + spin;
  while (size > 0) {
    auto got = ::recv(fd, data, std::min(size, io_chunk), MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (std::chrono::steady_clock::now() < give_up)
        continue;
      got = ::recv(fd, data, std::min(size, io_chunk), 0);
    }
    if (got <= 0)
      return false;
    data += got;
    size -= static_cast<std::size_t>(got);
  }
  return true;
}

void no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/// Touches every page so that the measurement sees warm memory: on these machines the first write
/// to fresh memory runs at ~0.3 GB/s, warm memory at 12+ GB/s.
std::vector<char> prefaulted(std::size_t size) {
  std::vector<char> buffer(size);
  for (std::size_t i = 0; i < size; i += 4096)
    buffer[i] = static_cast<char>(i);
  return buffer;
}

/// A header with this bit announces a ping-pong run: the next 8 bytes count its round trips, and
/// each echoes `length` bytes.
constexpr std::uint64_t pingpong_bit = std::uint64_t{1} << 63;

void serve(int listener, std::size_t largest, std::chrono::microseconds spin) {
  int fd = ::accept(listener, nullptr, nullptr);
  if (fd < 0)
    die("accept");
  no_delay(fd);
  auto buffer = prefaulted(largest);
  std::uint64_t length = 0;
  while (recv_all(fd, reinterpret_cast<char*>(&length), sizeof length)) {
    if ((length & pingpong_bit) != 0) {
      length &= ~pingpong_bit;
      std::uint64_t count = 0;
      if (length > largest || !recv_all(fd, reinterpret_cast<char*>(&count), sizeof count))
        break;
      for (std::uint64_t i = 0; i < count; ++i) {
        if (!recv_all_polling(fd, buffer.data(), length, spin))
          break;
        send_all(fd, buffer.data(), length);
      }
      continue;
    }
    if (length > largest || !recv_all(fd, buffer.data(), length))
      break;
    send_all(fd, reinterpret_cast<const char*>(&length), sizeof length);
  }
  ::close(fd);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

/// The JSON line of one size: `seconds` of each measured round trip, `busy_seconds` the machine's
/// CPU time over them (negative: unknown).
void print_result(const char* bench, std::size_t size, const std::vector<double>& seconds,
                  double busy_seconds, int spin_us = -1) {
  namespace json_line = troupe::json_line;
  const double mid = median(seconds);
  const auto [fastest, slowest] = std::minmax_element(seconds.begin(), seconds.end());
  json_line::object line;
  line["bench"] = bench;
  line["bytes"] = size;
  line["repeats"] = seconds.size();
  line["median_gbps"] = json_line::fixed(size / mid / 1e9, 3);
  line["min_gbps"] = json_line::fixed(size / *slowest / 1e9, 3);
  line["max_gbps"] = json_line::fixed(size / *fastest / 1e9, 3);
  line["median_rtt_us"] = json_line::fixed(mid * 1e6, 1);
  if (busy_seconds >= 0)
    line["machine_cpu_s"] = json_line::fixed(busy_seconds, 3);
  if (spin_us >= 0)
    line["spin_us"] = spin_us;
  json_line::print(line);
}

/// Times `rounds` calls of `trip` (after one that warms up) and prints them as `bench`'s line.
template <class Trip>
void time_round_trips(const char* bench, std::size_t size, int rounds, Trip&& trip,
                      int spin_us = -1) {
  std::vector<double> seconds;
  double busy_at_start = 0;
  for (int round = -1; round < rounds; ++round) {
    if (round == 0)
      busy_at_start = troupe::bench::machine_busy_seconds();
    auto start = std::chrono::steady_clock::now();
    trip();
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    if (round >= 0)
      seconds.push_back(took.count());
  }
  const double busy_at_end = troupe::bench::machine_busy_seconds();
  print_result(bench, size, seconds,
               busy_at_start < 0 || busy_at_end < 0 ? -1.0 : busy_at_end - busy_at_start, spin_us);
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"loopback TCP baseline"};
  std::vector<std::size_t> sizes{4096, 1u << 20, 16u << 20, 128u << 20};
  int repeats = 9;
  std::uint16_t port = 0;
  app.add_option("--sizes", sizes, "payload sizes in bytes")->delimiter(',');
  app.add_option("--repeats", repeats, "measured repetitions per size")
      ->check(CLI::Range(1, 100000));
  app.add_option("--port", port, "port (0: the kernel picks one; required with --connect)");
  bool pingpong = false;
  int spin_us = 0;
  app.add_flag("--pingpong", pingpong,
               "time plain round trips that echo `size` bytes (tcp_pingpong lines) instead of "
               "pushes acknowledged with 8 bytes");
  app.add_option("--spin-us", spin_us,
                 "--pingpong: both ends poll the socket this long before they block in recv")
      ->check(CLI::Range(0, 1000000));
  std::string serve_on, connect_to;
  auto* serve_flag = app.add_option("--serve-on", serve_on,
                                    "only serve: listen on this IPv4 address, answer one client");
  app.add_option("--connect", connect_to, "only measure: connect to a --serve-on at this address")
      ->excludes(serve_flag);
  CLI11_PARSE(app, argc, argv);
  auto largest = *std::max_element(sizes.begin(), sizes.end());

  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  const std::string& given = serve_on.empty() ? connect_to : serve_on;
  if (!given.empty() && ::inet_pton(AF_INET, given.c_str(), &address.sin_addr) != 1) {
    std::fprintf(stderr, "tcp_baseline: %s is not an IPv4 address\n", given.c_str());
    return 2;
  }
  if (!connect_to.empty() && port == 0) {
    std::fprintf(stderr, "tcp_baseline: --connect needs the server's --port\n");
    return 2;
  }

  pid_t server = -1;
  if (connect_to.empty()) {
    int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
      die("bind");
    socklen_t length = sizeof address;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
    if (::listen(listener, 1) != 0)
      die("listen");
    if (!serve_on.empty()) {
      std::printf("{\"listening\":%u}\n", static_cast<unsigned>(ntohs(address.sin_port)));
      std::fflush(stdout);
      serve(listener, largest, std::chrono::microseconds{spin_us});
      return 0;
    }
    server = ::fork();
    if (server < 0)
      die("fork");
    if (server == 0) {
      serve(listener, largest, std::chrono::microseconds{spin_us});
      std::_Exit(0);
    }
    ::close(listener);
  }
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
    die("connect");
  no_delay(fd);
  auto payload = prefaulted(largest);

  auto echo = prefaulted(pingpong ? largest : 0);
  for (auto size : sizes) {
    // Small payloads repeat more, so their medians rest on enough samples.
    int rounds = size <= (64u << 10) ? std::max(repeats, 2000) : repeats;
    if (pingpong) {
      const std::uint64_t run[2] = {size | pingpong_bit, static_cast<std::uint64_t>(rounds) + 1};
      send_all(fd, reinterpret_cast<const char*>(run), sizeof run);
      time_round_trips(
          "tcp_pingpong", size, rounds,
          [&] {
            send_all(fd, payload.data(), size);
            if (!recv_all_polling(fd, echo.data(), size, std::chrono::microseconds{spin_us}))
              die("echo");
          },
          spin_us);
      continue;
    }
    time_round_trips("tcp_baseline", size, rounds, [&] {
      std::uint64_t header = size, ack = 0;
      send_all(fd, reinterpret_cast<const char*>(&header), sizeof header);
      send_all(fd, payload.data(), size);
      if (!recv_all(fd, reinterpret_cast<char*>(&ack), sizeof ack) || ack != size)
        die("ack");
    });
  }
  ::close(fd);
  int status = 0;
  if (server > 0)
    ::waitpid(server, &status, 0);
  return 0;
}

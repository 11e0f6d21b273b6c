#pragma once
// The kernel's view of TCP sockets, for tests that check which connections exist and who holds
// them: the rows of /proc/net/tcp and /proc/net/tcp6 (every socket of the network namespace, the
// ports, the state and the socket's inode) and the socket inodes a process holds descriptors of
// (/proc/<pid>/fd links "socket:[inode]").

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <sys/types.h>
#include <vector>

namespace troupe::testing {

/// One row of /proc/net/tcp{,6}.
struct tcp_row {
  std::uint16_t local_port = 0;
  std::uint16_t remote_port = 0;
  /// The kernel's TCP state: 0x01 established, 0x0A listening, ...
  int state = 0;
  std::string inode;
};

inline constexpr int tcp_established = 0x01;
inline constexpr int tcp_listening = 0x0A;

/// Every TCP socket of this network namespace, IPv4 and IPv6.
inline std::vector<tcp_row> tcp_rows() {
  std::vector<tcp_row> rows;
  auto port_of = [](const std::string& address) {
    return static_cast<std::uint16_t>(
        std::stoul(address.substr(address.find(':') + 1), nullptr, 16));
  };
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream lines(table);
    std::string line;
    std::getline(lines, line); // the header
    while (std::getline(lines, line)) {
      // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (!fields)
        continue;
      rows.push_back({port_of(local), port_of(remote), std::stoi(state, nullptr, 16), inode});
    }
  }
  return rows;
}

/// The inodes of the sockets process `pid` holds descriptors of ("self": this process).
inline std::set<std::string> socket_inodes(const std::string& pid = "self") {
  std::set<std::string> inodes;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/" + pid + "/fd", error)) {
    const auto target = std::filesystem::read_symlink(entry.path(), error).string();
    if (!error && target.starts_with("socket:[") && target.ends_with("]"))
      inodes.insert(target.substr(8, target.size() - 9));
  }
  return inodes;
}

/// The TCP ports process `pid` listens on.
inline std::set<std::uint16_t> listening_ports_of(pid_t pid) {
  const auto inodes = socket_inodes(std::to_string(pid));
  std::set<std::uint16_t> ports;
  for (const auto& row : tcp_rows())
    if (row.state == tcp_listening && inodes.count(row.inode) != 0)
      ports.insert(row.local_port);
  return ports;
}

} // namespace troupe::testing

#include "actors/logic/tcp_progress.hpp"

#include <cstddef>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

namespace troupe {

std::optional<tcp_progress> read_tcp_progress(int fd) noexcept {
  tcp_info info{};
  socklen_t size = sizeof info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &size) != 0)
    return std::nullopt;
  // Older kernels fill less; without the byte count the check cannot tell a frame was begun.
  if (size < offsetof(tcp_info, tcpi_bytes_received) + sizeof info.tcpi_bytes_received)
    return std::nullopt;
  int unread = 0;
  if (::ioctl(fd, FIONREAD, &unread) != 0 || unread < 0)
    unread = 0;
  return tcp_progress{info.tcpi_bytes_received, info.tcpi_last_data_recv,
                      static_cast<std::uint64_t>(unread)};
}

} // namespace troupe

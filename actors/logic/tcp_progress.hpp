#pragma once
// What the kernel knows of a TCP socket's incoming bytes, for the data server's checks of frames
// in progress (actors/data_link.cpp): CAF's scribe reads a frame prefix or body into its own
// buffer and tells the broker only once the whole read is there, so the broker cannot see a peer
// that sent half a frame and stopped, or trickles it. The kernel can: the bytes it received on
// the connection (to compare with those the broker was handed), how long ago the last data
// arrived, and how many received bytes this process has not read yet (then a slow frame is this
// process's doing, not the peer's). Linux only (TCP_INFO, FIONREAD); in a file of its own
// because <linux/tcp.h> and the <netinet/tcp.h> that other headers include cannot meet in one
// translation unit.

#include <cstdint>
#include <optional>

namespace troupe {

struct tcp_progress {
  /// Payload bytes the kernel received on the connection in total.
  std::uint64_t bytes_received = 0;
  /// Milliseconds since the last data arrived (the kernel's clock ticks, a few ms).
  std::uint32_t ms_since_data = 0;
  /// Bytes in the socket's receive queue that this process has not read yet.
  std::uint64_t unread = 0;
};

/// The kernel's view of socket `fd`; nullopt when it cannot tell (not a TCP socket, closed).
std::optional<tcp_progress> read_tcp_progress(int fd) noexcept;

} // namespace troupe

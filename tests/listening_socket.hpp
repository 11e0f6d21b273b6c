#pragma once
// A TCP socket listening on 127.0.0.1 at a port the kernel chose: a port that was free a moment
// ago (construct, read port(), destroy), a port that is taken, a listener a test plays a peer on
// (accept(), or accept(limit) with a bounded wait), or one that shows whether anybody connected
// (accept_waiting()).

#include <arpa/inet.h>
#include <chrono>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>

namespace troupe::testing {

/// Closed on destruction.
class listening_socket {
public:
  listening_socket() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    BOOST_TEST_REQUIRE(fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    BOOST_TEST_REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    BOOST_TEST_REQUIRE(::listen(fd_, 4) == 0);
    socklen_t len = sizeof addr;
    BOOST_TEST_REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
  }
  ~listening_socket() { ::close(fd_); }
  listening_socket(const listening_socket&) = delete;
  listening_socket& operator=(const listening_socket&) = delete;
  int port() const { return port_; }

  /// The next connection's socket (reads on it time out after 5 s), or -1; the caller closes it.
  int accept() const {
    const int fd = ::accept(fd_, nullptr, nullptr);
    if (fd >= 0) {
      timeval timeout{5, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    }
    return fd;
  }
  /// The next connection's socket if one arrives within `limit`, else -1.
  int accept(std::chrono::milliseconds limit) const {
    pollfd probe{fd_, POLLIN, 0};
    if (::poll(&probe, 1, static_cast<int>(limit.count())) <= 0)
      return -1;
    return accept();
  }

  /// The socket of a connection already made to this port, or -1 at once when nobody has
  /// connected (a non-blocking accept); the caller closes it.
  int accept_waiting() const {
    const int flags = ::fcntl(fd_, F_GETFL);
    ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
    const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    ::fcntl(fd_, F_SETFL, flags);
    return fd;
  }

private:
  int fd_ = -1;
  int port_ = 0;
};

} // namespace troupe::testing

#include "actors/config/local_address.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cstring>
#include <ifaddrs.h>
#include <memory>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <vector>

namespace troupe {

namespace {

/// The address of `sa` (AF_INET or AF_INET6) as text, without an IPv6 zone; "" for other families.
std::string address_text(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, text, sizeof text);
  else if (sa->sa_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, text, sizeof text);
  return text;
}

/// 127.0.0.0/8 and ::1, which the loopback interface answers whatever its listed address.
bool loopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa->sa_family == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
  return false;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items)
    out += (out.empty() ? "" : ", ") + item;
  return out;
}

} // namespace

std::string nonlocal_address_reason(const std::string& host) {
  if (host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]")
    return {};
  // "[::1]" is how an IPv6 address is written beside a port.
  std::string name = host;
  if (name.size() > 2 && name.front() == '[' && name.back() == ']')
    name = name.substr(1, name.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(name.c_str(), nullptr, &hints, &found); rc != 0)
    return host + " does not resolve on this host (" + ::gai_strerror(rc) + ")";
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> resolved{found, &::freeaddrinfo};

  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0)
    return {};
  std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)> interfaces{list, &::freeifaddrs};
  std::vector<std::string> own;
  for (ifaddrs* it = list; it; it = it->ifa_next)
    if (it->ifa_addr) {
      auto text = address_text(it->ifa_addr);
      if (!text.empty() && std::find(own.begin(), own.end(), text) == own.end())
        own.push_back(std::move(text));
    }

  std::vector<std::string> addresses;
  for (const addrinfo* a = found; a; a = a->ai_next) {
    if (loopback(a->ai_addr))
      return {};
    auto text = address_text(a->ai_addr);
    if (text.empty())
      continue;
    if (std::find(own.begin(), own.end(), text) != own.end())
      return {};
    if (std::find(addresses.begin(), addresses.end(), text) == addresses.end())
      addresses.push_back(std::move(text));
  }
  if (addresses.empty())
    return {};
  const std::string theirs = " (its addresses: " + joined(own) + ")";
  if (addresses.size() == 1 && addresses.front() == name)
    return host + " is not an address of this host" + theirs;
  return host + " resolves to " + joined(addresses) +
         (addresses.size() == 1 ? ", which is not an address" : ", none of which is an address") +
         " of this host" + theirs;
}

} // namespace troupe

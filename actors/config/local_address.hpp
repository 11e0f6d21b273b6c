#pragma once
// Whether a host name or address names this machine: the reason a listener cannot bind it, in
// words a user can act on. A node listens on the address its configuration names (DMLC_NODE_HOST,
// which troupe-launch's ssh mode sets to the host's name in the hostfile; [node] host or bind;
// [scheduler] host); when that name resolves, on the host itself, to no address of its own, the
// socket layer only says that no local interface fits.

#include <string>

namespace troupe {

/// Why a listener on this machine cannot bind `host`, when the cause is the address itself:
/// "node1 does not resolve on this host (Name or service not known)", "node1 resolves to
/// 10.0.0.2, which is not an address of this host (its addresses: 127.0.0.1, 10.0.0.1)" or
/// "192.0.2.7 is not an address of this host (its addresses: ...)". Empty when `host` is a
/// wildcard (0.0.0.0, ::, empty), resolves to an address of an interface here or to loopback
/// (127.0.0.0/8, ::1), or the interfaces cannot be listed. Resolves the name (getaddrinfo): call
/// it to explain a failure, not on every bind.
std::string nonlocal_address_reason(const std::string& host);

} // namespace troupe

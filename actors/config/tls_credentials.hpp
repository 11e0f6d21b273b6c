#pragma once
// A node's TLS identity, from the files the cluster configuration names ([tls]): the job's CA,
// the node's certificate and its private key. Loaded and checked once, at start-up, before any
// network activity (validate_for_role does it, so a bad TLS setup exits 2 like any bad value),
// and then shared, read-only, by every connection of the process (actors/logic/link_tls.hpp).
//
// A certificate names the role of its node as the subjectAltName URI "troupe:role=ROLE" (ROLE:
// scheduler, server or worker; scripts/make-tls-certs.sh writes it). A node's own certificate
// must name the node's role; a peer's must name the role it acts in on that connection: a data
// port takes workers, a worker's link expects a server, the scheduler's port takes servers and
// workers (and the scheduler admits each only in the role its certificate names), a node's
// control link expects the scheduler. Host names are not checked: the role, signed by the job's
// CA, is what a peer is trusted for.

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "actors/config/config.hpp"
#include "engine/error.hpp"

// OpenSSL's types, declared as OpenSSL does (openssl/types.h), so that users of this header do
// not need OpenSSL's headers.
struct ssl_ctx_st;
struct x509_st;

namespace troupe {

/// This node's TLS identity: an OpenSSL context for TLS 1.3 only, with the job's CA as its only
/// trust anchor, peers' certificates required both ways, no session tickets or resumption, and
/// this node's certificate and key. Immutable once loaded; thread-safe to share.
class tls_credentials {
public:
  /// Loads and checks the three files for a node of `role`. Each error is one line naming the
  /// file and what is wrong: it cannot be read (errc::io_error); holds no PEM certificate or
  /// key; the key file may be read by group or others (mode, and chmod 600); the key does not
  /// match the certificate; the certificate is not signed by the CA (or has expired: OpenSSL's
  /// reason); it names no troupe role or another role than `role` (errc::invalid_argument).
  static result<std::shared_ptr<const tls_credentials>> load(const std::string& ca_file,
                                                             const std::string& cert_file,
                                                             const std::string& key_file,
                                                             node_role role);

  ~tls_credentials();
  tls_credentials(const tls_credentials&) = delete;
  tls_credentials& operator=(const tls_credentials&) = delete;

  /// The role this node's certificate names (the role it was loaded for).
  node_role role() const noexcept { return role_; }
  /// What each connection's SSL object is made from (SSL_new).
  ssl_ctx_st* context() const noexcept { return context_; }
  /// The certificate file, for messages.
  const std::string& cert_file() const noexcept { return cert_file_; }
  /// The CA file, for messages.
  const std::string& ca_file() const noexcept { return ca_file_; }

private:
  tls_credentials() = default;
  ssl_ctx_st* context_ = nullptr;
  node_role role_ = node_role::worker;
  std::string cert_file_;
  std::string ca_file_;
};

/// The role `certificate` names: its one subjectAltName URI "troupe:role=ROLE". An error
/// (errc::invalid_argument) saying what the certificate holds instead: no such URI, an unknown
/// role, or several.
result<node_role> certificate_role(const x509_st* certificate);

/// The TLS identity of a node of `role` under `cfg` ([tls], "{role}" in its paths replaced by
/// the role's name); nullptr when tls.enabled is false. Errors as tls_credentials::load, each
/// prefixed by "TLS ([tls] of the configuration): ".
result<std::shared_ptr<const tls_credentials>> load_tls_credentials(const cluster_config& cfg,
                                                                    node_role role);

/// OpenSSL's reason for the last failure on this thread ("key values mismatch"), or `none` when
/// it gave none. The thread's OpenSSL error queue is empty afterwards.
std::string openssl_reason(std::string_view none = "no reason given");

/// `path` with every "{role}" replaced by `role`'s name.
std::string path_for_role(std::string path, node_role role);

} // namespace troupe

#include "actors/config/tls_credentials.hpp"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe {

namespace {

/// The most a peer's certificate chain may take while its connection is unauthenticated
/// (OpenSSL's default is 100 KiB); a troupe chain is one or two certificates of about 1 KiB.
constexpr long max_peer_chain_bytes = 32 * 1024;

/// The subjectAltName URI that names a certificate's role: "troupe:role=worker".
constexpr std::string_view role_uri_prefix = "troupe:role=";

struct free_x509 {
  void operator()(X509* x) const noexcept { X509_free(x); }
};
struct free_pkey {
  void operator()(EVP_PKEY* k) const noexcept { EVP_PKEY_free(k); }
};
struct free_bio {
  void operator()(BIO* b) const noexcept { BIO_free(b); }
};
struct free_store_ctx {
  void operator()(X509_STORE_CTX* c) const noexcept { X509_STORE_CTX_free(c); }
};
struct free_chain {
  void operator()(STACK_OF(X509) * s) const noexcept { sk_X509_free(s); }
};
using x509_ptr = std::unique_ptr<X509, free_x509>;

std::unique_ptr<BIO, free_bio> memory_bio(const std::string& bytes) {
  return std::unique_ptr<BIO, free_bio>(
      BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
}

/// Every PEM certificate in the file at `path`, in order; an error naming the file (as `what`)
/// when it cannot be read or holds none.
result<std::vector<x509_ptr>> certificates_in(const std::string& path, const std::string& what) {
  auto pem = read_file(path, what);
  if (!pem)
    return pem.error();
  std::vector<x509_ptr> out;
  auto bio = memory_bio(*pem);
  while (bio) {
    X509* next = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
    if (next == nullptr)
      break;
    out.emplace_back(next);
  }
  ERR_clear_error(); // the end of the text reads as an error
  if (out.empty())
    return error{errc::invalid_argument, what + " " + path + " holds no PEM certificate"};
  return out;
}

/// Never asks for a passphrase: an encrypted key cannot be read by a node that runs unattended.
int no_passphrase(char*, int, int, void*) {
  return 0;
}

error invalid(std::string text) {
  return error{errc::invalid_argument, std::move(text)};
}

} // namespace

std::string openssl_reason(std::string_view none) {
  const unsigned long code = ERR_peek_last_error();
  ERR_clear_error();
  if (code == 0)
    return std::string(none);
  if (const char* reason = ERR_reason_error_string(code))
    return reason;
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  return text;
}

tls_credentials::~tls_credentials() {
  SSL_CTX_free(context_);
}

result<node_role> certificate_role(const x509_st* certificate) {
  auto* names = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(certificate, NID_subject_alt_name, nullptr, nullptr));
  std::vector<std::string> roles;
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type != GEN_URI)
      continue;
    const ASN1_IA5STRING* uri = name->d.uniformResourceIdentifier;
    std::string text(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                     static_cast<std::size_t>(ASN1_STRING_length(uri)));
    if (text.starts_with(role_uri_prefix))
      roles.push_back(text.substr(role_uri_prefix.size()));
  }
  GENERAL_NAMES_free(names);
  if (roles.empty())
    return invalid("it names no troupe role (a subjectAltName URI troupe:role=ROLE; "
                   "scripts/make-tls-certs.sh writes one)");
  if (roles.size() > 1)
    return invalid("it names " + std::to_string(roles.size()) +
                   " troupe roles; a certificate is for one role");
  auto role = parse_role(roles.front());
  if (!role)
    return invalid("it names the role '" + roles.front().substr(0, 32) +
                   "', which is none of scheduler, server and worker");
  return *role;
}

result<std::shared_ptr<const tls_credentials>> tls_credentials::load(const std::string& ca_file,
                                                                     const std::string& cert_file,
                                                                     const std::string& key_file,
                                                                     node_role role) {
  auto authorities = certificates_in(ca_file, "CA file");
  if (!authorities)
    return authorities.error();
  auto certificates = certificates_in(cert_file, "certificate file");
  if (!certificates)
    return certificates.error();
  const auto& chain = *certificates;

  // Only its owner may read the key: anyone who can read it can act as this node.
  auto key_text = read_private_file(key_file, "key file");
  if (!key_text)
    return key_text.error();
  auto key_bio = memory_bio(*key_text);
  std::unique_ptr<EVP_PKEY, free_pkey> key(
      key_bio ? PEM_read_bio_PrivateKey(key_bio.get(), nullptr, no_passphrase, nullptr) : nullptr);
  if (!key)
    return invalid("key file " + key_file + " holds no unencrypted PEM private key (" +
                   openssl_reason() + ")");

  std::shared_ptr<tls_credentials> made(new tls_credentials);
  made->role_ = role;
  made->cert_file_ = cert_file;
  made->ca_file_ = ca_file;
  made->context_ = SSL_CTX_new(TLS_method());
  SSL_CTX* context = made->context_;
  if (context == nullptr)
    return error{errc::internal, "cannot make a TLS context: " + openssl_reason()};
  // TLS 1.3 only: every cipher suite has forward secrecy and authenticated encryption, and the
  // handshake encrypts the certificates.
  if (SSL_CTX_set_min_proto_version(context, TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_max_proto_version(context, TLS1_3_VERSION) != 1)
    return error{errc::internal, "this OpenSSL has no TLS 1.3: " + openssl_reason()};
  // Every connection authenticates in full: no tickets, no resumption.
  SSL_CTX_set_num_tickets(context, 0);
  SSL_CTX_set_session_cache_mode(context, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(context, SSL_OP_NO_TICKET);
  SSL_CTX_set_max_cert_list(context, max_peer_chain_bytes);
  SSL_CTX_set_verify(context, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);

  X509_STORE* trusted = SSL_CTX_get_cert_store(context);
  for (auto& authority : *authorities)
    if (X509_STORE_add_cert(trusted, authority.get()) != 1)
      return invalid("CA file " + ca_file + ": " + openssl_reason());

  if (SSL_CTX_use_certificate(context, chain.front().get()) != 1)
    return invalid("certificate file " + cert_file + ": " + openssl_reason());
  for (std::size_t i = 1; i < chain.size(); ++i)
    if (SSL_CTX_add1_chain_cert(context, chain[i].get()) != 1)
      return invalid("certificate file " + cert_file + ": " + openssl_reason());
  if (SSL_CTX_use_PrivateKey(context, key.get()) != 1 || SSL_CTX_check_private_key(context) != 1)
    return invalid("key file " + key_file + " does not match certificate file " + cert_file + " (" +
                   openssl_reason() + ")");

  // This node's own certificate must be one its peers accept: from the job's CA, valid now.
  std::unique_ptr<X509_STORE_CTX, free_store_ctx> check(X509_STORE_CTX_new());
  std::unique_ptr<STACK_OF(X509), free_chain> intermediates(sk_X509_new_null());
  if (!check || !intermediates)
    return error{errc::internal, "cannot check a certificate: " + openssl_reason()};
  for (std::size_t i = 1; i < chain.size(); ++i)
    sk_X509_push(intermediates.get(), chain[i].get());
  if (X509_STORE_CTX_init(check.get(), trusted, chain.front().get(), intermediates.get()) != 1)
    return error{errc::internal, "cannot check a certificate: " + openssl_reason()};
  if (X509_verify_cert(check.get()) != 1)
    return invalid("certificate file " + cert_file + " is not from the CA of " + ca_file + " (" +
                   X509_verify_cert_error_string(X509_STORE_CTX_get_error(check.get())) + ")");
  ERR_clear_error();

  auto named = certificate_role(chain.front().get());
  if (!named)
    return invalid("certificate file " + cert_file +
                   " cannot serve this node: " + named.error().message());
  if (*named != role)
    return invalid("certificate file " + cert_file + " is for a " + std::string(to_string(*named)) +
                   ", but this node is a " + std::string(to_string(role)));
  return std::shared_ptr<const tls_credentials>(std::move(made));
}

std::string path_for_role(std::string path, node_role role) {
  constexpr std::string_view placeholder = "{role}";
  const std::string name(to_string(role));
  for (auto at = path.find(placeholder); at != std::string::npos;
       at = path.find(placeholder, at + name.size()))
    path.replace(at, placeholder.size(), name);
  return path;
}

result<std::shared_ptr<const tls_credentials>> load_tls_credentials(const cluster_config& cfg,
                                                                    node_role role) {
  if (!cfg.tls_enabled)
    return std::shared_ptr<const tls_credentials>();
  auto loaded = tls_credentials::load(path_for_role(cfg.tls_ca_file, role),
                                      path_for_role(cfg.tls_cert_file, role),
                                      path_for_role(cfg.tls_key_file, role), role);
  if (!loaded)
    return error{loaded.error().code(),
                 "TLS ([tls] of the configuration): " + loaded.error().message()};
  return loaded;
}

} // namespace troupe

#include "actors/logic/link_tls.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdexcept>
#include <string_view>
#include <utility>

namespace troupe {

namespace {

/// Where the write side of a session puts its records: straight into the broker's write buffer
/// while seal() runs, else into `pending` (handshake messages, alerts) until drain().
struct record_sink {
  std::vector<char> pending;
  std::vector<char>* target = nullptr;
};

int sink_write(BIO* bio, const char* data, std::size_t size, std::size_t* written) {
  auto* sink = static_cast<record_sink*>(BIO_get_data(bio));
  auto& out = sink->target != nullptr ? *sink->target : sink->pending;
  out.insert(out.end(), data, data + size);
  *written = size;
  return 1;
}

long sink_ctrl(BIO*, int command, long, void*) {
  // SSL flushes after every flight; everything else (pending counts, kTLS) is "nothing here".
  return command == BIO_CTRL_FLUSH ? 1 : 0;
}

/// Both sides' BIOs are ready as made (their state comes with BIO_set_data).
int bio_create(BIO* bio) {
  BIO_set_init(bio, 1);
  return 1;
}

/// Where the read side of a session takes its ciphertext from: the socket read that take() was
/// given, read in place (no copy into a memory BIO). SSL consumes every byte of it before it asks
/// for more, so nothing is left when take() and the fill() calls after it are done.
struct record_source {
  std::span<const char> current;
  /// A copy of what `current` had left when the caller stopped decrypting before the end of its
  /// read (tls_session::keep_unread); `current` then views it.
  std::vector<char> kept;
};

int source_read(BIO* bio, char* out, std::size_t size, std::size_t* read) {
  auto* source = static_cast<record_source*>(BIO_get_data(bio));
  const std::size_t n = std::min(size, source->current.size());
  BIO_clear_retry_flags(bio);
  if (n == 0) {
    // "Wait for the socket", not the end of the stream.
    BIO_set_retry_read(bio);
    *read = 0;
    return 0;
  }
  std::memcpy(out, source->current.data(), n);
  source->current = source->current.subspan(n);
  *read = n;
  return 1;
}

long source_ctrl(BIO* bio, int command, long, void*) {
  auto* source = static_cast<record_source*>(BIO_get_data(bio));
  switch (command) {
  case BIO_CTRL_PENDING:
    return static_cast<long>(source->current.size());
  case BIO_CTRL_FLUSH:
    return 1;
  default:
    return 0;
  }
}

/// A BIO type of troupe's links: `read` or `write` (the other null) and `ctrl` over the state
/// BIO_set_data gives it. Throws when OpenSSL cannot make it.
BIO_METHOD* link_bio_method(const char* name, int (*read)(BIO*, char*, std::size_t, std::size_t*),
                            int (*write)(BIO*, const char*, std::size_t, std::size_t*),
                            long (*ctrl)(BIO*, int, long, void*)) {
  BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, name);
  if (m == nullptr || (read != nullptr && BIO_meth_set_read_ex(m, read) != 1) ||
      (write != nullptr && BIO_meth_set_write_ex(m, write) != 1) ||
      BIO_meth_set_ctrl(m, ctrl) != 1 || BIO_meth_set_create(m, bio_create) != 1)
    throw std::runtime_error("cannot make OpenSSL's BIO type for TLS links");
  return m;
}

/// The read and write sides' BIO types, made once per process.
const BIO_METHOD* source_method() {
  static BIO_METHOD* const method =
      link_bio_method("troupe link source", source_read, nullptr, source_ctrl);
  return method;
}
const BIO_METHOD* sink_method() {
  static BIO_METHOD* const method =
      link_bio_method("troupe link sink", nullptr, sink_write, sink_ctrl);
  return method;
}

/// The SSL ex_data slot that points at a session's state, for the verification callback.
int session_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

/// What OpenSSL's reason means for a troupe link, when it says more than OpenSSL's words.
std::string_view hint_for(std::string_view reason) {
  if (contains(reason, "alert unknown ca"))
    return "; the peer does not trust this node's certificate: it is not from the peer's CA";
  if (contains(reason, "alert certificate required") ||
      contains(reason, "peer did not return a certificate"))
    return "; a certificate is required and none was presented";
  if (contains(reason, "alert bad certificate") || contains(reason, "alert certificate unknown") ||
      contains(reason, "alert handshake failure"))
    return "; the peer refused this node's certificate (its CA, or the role it names)";
  if (contains(reason, "wrong version number") || contains(reason, "packet length too long") ||
      contains(reason, "http request") || contains(reason, "unknown protocol") ||
      contains(reason, "record layer failure"))
    return "; the peer does not speak TLS (is tls.enabled off there?)";
  return {};
}

std::string role_list(const std::vector<node_role>& roles) {
  std::string out;
  for (std::size_t i = 0; i < roles.size(); ++i)
    out += (i == 0 ? "" : i + 1 == roles.size() ? " or " : ", ") + std::string(to_string(roles[i]));
  return out;
}

} // namespace

struct tls_session::impl {
  link_tls tls;
  bool listener = false;
  SSL* ssl = nullptr;
  record_source source;
  record_sink sink;
  bool established = false;
  std::optional<node_role> peer_role;
  /// Why the verification callback refused the peer's certificate.
  std::optional<std::string> refusal;
  /// Why the session failed; it takes and sends nothing after that.
  std::optional<std::string> failure;
  /// Bytes of the caller's buffer fill() has written.
  std::size_t filled = 0;

  ~impl() { SSL_free(ssl); }

  std::string fail(std::string why) {
    failure = why;
    return why;
  }

  /// Why the last SSL call, which returned `code`, failed.
  std::string describe(int code) {
    if (refusal)
      return "TLS handshake refused: " + *refusal;
    std::string reason;
    if (code == SSL_ERROR_ZERO_RETURN)
      reason = "the peer ended the TLS session";
    else if (code == SSL_ERROR_SSL)
      reason = openssl_reason();
    else
      reason = "the connection broke (" + openssl_reason() + ")";
    ERR_clear_error();
    return std::string(established ? "TLS session failed: " : "TLS handshake failed: ") + reason +
           std::string(hint_for(reason));
  }

  /// OpenSSL's verdict on each certificate of the peer's chain, the peer's own last (depth 0):
  /// the chain must lead to the CA, and the peer's certificate must name a role taken here.
  static int verify(int preverified, X509_STORE_CTX* store) {
    auto* ssl =
        static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
    auto* self = static_cast<impl*>(SSL_get_ex_data(ssl, session_index()));
    if (preverified != 1) {
      if (!self->refusal)
        self->refusal = "the peer's certificate is not from the CA of " +
                        self->tls.credentials->ca_file() + " (" +
                        X509_verify_cert_error_string(X509_STORE_CTX_get_error(store)) + ")";
      return 0;
    }
    if (X509_STORE_CTX_get_error_depth(store) != 0)
      return 1;
    auto role = certificate_role(X509_STORE_CTX_get_current_cert(store));
    if (!role) {
      self->refusal =
          "the peer's certificate cannot serve in a troupe job: " + role.error().message();
      X509_STORE_CTX_set_error(store, X509_V_ERR_APPLICATION_VERIFICATION);
      return 0;
    }
    const auto& taken = self->tls.peer_roles;
    if (std::find(taken.begin(), taken.end(), *role) == taken.end()) {
      self->refusal = "the peer's certificate is for a " + std::string(to_string(*role)) +
                      ", but on this connection the peer must be a " + role_list(taken);
      X509_STORE_CTX_set_error(store, X509_V_ERR_APPLICATION_VERIFICATION);
      return 0;
    }
    self->peer_role = *role;
    return 1;
  }

  /// Runs the handshake as far as the ciphertext taken allows.
  std::optional<std::string> advance() {
    ERR_clear_error();
    const int done = SSL_do_handshake(ssl);
    if (done == 1) {
      if (!peer_role) // verify() ran for every certificate, so this is OpenSSL's contract broken
        return fail("TLS handshake failed: the peer's certificate was not checked");
      established = true;
      return std::nullopt;
    }
    const int code = SSL_get_error(ssl, done);
    if (code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE)
      return std::nullopt;
    return fail(describe(code));
  }
};

tls_session::tls_session(const link_tls& tls, bool listener) : impl_(std::make_unique<impl>()) {
  auto& s = *impl_;
  s.tls = tls;
  s.listener = listener;
  s.ssl = SSL_new(s.tls.credentials->context());
  BIO* incoming = BIO_new(source_method());
  BIO* outgoing = BIO_new(sink_method());
  if (s.ssl == nullptr || incoming == nullptr || outgoing == nullptr) {
    BIO_free(incoming);
    BIO_free(outgoing);
    throw std::runtime_error("cannot make a TLS session: " + openssl_reason());
  }
  BIO_set_data(incoming, &s.source);
  BIO_set_data(outgoing, &s.sink);
  SSL_set_bio(s.ssl, incoming, outgoing);
  SSL_set_ex_data(s.ssl, session_index(), &s);
  SSL_set_verify(s.ssl, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, impl::verify);
  if (listener) {
    SSL_set_accept_state(s.ssl);
  } else {
    SSL_set_connect_state(s.ssl);
    // The ClientHello, ready to drain.
    if (auto failed = s.advance())
      throw std::runtime_error(*failed);
  }
}

tls_session::~tls_session() = default;

std::optional<std::string> tls_session::take(std::span<const char> cipher) {
  auto& s = *impl_;
  if (s.failure)
    return s.failure;
  // Only a caller that stopped reading a connection early (it was closing) leaves bytes.
  if (!s.source.current.empty())
    return s.fail("TLS failed: " + std::to_string(s.source.current.size()) +
                  " bytes of an earlier read were never decrypted");
  s.source.kept.clear();
  s.source.current = cipher;
  if (!s.established)
    return s.advance();
  return std::nullopt;
}

result<bool> tls_session::fill(std::vector<char>& buffer) {
  auto& s = *impl_;
  if (s.failure)
    return error{errc::peer_lost, *s.failure};
  while (s.filled < buffer.size()) {
    ERR_clear_error();
    const int want = static_cast<int>(std::min<std::size_t>(buffer.size() - s.filled, INT_MAX / 2));
    const int got = SSL_read(s.ssl, buffer.data() + s.filled, want);
    if (got > 0) {
      s.filled += static_cast<std::size_t>(got);
      continue;
    }
    const int code = SSL_get_error(s.ssl, got);
    if (code == SSL_ERROR_WANT_READ)
      return false;
    return error{errc::peer_lost, s.fail(s.describe(code))};
  }
  s.filled = 0;
  return true;
}

void tls_session::keep_unread() {
  auto& source = impl_->source;
  if (source.current.empty() || source.current.data() == source.kept.data())
    return;
  std::vector<char> rest(source.current.begin(), source.current.end());
  source.kept = std::move(rest);
  source.current = source.kept;
}

bool tls_session::mid_record() const noexcept {
  const auto& s = *impl_;
  return s.filled != 0 || !s.source.current.empty() || (s.ssl != nullptr && SSL_has_pending(s.ssl));
}

std::optional<std::string> tls_session::seal(std::span<const char> plain, std::vector<char>& out) {
  auto& s = *impl_;
  if (s.failure)
    return s.failure;
  drain(out); // whatever the session said on its own goes first
  s.sink.target = &out;
  std::optional<std::string> failed;
  while (!plain.empty()) {
    ERR_clear_error();
    const int step = static_cast<int>(std::min<std::size_t>(plain.size(), INT_MAX / 2));
    const int sent = SSL_write(s.ssl, plain.data(), step);
    if (sent <= 0) {
      failed = s.fail(s.describe(SSL_get_error(s.ssl, sent)));
      break;
    }
    plain = plain.subspan(static_cast<std::size_t>(sent));
  }
  s.sink.target = nullptr;
  return failed;
}

std::size_t tls_session::drain(std::vector<char>& out) {
  auto& pending = impl_->sink.pending;
  const std::size_t bytes = pending.size();
  out.insert(out.end(), pending.begin(), pending.end());
  pending.clear();
  return bytes;
}

bool tls_session::established() const noexcept {
  return impl_->established;
}

std::optional<node_role> tls_session::peer_role() const noexcept {
  return impl_->peer_role;
}

} // namespace troupe

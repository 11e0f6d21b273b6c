// actors/logic/link_tls: two TLS sessions that talk through memory, as two brokers would through
// a socket: who gets through the handshake (the CA, the role each end takes), what the ends are
// told when a peer does not, and bytes that cross intact in exactly the reads asked for.
// Certificates come from scripts/make-tls-certs.sh (tests/tls_certs.hpp).

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/config/tls_credentials.hpp"
#include "actors/logic/link_tls.hpp"
#include "tests/tls_certs.hpp"

using namespace troupe;
using troupe::testing::job_certs;
using troupe::testing::other_certs;
using troupe::testing::tls_certs;

namespace {

std::shared_ptr<const tls_credentials> credentials(const tls_certs& certs, node_role role) {
  const std::string name(to_string(role));
  auto loaded = tls_credentials::load(certs.ca(), certs.cert(name), certs.key(name), role);
  BOOST_TEST_REQUIRE(loaded.has_value(), (loaded ? std::string() : loaded.error().message()));
  return *loaded;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// A connector and a listener joined by memory: exchange() moves what each has to send to the
/// other until nothing moves, and keeps the first failure each end reports. Once an end is
/// established it reads what arrives, as a broker does (a TLS 1.3 client is done before the
/// server has checked its certificate: a refusal arrives as an alert after that).
struct session_pair {
  session_pair(const link_tls& connector_tls, const link_tls& listener_tls)
      : connector(connector_tls, false), listener(listener_tls, true) {}

  void exchange() {
    for (int round = 0; round < 16; ++round) {
      std::vector<char> to_listener, to_connector;
      connector.drain(to_listener);
      listener.drain(to_connector);
      if (to_listener.empty() && to_connector.empty())
        return;
      deliver(listener, to_listener, listener_failure);
      deliver(connector, to_connector, connector_failure);
    }
    BOOST_FAIL("the handshake did not settle in 16 rounds");
  }

  static void deliver(tls_session& to, const std::vector<char>& bytes,
                      std::optional<std::string>& failure) {
    if (bytes.empty() || failure)
      return;
    failure = to.take(bytes);
    if (failure || !to.established())
      return;
    std::vector<char> unexpected(1);
    auto read = to.fill(unexpected);
    if (!read)
      failure = read.error().message();
    else
      BOOST_TEST(!*read); // no data flows during a handshake
  }

  tls_session connector;
  tls_session listener;
  std::optional<std::string> connector_failure;
  std::optional<std::string> listener_failure;
};

/// `count` bytes 0, 1, 2, ... (mod 251, so no record boundary lines up with the pattern).
std::vector<char> pattern(std::size_t count) {
  std::vector<char> bytes(count);
  for (std::size_t i = 0; i < count; ++i)
    bytes[i] = static_cast<char>(i % 251);
  return bytes;
}

/// Seals `plain` at `from`, hands the records to `to` and reads them back in reads of
/// `first_read` bytes and then the rest, as a frame receiver asks for a prefix and then a body.
std::vector<char> carry(tls_session& from, tls_session& to, const std::vector<char>& plain,
                        std::size_t first_read) {
  std::vector<char> wire;
  BOOST_TEST_REQUIRE(!from.seal(plain, wire).has_value());
  BOOST_TEST(wire.size() > plain.size()); // record headers and tags
  BOOST_TEST_REQUIRE(!to.take(wire).has_value());
  std::vector<char> head(first_read);
  auto full = to.fill(head);
  BOOST_TEST_REQUIRE((full.has_value() && *full));
  std::vector<char> rest(plain.size() - first_read);
  full = to.fill(rest);
  BOOST_TEST_REQUIRE((full.has_value() && *full));
  // Nothing more is buffered: a further read waits for the socket.
  std::vector<char> more(1);
  full = to.fill(more);
  BOOST_TEST_REQUIRE(full.has_value());
  BOOST_TEST(!*full);
  head.insert(head.end(), rest.begin(), rest.end());
  return head;
}

} // namespace

BOOST_AUTO_TEST_SUITE(link_tls_sessions)

BOOST_AUTO_TEST_CASE(sessions_of_one_ca_agree_and_carry_bytes_both_ways_in_exact_reads) {
  session_pair pair({credentials(job_certs(), node_role::worker), {node_role::server}},
                    {credentials(job_certs(), node_role::server), {node_role::worker}});
  BOOST_TEST(!pair.connector.established());
  pair.exchange();
  BOOST_TEST_REQUIRE(!pair.connector_failure.has_value(), *pair.connector_failure);
  BOOST_TEST_REQUIRE(!pair.listener_failure.has_value(), *pair.listener_failure);
  BOOST_TEST_REQUIRE(pair.connector.established());
  BOOST_TEST_REQUIRE(pair.listener.established());
  BOOST_TEST((pair.connector.peer_role() == node_role::server));
  BOOST_TEST((pair.listener.peer_role() == node_role::worker));

  // Larger than a record (16 KiB), so it spans several.
  const auto upstream = pattern(100'003);
  BOOST_TEST((carry(pair.connector, pair.listener, upstream, 8) == upstream));
  const auto downstream = pattern(70'001);
  BOOST_TEST((carry(pair.listener, pair.connector, downstream, 8) == downstream));
}

BOOST_AUTO_TEST_CASE(a_certificate_from_another_ca_fails_the_handshake_at_both_ends_naming_why) {
  // The connector trusts another CA: the listener's certificate is not from it.
  session_pair pair({credentials(other_certs(), node_role::worker), {node_role::server}},
                    {credentials(job_certs(), node_role::server), {node_role::worker}});
  pair.exchange();
  BOOST_TEST_REQUIRE(pair.connector_failure.has_value());
  BOOST_TEST(contains(*pair.connector_failure, "not from the CA of " + other_certs().ca()),
             *pair.connector_failure);
  BOOST_TEST_REQUIRE(pair.listener_failure.has_value());
  BOOST_TEST(contains(*pair.listener_failure, "unknown ca"), *pair.listener_failure);
  BOOST_TEST(contains(*pair.listener_failure, "not from the peer's CA"), *pair.listener_failure);
  BOOST_TEST(!pair.listener.established());
  // A failed session takes nothing more.
  std::vector<char> bytes(10, 'x');
  BOOST_TEST(pair.listener.take(bytes).has_value());
}

BOOST_AUTO_TEST_CASE(a_certificate_of_a_role_the_listener_does_not_take_is_refused_naming_both) {
  // A server's certificate on a port that takes workers only.
  session_pair pair({credentials(job_certs(), node_role::server), {node_role::server}},
                    {credentials(job_certs(), node_role::server), {node_role::worker}});
  pair.exchange();
  BOOST_TEST_REQUIRE(pair.listener_failure.has_value());
  BOOST_TEST(contains(*pair.listener_failure,
                      "the peer's certificate is for a server, but on this connection the peer "
                      "must be a worker"),
             *pair.listener_failure);
  BOOST_TEST(!pair.listener.established());
  // The connector was done first; the listener's alert ended its session.
  BOOST_TEST_REQUIRE(pair.connector_failure.has_value());
  BOOST_TEST(contains(*pair.connector_failure, "refused this node's certificate"),
             *pair.connector_failure);
}

BOOST_AUTO_TEST_CASE(a_listener_of_a_role_the_connector_does_not_expect_is_refused) {
  // A control link expects the scheduler; a server answers.
  session_pair pair({credentials(job_certs(), node_role::worker), {node_role::scheduler}},
                    {credentials(job_certs(), node_role::server), {node_role::worker}});
  pair.exchange();
  BOOST_TEST_REQUIRE(pair.connector_failure.has_value());
  BOOST_TEST(contains(*pair.connector_failure,
                      "is for a server, but on this connection the peer must be a scheduler"),
             *pair.connector_failure);
  BOOST_TEST(!pair.connector.established());
  BOOST_TEST(!pair.listener.established());
}

BOOST_AUTO_TEST_CASE(bytes_that_are_not_tls_and_a_tampered_record_end_the_session) {
  const link_tls listener_tls{credentials(job_certs(), node_role::server), {node_role::worker}};
  {
    // What a plaintext troupe peer sends: an 8-byte frame prefix and a frame.
    tls_session listener(listener_tls, true);
    std::vector<char> plaintext_frame(64, 0);
    plaintext_frame[0] = 56;
    auto failed = listener.take(plaintext_frame);
    BOOST_TEST_REQUIRE(failed.has_value());
    BOOST_TEST(contains(*failed, "does not speak TLS"), *failed);
  }
  session_pair pair({credentials(job_certs(), node_role::worker), {node_role::server}},
                    listener_tls);
  pair.exchange();
  BOOST_TEST_REQUIRE((pair.connector.established() && pair.listener.established()));
  const auto plain = pattern(1000);
  std::vector<char> wire;
  BOOST_TEST_REQUIRE(!pair.connector.seal(plain, wire).has_value());
  wire[wire.size() / 2] ^= 0x01;
  BOOST_TEST_REQUIRE(!pair.listener.take(wire).has_value());
  std::vector<char> buffer(plain.size());
  auto read = pair.listener.fill(buffer);
  BOOST_TEST_REQUIRE(!read.has_value());
  BOOST_TEST(contains(read.error().message(), "TLS session failed"), read.error().message());
}

BOOST_AUTO_TEST_SUITE_END()

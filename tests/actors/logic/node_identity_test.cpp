// actors/logic/node_identity and the key exchange of actors/logic/link_auth without a network:
// node keys, the sealing of a node's secret under a control connection's session key, and the
// rules a server checks each request against once its connection proved a worker.

#include <algorithm>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/logic/link_auth.hpp"
#include "actors/logic/node_identity.hpp"

using namespace troupe;

namespace {

const link_secret token{"the job's token"};

wire::link_digest bytes_of(std::uint8_t value) {
  wire::link_digest bytes{};
  bytes.fill(value);
  return bytes;
}

/// A session key as both ends of one handshake derive it: hellos, key shares, X25519.
struct exchanged {
  wire::link_hello listener{"host", 0, 0, bytes_of(1), std::nullopt};
  wire::link_hello connector{"host", 0, 0, bytes_of(2), std::nullopt};
  key_exchange connector_keys;
  key_exchange listener_keys;

  exchanged() { connector.key_share = connector_keys.share(); }

  session_key at_listener(const link_secret& secret = token) const {
    return link_session_key(secret, listener, connector, listener_keys.share(),
                            *listener_keys.agree(*connector.key_share));
  }
  session_key at_connector(const link_secret& secret = token) const {
    return link_session_key(secret, listener, connector, listener_keys.share(),
                            *connector_keys.agree(listener_keys.share()));
  }
};

bool same_key(const session_key& a, const session_key& b) {
  return same_digest(a.reveal(), b.reveal());
}

const wire::node_identity worker_1{wire::role::worker, 1};

} // namespace

BOOST_AUTO_TEST_SUITE(node_identity)

BOOST_AUTO_TEST_CASE(both_ends_of_a_key_exchange_agree_and_a_token_holder_reading_it_does_not) {
  exchanged handshake;
  BOOST_TEST(same_key(handshake.at_listener(), handshake.at_connector()));
  // A token holder who read both hellos and both shares, with a key pair of its own, computes
  // another key: X25519's secret is not on the wire.
  key_exchange eavesdropper;
  const auto guessed = link_session_key(token, handshake.listener, handshake.connector,
                                        handshake.listener_keys.share(),
                                        *eavesdropper.agree(handshake.listener_keys.share()));
  BOOST_TEST(!same_key(guessed, handshake.at_listener()));
  // Another token, another key, whatever the X25519 secret.
  BOOST_TEST(
      !same_key(handshake.at_listener(link_secret("another token")), handshake.at_listener()));
  // A share of small order (the all-zero point) would give the all-zero secret: refused.
  BOOST_TEST(!handshake.listener_keys.agree(wire::link_digest{}).has_value());
}

BOOST_AUTO_TEST_CASE(a_sealed_secret_opens_only_for_its_node_under_its_session_key) {
  exchanged handshake;
  const auto secret = bytes_of(0x5A);
  const auto sealed = seal_secret(handshake.at_listener(), secret, worker_1, 11);
  // Never in the clear, and a fresh nonce each time.
  const std::vector<std::uint8_t> all(sealed.begin(), sealed.end());
  BOOST_TEST((std::search(all.begin(), all.end(), secret.begin(), secret.end()) == all.end()));
  BOOST_TEST((seal_secret(handshake.at_listener(), secret, worker_1, 11) != sealed));

  const auto opened = unseal_secret(handshake.at_connector(), sealed, worker_1, 11);
  BOOST_TEST_REQUIRE(opened.has_value());
  BOOST_TEST((*opened == secret));

  // Bound to its node: another rank, role or node id does not open it.
  BOOST_TEST(!unseal_secret(handshake.at_connector(), sealed, {wire::role::worker, 2}, 11));
  BOOST_TEST(!unseal_secret(handshake.at_connector(), sealed, {wire::role::server, 1}, 11));
  BOOST_TEST(!unseal_secret(handshake.at_connector(), sealed, worker_1, 13));
  // Another connection's session key does not open it.
  exchanged other;
  BOOST_TEST(!unseal_secret(other.at_connector(), sealed, worker_1, 11));
  // A byte changed anywhere (nonce, ciphertext, tag) is refused.
  for (std::size_t i = 0; i < sealed.size(); ++i) {
    auto tampered = sealed;
    tampered[i] ^= 0x01;
    BOOST_TEST(!unseal_secret(handshake.at_connector(), tampered, worker_1, 11), "byte " << i);
  }
}

BOOST_AUTO_TEST_CASE(node_keys_differ_by_rank_role_job_secret_and_token) {
  const job_secret job{bytes_of(7)};
  const auto key = derive_node_key(token, job, worker_1).reveal();
  BOOST_TEST((derive_node_key(token, job, worker_1).reveal() == key));
  BOOST_TEST((derive_node_key(token, job, {wire::role::worker, 2}).reveal() != key));
  BOOST_TEST((derive_node_key(token, job, {wire::role::server, 1}).reveal() != key));
  // A process of an earlier job with the same token holds a key that no longer works.
  BOOST_TEST((derive_node_key(token, job_secret{bytes_of(8)}, worker_1).reveal() != key));
  BOOST_TEST((derive_node_key(link_secret("other"), job, worker_1).reveal() != key));
  BOOST_TEST((fresh_job_secret().reveal() != fresh_job_secret().reveal()));
}

BOOST_AUTO_TEST_CASE(a_node_proof_holds_only_for_its_key_and_the_hellos_it_was_made_over) {
  const job_secret job{bytes_of(7)};
  const auto key = derive_node_key(token, job, worker_1);
  wire::link_hello listener{"host", 0, 0, bytes_of(1), std::nullopt};
  wire::link_hello connector{"host", 0, 0, bytes_of(2), std::nullopt, std::nullopt, worker_1};
  const auto proof = node_proof(key, false, listener, connector);
  BOOST_TEST(same_digest(proof, node_proof(key, false, listener, connector)));
  // The listener's answer carries another label: a proof cannot be reflected.
  BOOST_TEST(!same_digest(proof, node_proof(key, true, listener, connector)));
  // Another worker's key, or the same proof for another claimed rank, does not check out.
  const auto other = derive_node_key(token, job, {wire::role::worker, 2});
  BOOST_TEST(!same_digest(proof, node_proof(other, false, listener, connector)));
  auto claims_2 = connector;
  claims_2.identity = wire::node_identity{wire::role::worker, 2};
  BOOST_TEST(!same_digest(proof, node_proof(key, false, listener, claims_2)));
  // The token's proof covers the claimed node too.
  BOOST_TEST(!same_digest(link_proof(token, false, listener, connector),
                          link_proof(token, false, listener, claims_2)));
}

BOOST_AUTO_TEST_CASE(only_a_server_sends_range_data_and_it_sends_nothing_else) {
  const wire::node_identity server{wire::role::server, 1};
  const wire::node_identity worker_0{wire::role::worker, 0};
  wire::tensor_chunk words;
  words.type = wire::dtype::int64;
  words.shape = {1};
  const wire::message moved = wire::range_data{5, 0, 8, words};
  BOOST_TEST(!request_refusal(moved, server).has_value());
  const auto from_worker = request_refusal(moved, worker_0);
  BOOST_TEST_REQUIRE(from_worker.has_value());
  BOOST_TEST((from_worker->code == wire::error_code::not_permitted));
  BOOST_TEST(from_worker->message.find("only the job's servers send range_data") !=
                 std::string::npos,
             from_worker->message);
  // A server's connection pushes nothing, as no worker, and sets nothing for the job.
  for (const auto& request :
       std::vector<wire::message>{wire::push{7, 3, 1, 2, words}, wire::init{1, 3, words},
                                  wire::set_optimizer{2, "sgd", {{"learning_rate", 1e6}}}}) {
    const auto refusal = request_refusal(request, server);
    BOOST_TEST_REQUIRE(refusal.has_value(), wire::kind_name(request));
    BOOST_TEST((refusal->code == wire::error_code::not_permitted));
  }
  BOOST_TEST(request_refusal(moved, wire::node_identity{wire::role::scheduler, 0}).has_value());
}

BOOST_AUTO_TEST_CASE(requests_are_refused_unless_they_act_as_the_worker_the_connection_proved) {
  const wire::node_identity proven{wire::role::worker, 2};
  const wire::node_identity rank_0{wire::role::worker, 0};
  wire::tensor_chunk tensor;
  tensor.shape = {1};
  // Pushes, pulls and pushpulls as the proven rank pass; as any other rank they are refused,
  // naming the rule, the rank claimed and the rank proven.
  const std::vector<wire::message> as_worker_1 = {
      wire::push{7, 3, 1, 2, tensor},
      wire::pull_request{8, 3, 1, 2, 0},
      wire::pushpull{9, 3, 1, 2, tensor, 0},
  };
  for (const auto& request : as_worker_1) {
    BOOST_TEST_CONTEXT(wire::kind_name(request)) {
      const auto refusal = request_refusal(request, proven);
      BOOST_TEST_REQUIRE(refusal.has_value());
      BOOST_TEST((refusal->code == wire::error_code::not_permitted));
      BOOST_TEST(refusal->request_id == wire::request_id_of(request));
      BOOST_TEST((refusal->key == std::optional<std::uint64_t>{3}));
      BOOST_TEST(refusal->message.find("as worker 1 on a connection that proved worker 2") !=
                     std::string::npos,
                 refusal->message);
      BOOST_TEST(refusal->message.find("only as the worker whose key it proved") !=
                     std::string::npos,
                 refusal->message);
      auto as_itself = request;
      std::visit(
          [](auto& m) {
            if constexpr (requires { m.sender_rank; })
              m.sender_rank = 2;
          },
          as_itself);
      BOOST_TEST(!request_refusal(as_itself, proven).has_value());
    }
  }
  // What acts for the whole job comes from worker rank 0 only.
  const std::vector<wire::message> for_the_job = {
      wire::init{1, 3, tensor},
      wire::set_optimizer{2, "sgd", {{"learning_rate", 1e6}}},
      wire::sync_settings{3, wire::consistency_mode::async, 1, false, -1, 2},
      wire::command{4, wire::command_kind::save_checkpoint, "states"},
      wire::set_gradient_compression{5, "2bit", 0.5},
  };
  for (const auto& request : for_the_job) {
    BOOST_TEST_CONTEXT(wire::kind_name(request)) {
      const auto refusal = request_refusal(request, proven);
      BOOST_TEST_REQUIRE(refusal.has_value());
      BOOST_TEST((refusal->code == wire::error_code::not_permitted));
      BOOST_TEST(refusal->request_id == wire::request_id_of(request));
      BOOST_TEST(
          refusal->message.find("on a connection that proved worker 2: only worker rank 0") !=
              std::string::npos,
          refusal->message);
      BOOST_TEST(!request_refusal(request, rank_0).has_value());
    }
  }
  // Kinds a server never takes are the router's to answer; a server's identity acts as nobody.
  BOOST_TEST(!request_refusal(wire::heartbeat{1, 2, 3}, proven).has_value());
  BOOST_TEST(request_refusal(wire::push{7, 3, 0, 2, tensor}, {wire::role::server, 0}).has_value());
}

BOOST_AUTO_TEST_SUITE_END()

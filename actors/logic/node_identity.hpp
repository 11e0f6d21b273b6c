#pragma once
// Who a node of a job is, and what it may send (docs/RELIABILITY.md, "Who may talk to a job").
//
// The job token lets a process in; it does not say which node the process is. So the scheduler
// gives every node it admits a secret of its own:
//   - the job secret M: 32 random bytes the scheduler draws when it starts, so a process left
//     over from an earlier job with the same token holds nothing that works in this one;
//   - a worker's node key K(worker, r) = HMAC-SHA256(token, transcript("troupe node key v1", M,
//     role, rank)), every field length-prefixed (link_auth.hpp's auth_transcript).
// A worker's admission carries its own K, a server's carries M, from which it derives every
// worker's key (servers hold the job's state anyway; workers never learn M). Each is sealed with
// AES-256-GCM under the control connection's session key (link_auth.hpp's key exchange) and bound
// to the node's role, rank and node id, so it never travels in the clear, and under TLS it also
// travels inside TLS. A worker's data connections prove K in their handshake (link_auth.hpp's
// node proofs); a server then takes requests on such a connection only as request_refusal
// allows: pushes, pulls and pushpulls as that worker's rank, and init, set_optimizer,
// sync_settings and commands from worker rank 0 only.

#include <cstdint>
#include <optional>

#include "actors/logic/link_auth.hpp"
#include "schema/messages.hpp"

namespace troupe {

/// A fresh job secret (the kernel's random bytes). Throws std::runtime_error when there are none.
job_secret fresh_job_secret();

/// K(role, rank) of the job whose token is `token` and whose secret is `secret`. Precondition:
/// !secret.empty().
node_key derive_node_key(const link_secret& token, const job_secret& secret,
                         const wire::node_identity& who);

/// `secret` (a node key's or the job secret's bytes) sealed for the node `who` with node id
/// `node_id` under `key`: AES-256-GCM with a fresh random nonce, the node's role, rank and node id
/// as additional data. Throws std::runtime_error when OpenSSL or the kernel's random bytes fail.
wire::sealed_secret seal_secret(const session_key& key, const wire::link_digest& secret,
                                const wire::node_identity& who, std::uint32_t node_id);

/// What seal_secret sealed, when `sealed` was sealed under `key` for exactly that node; nullopt
/// when it was not (another key, another node, a byte changed anywhere).
std::optional<wire::link_digest> unseal_secret(const session_key& key,
                                               const wire::sealed_secret& sealed,
                                               const wire::node_identity& who,
                                               std::uint32_t node_id);

/// Why a server refuses `request` from a connection whose peer proved it is `proven`, or nullopt
/// when the request may go on: a push, pull_request or pushpull whose sender_rank is not the
/// proven worker's rank, and an init, set_optimizer, set_gradient_compression, sync_settings or
/// command from anyone but worker rank 0, get error_reply{not_permitted} naming the rule, the rank
/// the request claims and the one proven; so do range_data from a worker and anything else from a
/// server (a server connects to another only to hand key ranges over). Other kinds pass (the
/// router answers what a server never takes). O(1), and allocates only for a refusal.
std::optional<wire::error_reply> request_refusal(const wire::message& request,
                                                 const wire::node_identity& proven);

} // namespace troupe

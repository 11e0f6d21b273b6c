#pragma once
// A server shard: holds the values and optimizer state of the ps-keys routed to it and answers
// init, push, pull, pushpull, set_optimizer and checkpoint commands (MXNet's KVStoreDistServer,
// src/kvstore/kvstore_dist_server.h, one per key range instead of one per process).
//
// dist_sync: the pushes of round t of a key are summed as they arrive (the first contribution to
// a chunk is copied, later ones are added: no zero-fill pass) until all N workers have sent every
// byte; then the optimizer runs once on the sum, or, with no optimizer, the sum replaces the value.
// A pull for round t is answered once round t is complete. A push for a later round waits in
// order; a push for an earlier one is an error.
// dist_async: each worker's push is applied as soon as all of its bytes have arrived; a pull is
// answered at once with the current value.
//
// Values are read by pull replies on other threads (the broker writes them to the socket) while
// the shard goes on, so a buffer that a reply still holds is never overwritten: the shard takes a
// fresh one from the pool instead (copy-on-write).
//
// Every request is checked before it touches state: an unknown key, a tensor whose dtype, shape
// or size differs from init, a sender rank out of range, a round from the past: the sender gets an
// error_reply naming the key and the values, and the stored value is unchanged.
//
// shard_core is the logic, callable without CAF; spawn_server_shard wraps it in an actor.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/protocols.hpp"
#include "engine/ndarray.hpp"
#include "engine/optimizer.hpp"
#include "schema/chunking.hpp"

namespace troupe {

enum class consistency : std::uint8_t { sync, async };

struct shard_options {
  std::uint32_t shard_index = 0;
  std::uint32_t num_workers = 1;
  consistency mode = consistency::sync;
  /// Largest tensor payload per reply frame.
  std::size_t chunk_bytes = wire::default_chunk_bytes;
};

class shard_core {
public:
  /// Sends one reply to the requester of the message being handled.
  using reply_function = std::function<void(envelope)>;

  explicit shard_core(shard_options options);

  /// Handles one request; replies (now or when a round completes) go through `reply`.
  void handle(envelope request, reply_function reply);

  /// Rounds completed for `ps_key` (0 for an unknown key); for tests and logs.
  std::uint64_t completed_rounds(std::uint64_t ps_key) const;
  /// The stored value of `ps_key`, or the none handle.
  ndarray value(std::uint64_t ps_key) const;

private:
  struct pending_pull {
    std::uint64_t request_id;
    std::uint64_t round;
    reply_function reply;
  };
  struct deferred_push {
    envelope request;
    reply_function reply;
  };
  struct staging {
    ndarray buffer;
    std::uint64_t bytes = 0;
  };
  struct chunk_slot {
    std::uint64_t length = 0;
    std::uint32_t contributors = 0;
  };
  struct key_entry {
    ndarray stored;
    bool initialized = false;
    std::optional<wire::reassembler> init_assembly;
    std::uint64_t completed = 0;
    // sync: the round being collected
    ndarray merge;
    std::vector<std::uint64_t> worker_bytes;
    std::vector<bool> worker_done;
    std::uint32_t workers_done = 0;
    bool round_open = false; // a byte of the current round has arrived
    std::map<std::uint64_t, chunk_slot> chunks;
    std::deque<deferred_push> later_rounds;
    std::vector<pending_pull> pulls;
    // async: each worker's push being received
    std::map<std::uint32_t, staging> async_pushes;
  };

  void on_init(const wire::init& msg, const reply_function& reply);
  /// `then_pull`: a pushpull, answered with the value of the following round instead of an ack.
  void on_push(std::uint64_t request_id, std::uint64_t key, std::uint32_t sender,
               std::uint64_t round, const wire::tensor_chunk& tensor, bool then_pull,
               envelope& request, const reply_function& reply);
  void on_pull(const wire::pull_request& msg, const reply_function& reply);
  void on_set_optimizer(const wire::set_optimizer& msg, const reply_function& reply);
  void on_command(const wire::command& msg, const reply_function& reply);

  void finish_round(std::uint64_t key, key_entry& entry);
  void apply(std::uint64_t key, key_entry& entry, ndarray& received);
  void answer_pulls(std::uint64_t key, key_entry& entry);
  void send_value(std::uint64_t key, const key_entry& entry, std::uint64_t request_id,
                  const reply_function& reply) const;
  std::string checkpoint_path(const std::string& base) const;

  shard_options options_;
  std::map<std::uint64_t, key_entry> keys_;
  std::unique_ptr<updater> updater_;
};

/// An actor running a shard_core. It takes (envelope, caf::actor reply_to) and sends each reply
/// to reply_to as (envelope), with the request's connection id.
caf::actor spawn_server_shard(caf::actor_system& system, shard_options options);

} // namespace troupe

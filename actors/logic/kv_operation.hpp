#pragma once
// A KVStore call as the facade (dist_kvstore) hands it to its worker, and how a reply chunk's copy
// ended: plain types, no CAF, so that the worker's rules (actors/logic/worker_core.hpp) take them
// without an actor system. The worker actor's interface (actors/protocols.hpp) carries them.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "actors/logic/completion.hpp"
#include "engine/error.hpp"
#include "engine/ndarray.hpp"
#include "schema/messages.hpp"

namespace troupe {

/// One key's part of a KVStore call, checked by the facade against the key's declaration.
struct kv_key_work {
  /// The key's index (the int key, or the init order of a string key): its place on the servers.
  std::int64_t index = 0;
  /// The key as the caller wrote it ("3", "'w'"), for messages.
  std::string name;
  shape_vector shape;
  troupe::dtype type = troupe::dtype::float32;
  /// init, push, pushpull: the value to send, in host memory, unchanged until the call completes.
  ndarray value;
  /// pull, pushpull: where the key's value goes (one or more arrays of the declared shape).
  std::vector<ndarray> outputs;
};

/// What a KVStore call asks of its worker actor.
enum class kv_call : std::uint8_t {
  init,        ///< rank 0 sends every key's initial value to its servers
  push,        ///< send each key's value, acknowledged by the servers
  pull,        ///< fetch each key's value of the round this worker has pushed
  pushpull,    ///< push, then the value of that round, in one request per slice
  every_server ///< send one keyless message (set_optimizer, sync_settings, command) to each server
};

/// A KVStore call handed to the worker actor; `done` gets its outcome.
struct kv_operation {
  kv_call call = kv_call::push;
  std::vector<kv_key_work> keys;
  /// every_server: the message for server `server`, with request id `request_id`.
  std::function<wire::message(std::uint64_t request_id, std::uint32_t server)> message_for;
  /// "push", "set_optimizer sgd": how errors name the call.
  std::string what;
  completion<status> done;
};

/// How the copy of one reply chunk ended (the worker's copier tells its worker).
enum class chunk_copy : std::uint8_t {
  more,      ///< copied; the request expects more chunks
  complete,  ///< copied; that was the request's last chunk
  cancelled, ///< not copied: the caller stopped waiting (the output is no longer ours)
  failed     ///< not copied: the chunk does not fit the request (the text says why)
};

} // namespace troupe

#pragma once
// A KVStore call as the facade (dist_kvstore) hands it to its worker, how a reply chunk's copy
// ended, and the receipt of a frame that left: plain types, no CAF, so that the worker's rules
// (actors/logic/worker_core.hpp) take them without an actor system. The worker actor's interface
// (actors/protocols.hpp) carries them.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "actors/logic/completion.hpp"
#include "engine/error.hpp"
#include "engine/gradient_compression.hpp"
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
  /// A row_sparse key (MXNet's row_sparse storage): placed by rows over the servers
  /// (place_rows), its init flagged so. A push sends the rows `rows` names, whose values `value`
  /// holds, shape (rows.size(), shape[1], ...); a pull (row_sparse_pull) fetches the rows `rows`
  /// into outputs[0], one host array of that shape. `rows` is strictly increasing, each below
  /// shape[0].
  bool row_sparse = false;
  std::vector<std::int64_t> rows;
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
  /// init, push, pull, pushpull: MXNet's priority, higher first. Its requests wait in their
  /// server's send queue behind those of higher priority (MXNet gives a layer's parameters
  /// -index, so that the first layers, needed first by the next forward pass, come back first);
  /// the requests of one ps-key keep their order whatever their priorities.
  int priority = 0;
  /// push, pushpull: how the worker compresses the keys' values (kvstore's
  /// set_gradient_compression); keys of a dtype other than float32 and float16 travel dense.
  /// pull, pushpull with compression.pulls: the replies may come packed by the same rule.
  gradient_compression compression;
};

/// How the copy of one reply chunk ended (the worker's copier tells its worker).
enum class chunk_copy : std::uint8_t {
  more,      ///< copied; the request expects more chunks
  complete,  ///< copied; that was the request's last chunk
  cancelled, ///< not copied: the caller stopped waiting (the output is no longer ours)
  failed     ///< not copied: the chunk does not fit the request (the text says why)
};

/// data.send_window_bytes (worker_core_options::send_window_bytes): 4 chunks of the default size.
/// docs/data-path.md has the measurements.
inline constexpr std::size_t default_send_window_bytes = std::size_t{4} << 20;

/// data.slice_credit (worker_core_options::slice_credit): 4 slices (2 MiB at the default slice
/// size) of a key per server awaiting their rounds. docs/data-path.md ("Slice credit") has the
/// measurements.
inline constexpr std::uint32_t default_slice_credit = 4;

/// data.fuse_item_bytes and data.fuse_frame_bytes (worker_core_options, data_link_tuning): small
/// keyed requests to one server, and a server's answers to one worker, that are ready together
/// travel in one batch frame (wire::batch) of at most fuse_frame_bytes of tensor, each carrying
/// at most fuse_item_bytes. docs/data-path.md ("Fusion") has the measurements.
inline constexpr std::size_t default_fuse_item_bytes = std::size_t{16} << 10;
inline constexpr std::size_t default_fuse_frame_bytes = std::size_t{256} << 10;

/// A frame the worker handed to the link of `server` that counts against that server's send
/// window (worker_core_options::send_window_bytes): `bytes` of tensor. Whoever runs the worker
/// gives it back (worker_core::frame_left) once the link has let go of the frame, i.e. the last
/// copy of its envelope's keepalive is gone: a data link drops it once the frame's bytes are in
/// CAF's write buffer (or in the shared-memory arena), an in-process link once the shard has
/// handled the request.
struct send_receipt {
  std::uint32_t server = 0;
  /// Which link of the server (a server restarted from its checkpoint gets a new one): the
  /// receipts of an older one are ignored.
  std::uint64_t link = 0;
  std::uint64_t bytes = 0;
};

} // namespace troupe

#pragma once
// The messages of troupe's wire protocol as plain C++ values: one struct per member of the
// `Message` union of schema/troupe.capnp (read its comments for what each field means; they are
// repeated here only where the C++ form differs). Nothing here depends on Cap'n Proto: the codec
// (schema/codec.hpp) converts between these structs and frames.
//
// Tensor payloads are never owned by a message: tensor_chunk::data is a view. On the sending side
// it views the caller's tensor, which must outlive the encoded frame; on the receiving side it
// views the received frame buffer, which must outlive the decoded message (see codec.hpp).

#include <algorithm>
#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <boost/container/small_vector.hpp>

namespace troupe::wire {

/// troupe.capnp's protocolVersion: what this build speaks and puts into registration.
inline constexpr std::uint32_t protocol_version = 1;

/// Most axes a tensor may have on the wire (decode_limits::max_rank defaults to it).
inline constexpr std::size_t max_tensor_rank = 32;

/// The extents of a tensor's axes. Up to four are held inline, so a steady data path's messages
/// (whose tensors have a few axes) allocate nothing for their shapes, neither when a reply is made
/// nor when a chunk of it is copied; more axes go to the heap. A small_vector from Boost (a header
/// the project already has through Boost.Test) rather than one of our own. Its iterators are not
/// C++20 contiguous iterators: make spans from data() and size().
using tensor_shape = boost::container::small_vector<std::int64_t, 4>;

/// Role of a node in a job (ps-lite's roles).
enum class role : std::uint8_t { scheduler, server, worker };

/// Element type of a tensor. Same names and numbering as troupe::dtype of engine/dtype.hpp, so
/// actors/ may convert with a static_cast; schema/ cannot include engine/ to share the type.
enum class dtype : std::uint8_t { float32 = 0, float16 = 1, int32 = 2, int64 = 3, float64 = 4 };

/// Bytes per element; 0 for a value outside the enumeration.
std::size_t size_of(dtype type) noexcept;
std::string_view to_string(dtype type) noexcept;
std::string_view to_string(role node_role) noexcept;

/// ps-lite's group bitmask for barriers: scheduler 1, servers 2, workers 4; any union of them.
namespace group {
inline constexpr std::uint8_t scheduler = 1;
inline constexpr std::uint8_t servers = 2;
inline constexpr std::uint8_t workers = 4;
inline constexpr std::uint8_t all = scheduler | servers | workers;
} // namespace group

/// Where a chunk's bytes lie in the sender's shared-memory arena (troupe.capnp Tensor.shm): the
/// same-host fast path of a data connection (actors/logic/shm_arena.hpp, docs/data-path.md).
struct shm_ref {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  friend bool operator==(const shm_ref&, const shm_ref&) = default;
};

/// How a chunk's bytes are packed (troupe.capnp Tensor.compression): none (the dense bytes), or
/// MXNet's 2bit and 1bit gradient compression.
enum class compression_type : std::uint8_t { none = 0, two_bit = 1, one_bit = 2 };
std::string_view to_string(compression_type type) noexcept;

/// Bytes of `elements` elements packed by `type` (whole 32-bit words of 16 or 32 elements); for
/// none, 0 (the dense size depends on the dtype).
constexpr std::uint64_t packed_bytes(compression_type type, std::uint64_t elements) noexcept {
  switch (type) {
  case compression_type::two_bit:
    return (elements + 15) / 16 * 4;
  case compression_type::one_bit:
    return (elements + 31) / 32 * 4;
  case compression_type::none:
    break;
  }
  return 0;
}

/// A packed chunk: the rule and threshold it was packed with, and the elements it covers.
struct tensor_compression {
  compression_type type = compression_type::none;
  float threshold = 0;
  std::uint64_t elements = 0;
  friend bool operator==(const tensor_compression&, const tensor_compression&) = default;
};

/// A request's offer to read a packed reply (troupe.capnp PullRequest.replyCompression).
struct reply_packing {
  compression_type type = compression_type::none;
  float threshold = 0;
  friend bool operator==(const reply_packing&, const reply_packing&) = default;
};

/// One chunk of a dense row-major tensor; a whole tensor is the chunk with offset 0 and
/// data.size() == total_bytes. Invariants checked by decode (and by chunker on its input):
/// total_bytes == product(shape) * size_of(type); offset and data.size() are multiples of
/// size_of(type); offset + data.size() <= total_bytes; data is empty only if total_bytes is 0.
/// A packed chunk (compression.type != none) covers compression.elements elements from offset
/// instead, and data is their packed_bytes (validate_tensor has the rules).
struct tensor_chunk {
  dtype type = dtype::float32;
  /// Extent of each axis of the whole tensor (empty: a scalar).
  tensor_shape shape;
  /// Bytes of the whole tensor.
  std::uint64_t total_bytes = 0;
  /// Byte offset of this chunk in the whole tensor.
  std::uint64_t offset = 0;
  /// This chunk's bytes; not owned (see the file comment for whose memory it views).
  std::span<const std::byte> data;
  /// Set when the bytes travel through a shared-memory arena instead of the frame: encode then
  /// writes this reference (data is not copied), and decode sets it and points data into the
  /// arena it was given. Only the data link sets it for sending. Not part of ==.
  std::optional<shm_ref> shm = std::nullopt;
  /// Gradient compression; none: data is the chunk's dense bytes.
  tensor_compression compression = {};
  /// A row-sparse push (troupe.capnp Tensor.rowSparse): the tensor holds shape[0] rows of the
  /// key, whose indices are `row_ids` (int64 little-endian, 8 bytes each, strictly increasing;
  /// not owned, like data). Always whole (one chunk), never packed.
  bool row_sparse = false;
  std::span<const std::byte> row_ids = {};

  /// The bytes of the dense tensor this chunk covers: data.size(), or for a packed chunk
  /// compression.elements * size_of(type).
  std::uint64_t dense_bytes() const noexcept;

  /// Compares the payload bytes, not their addresses: a decoded chunk equals the one encoded.
  friend bool operator==(const tensor_chunk& a, const tensor_chunk& b) noexcept;
};

/// Node -> scheduler: asks to join a job.
struct registration {
  std::uint64_t request_id = 0;
  std::uint32_t protocol_version = wire::protocol_version;
  role node_role = role::worker;
  std::string job_id;
  /// (Registration.authToken is never sent: the connection proved the token in its handshake.)
  std::string host;
  std::uint16_t port = 0;
  /// The rank asked for, or -1 (see troupe.capnp).
  std::int32_t rank_hint = -1;
  /// A server restarted from its checkpoint, for exactly rank_hint (see troupe.capnp).
  bool recovering = false;
  /// A worker that joins the running job is counted from the workers' next barrier on (see
  /// troupe.capnp).
  bool join_at_barrier = false;
  friend bool operator==(const registration&, const registration&) = default;
};

enum class reject_reason : std::uint8_t {
  protocol_version,
  wrong_job,
  bad_token,
  role_full,
  duplicate,
  shutting_down,
  wrong_role,
};

/// A node's secret sealed for it (troupe.capnp Admission.admitted.sealedSecret): AES-256-GCM's
/// 12-byte nonce, 32 bytes of ciphertext, 16-byte tag (actors/logic/node_identity.hpp).
using sealed_secret = std::array<std::uint8_t, 60>;

/// The admission outcome when the node joined.
struct admitted {
  std::uint32_t rank = 0;
  std::uint32_t node_id = 0;
  /// The node's secret (a worker's node key, a server's job secret), sealed under the control
  /// connection's session key. Required on the wire; absent only in a struct not yet filled.
  std::optional<sealed_secret> secret{};
  /// A worker admitted into the running job (troupe.capnp Admitted.joined).
  bool joined = false;
  /// A worker that joined: the id of its first barrier of each group union (index 0..7); empty
  /// or shorter: 1 (troupe.capnp Admitted.firstBarrier).
  std::vector<std::uint64_t> first_barrier;
  friend bool operator==(const admitted&, const admitted&) = default;
};

/// The admission outcome when the node was turned away.
struct rejected {
  reject_reason reason = reject_reason::wrong_job;
  std::string detail;
  friend bool operator==(const rejected&, const rejected&) = default;
};

/// Scheduler -> node: reply to a registration.
struct admission {
  std::uint64_t request_id = 0;
  std::variant<admitted, rejected> outcome;
  friend bool operator==(const admission&, const admission&) = default;
};

struct node_info {
  std::uint32_t node_id = 0;
  role node_role = role::worker;
  std::uint32_t rank = 0;
  std::string host;
  std::uint16_t data_port = 0;
  bool alive = true;
  /// A worker that left the job on its own (troupe.capnp NodeInfo.left); alive stays true.
  bool left = false;
  friend bool operator==(const node_info&, const node_info&) = default;
};

/// "worker 2 (node 13)": how every message names a node.
std::string describe(role node_role, std::uint32_t rank, std::uint32_t node_id);
std::string describe(const node_info& node);
struct node_identity;
/// "worker 1": how messages name the node a connection claims or proved.
std::string describe(const node_identity& who);

/// Keys [begin, end) live on shard `shard_index` of server `server_rank`.
struct key_range {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint32_t server_rank = 0;
  std::uint32_t shard_index = 0;
  friend bool operator==(const key_range&, const key_range&) = default;
};

/// Scheduler -> all nodes: the whole membership table. decode checks that key_ranges are
/// non-empty, sorted by begin, non-overlapping and name a server rank < num_servers.
struct membership {
  std::uint64_t epoch = 0;
  std::uint32_t num_workers = 0;
  std::uint32_t num_servers = 0;
  std::vector<node_info> nodes;
  std::vector<key_range> key_ranges;
  /// Non-zero: a server acknowledges the table once its shards hold it (troupe.capnp
  /// Membership.requestId).
  std::uint64_t request_id = 0;
  friend bool operator==(const membership&, const membership&) = default;
};

struct init {
  std::uint64_t request_id = 0;
  std::uint64_t key = 0;
  tensor_chunk tensor;
  /// The key is row-sparse (troupe.capnp Init.rowSparse).
  bool row_sparse = false;
  friend bool operator==(const init&, const init&) = default;
};

struct push {
  std::uint64_t request_id = 0;
  std::uint64_t key = 0;
  std::uint32_t sender_rank = 0;
  std::uint64_t round = 0;
  tensor_chunk tensor;
  /// Sent again after the server restarted from a checkpoint (see troupe.capnp).
  bool resent = false;
  friend bool operator==(const push&, const push&) = default;
};

struct pull_request {
  std::uint64_t request_id = 0;
  std::uint64_t key = 0;
  std::uint32_t sender_rank = 0;
  std::uint64_t round = 0;
  /// The sender gives up after this many ms; 0: the receiver's own bound.
  std::uint32_t timeout_ms = 0;
  /// A row-sparse pull of the rows `row_ids` (int64 little-endian, strictly increasing; not
  /// owned: it views the sender's memory or the frame, as tensor data does).
  bool row_sparse = false;
  std::span<const std::byte> row_ids = {};
  /// The reply may be packed by this rule (compressed pulls).
  reply_packing reply_compression = {};
  friend bool operator==(const pull_request& a, const pull_request& b) noexcept {
    return a.request_id == b.request_id && a.key == b.key && a.sender_rank == b.sender_rank &&
           a.round == b.round && a.timeout_ms == b.timeout_ms && a.row_sparse == b.row_sparse &&
           std::ranges::equal(a.row_ids, b.row_ids) && a.reply_compression == b.reply_compression;
  }
};

struct pull_reply {
  std::uint64_t request_id = 0;
  std::uint64_t key = 0;
  std::uint64_t round = 0;
  tensor_chunk tensor;
  /// As ack::durable.
  std::uint64_t durable = 0;
  friend bool operator==(const pull_reply&, const pull_reply&) = default;
};

/// MXNet's pushpull: push, then the result of the same round comes back as pull_reply.
struct pushpull {
  std::uint64_t request_id = 0;
  std::uint64_t key = 0;
  std::uint32_t sender_rank = 0;
  std::uint64_t round = 0;
  tensor_chunk tensor;
  /// As pull_request::timeout_ms, for the pull half.
  std::uint32_t timeout_ms = 0;
  /// As push::resent.
  bool resent = false;
  /// As pull_request::reply_compression, for the pull half.
  reply_packing reply_compression = {};
  friend bool operator==(const pushpull&, const pushpull&) = default;
};

struct ack {
  std::uint64_t request_id = 0;
  /// Acks of a push: rounds of the key the shard had completed (the worker's credit); else 0.
  std::uint64_t round = 0;
  /// Acks of a push: it came after its round closed with a quorum and was not applied.
  bool dropped = false;
  /// Acks of a push: the key's rounds (pushes applied) in the shard's last written checkpoint.
  std::uint64_t durable = 0;
  friend bool operator==(const ack&, const ack&) = default;
};

struct barrier {
  std::uint64_t request_id = 0;
  std::uint64_t barrier_id = 0;
  /// A non-zero union of the group:: bits.
  std::uint8_t group = group::workers;
  std::uint32_t sender_node_id = 0;
  /// What the sender shares with the other members; at most max_barrier_values.
  std::vector<double> values;
  /// It ends a worker's init or set_optimizer (see troupe.capnp).
  bool start = false;
  friend bool operator==(const barrier&, const barrier&) = default;
};

/// Most numbers one member shares at a barrier (Barrier.values).
inline constexpr std::size_t max_barrier_values = 64;

/// One member's barrier values, as a release carries them.
struct gathered_values {
  role member_role = role::worker;
  std::uint32_t rank = 0;
  std::vector<double> values;
  friend bool operator==(const gathered_values&, const gathered_values&) = default;
};

struct barrier_release {
  std::uint64_t request_id = 0;
  std::uint64_t barrier_id = 0;
  std::uint8_t group = group::workers;
  /// Every arrived member's values (members with none left out), by role, then rank.
  std::vector<gathered_values> gathered;
  friend bool operator==(const barrier_release&, const barrier_release&) = default;
};

struct optimizer_param {
  std::string name;
  double value = 0.0;
  friend bool operator==(const optimizer_param&, const optimizer_param&) = default;
};

struct set_optimizer {
  std::uint64_t request_id = 0;
  std::string name;
  std::vector<optimizer_param> params;
  friend bool operator==(const set_optimizer&, const set_optimizer&) = default;
};

struct set_gradient_compression {
  std::uint64_t request_id = 0;
  /// "2bit" or "none" (MXNet's names); not interpreted by the codec.
  std::string type;
  double threshold = 0.5;
  friend bool operator==(const set_gradient_compression&,
                         const set_gradient_compression&) = default;
};

enum class command_kind : std::uint8_t {
  stop,
  save_checkpoint,
  load_checkpoint,
  sync_mode,  ///< apply pushes in rounds of all workers (dist_sync)
  async_mode, ///< apply each push as it arrives (dist_async)
};

struct command {
  std::uint64_t request_id = 0;
  command_kind kind = command_kind::stop;
  /// The states file's name for save/load (non-empty there, relative to the server's checkpoint
  /// directory); must be empty for stop.
  std::string path;
  /// save_checkpoint: write the optimizer itself with the states (MXNet's dump_optimizer).
  bool dump_optimizer = false;
  /// stop from a worker: its rounds, the most pushes it made of any one key (Command.rounds).
  std::uint64_t rounds = 0;
  friend bool operator==(const command&, const command&) = default;
};

/// How a job applies pushes (troupe.capnp Consistency).
enum class consistency_mode : std::uint8_t { sync, async };

/// Worker rank 0 -> servers and scheduler: the job's consistency (troupe.capnp SyncSettings).
struct sync_settings {
  std::uint64_t request_id = 0;
  consistency_mode mode = consistency_mode::sync;
  /// 1..num_workers; 0 is refused by decode.
  std::uint32_t quorum = 1;
  bool rescale_quorum = false;
  /// -1: none; s >= 0 bounds how far a worker runs ahead in dist_async.
  std::int64_t max_staleness = -1;
  /// >= 1.
  std::uint32_t max_rounds_ahead = 2;
  friend bool operator==(const sync_settings&, const sync_settings&) = default;
};

/// Either end of a connection: bytes of received frames released since the last credit.
struct link_credit {
  std::uint64_t bytes = 0;
  friend bool operator==(const link_credit&, const link_credit&) = default;
};

struct heartbeat {
  std::uint32_t sender_node_id = 0;
  std::uint64_t sequence = 0;
  std::int64_t timestamp_ns = 0;
  friend bool operator==(const heartbeat&, const heartbeat&) = default;
};

enum class error_code : std::uint8_t {
  bad_frame,
  unknown_key,
  shape_mismatch,
  dtype_mismatch,
  already_initialized,
  stale_round,
  not_admitted,
  unsupported,
  lost_peer,
  timeout,
  shutting_down,
  internal,
  invalid_argument,
  not_permitted,
  /// The key's range has left this server (elastic servers): sent again to the range's new owner.
  moved,
};

/// Reply to a failed request (a protocol message, unlike decode_error, which is local).
struct error_reply {
  std::uint64_t request_id = 0;
  std::optional<std::uint64_t> key;
  error_code code = error_code::internal;
  std::string message;
  friend bool operator==(const error_reply&, const error_reply&) = default;
};

/// A nonce or an HMAC-SHA256 proof of the link handshake (troupe.capnp LinkHello, LinkAuth).
using link_digest = std::array<std::uint8_t, 32>;

/// A node's place in its job: its role and its rank within the role. A worker's data connection
/// claims one in its link hello and proves it with the node's key.
struct node_identity {
  role node_role = role::worker;
  std::uint32_t rank = 0;
  friend bool operator==(const node_identity&, const node_identity&) = default;
};

/// Every connection's first frame from each end (troupe.capnp LinkHello): host identity, arena
/// size (0: no arena), receive window, this end's nonce and, from the connector, its proof of the
/// job token (actors/logic/link_auth.hpp), on a control connection its key share, and on a data
/// connection the node it claims to be with the proof of that node's key.
struct link_hello {
  std::string host_id;
  std::uint64_t arena_bytes = 0;
  /// The sender's receive window in bytes; 0: no credit flow control.
  std::uint64_t window_bytes = 0;
  link_digest nonce{};
  /// Absent in the listener's hello.
  std::optional<link_digest> proof;
  /// The connector's X25519 public key (control connections).
  std::optional<link_digest> key_share = std::nullopt;
  /// The node the connector claims to be (data connections), and its proof of that node's key.
  std::optional<node_identity> identity = std::nullopt;
  std::optional<link_digest> node_proof = std::nullopt;
  friend bool operator==(const link_hello&, const link_hello&) = default;
};

/// Listener -> connector: the listener's proof of the job token, its key share when the connector
/// sent one, and its proof of the claimed node's key when the connector claimed one
/// (troupe.capnp LinkAuth).
struct link_auth {
  link_digest proof{};
  std::optional<link_digest> key_share = std::nullopt;
  std::optional<link_digest> node_proof = std::nullopt;
  friend bool operator==(const link_auth&, const link_auth&) = default;
};

/// Data connections only: the sender's arena for what it sends, to be mapped read-only.
struct arena_offer {
  std::string name;
  std::uint64_t bytes = 0;
  friend bool operator==(const arena_offer&, const arena_offer&) = default;
};

/// Data connections only: reply to arena_offer.
struct arena_accept {
  bool ok = false;
  std::string detail;
  friend bool operator==(const arena_accept&, const arena_accept&) = default;
};

/// Data connections only: shm_ref offsets the receiver no longer reads.
struct arena_release {
  std::vector<std::uint64_t> offsets;
  friend bool operator==(const arena_release&, const arena_release&) = default;
};

/// A message that may travel fused with others in a batch: a worker's keyed requests and a
/// server's answers to them.
using batched = std::variant<push, pull_request, pushpull, ack, pull_reply, error_reply>;

/// Most messages in one batch.
inline constexpr std::size_t max_batch_messages = std::size_t{1} << 16;

/// Several small messages to one peer in one frame (troupe.capnp Message.batch), each handled as
/// if it had come alone, in order. A batch's tensors are whole; inline, or in one region of the
/// sender's arena that starts at the first of them (the data link's choice).
struct batch {
  std::vector<batched> messages;
  friend bool operator==(const batch&, const batch&) = default;
};

/// Scheduler -> server (elastic servers): hand key ranges `ranges` to server `to_server`
/// (troupe.capnp HandOver). Answered by ack or error_reply.
struct hand_over {
  std::uint64_t request_id = 0;
  std::vector<std::uint32_t> ranges;
  std::uint32_t to_server = 0;
  friend bool operator==(const hand_over&, const hand_over&) = default;
};

/// Server -> server: one shard's encoded hand-over as the int64 words of `tensor`, `bytes` of
/// which are the snapshot (troupe.capnp RangeData). Answered by ack or error_reply.
struct range_data {
  std::uint64_t request_id = 0;
  std::uint32_t shard = 0;
  std::uint64_t bytes = 0;
  tensor_chunk tensor;
  friend bool operator==(const range_data&, const range_data&) = default;
};

/// Any frame's content. The alternatives' order is not the wire order (the codec maps them).
using message = std::variant<registration, admission, membership, init, push, pull_request,
                             pull_reply, pushpull, ack, barrier, barrier_release, set_optimizer,
                             set_gradient_compression, command, heartbeat, error_reply, link_hello,
                             arena_offer, arena_accept, arena_release, sync_settings, link_credit,
                             link_auth, batch, hand_over, range_data>;

/// A batched message as a message of its own (moved out).
message unbatched(batched&& one);
/// Whether `msg` may travel in a batch (a push, pull_request, pushpull, ack, pull_reply or
/// error_reply), and then it, moved out.
std::optional<batched> to_batched(message&& msg);

/// True for the frames a connection handles itself (link_hello, link_auth, arena_*,
/// link_credit): never
/// forwarded.
bool is_link_control(const message& msg) noexcept;

/// "push", "pull_reply", ...: the alternative's name, for logs and error messages.
std::string_view kind_name(const message& msg) noexcept;

/// The request id of a message that carries one (replies echo it), else 0.
std::uint64_t request_id_of(const message& msg) noexcept;
/// The request id field itself, to rewrite it (a fan-out renumbers requests), else nullptr.
std::uint64_t* request_id_field(message& msg) noexcept;
/// The key of a message that names one (init, push, pull_request, pull_reply, pushpull, and an
/// error_reply about a key), else nullopt.
std::optional<std::uint64_t> key_of(const message& msg) noexcept;

/// The tensor a message carries (init, push, pushpull, pull_reply), or nullptr.
const tensor_chunk* tensor_of(const message& msg) noexcept;
tensor_chunk* tensor_of(message& msg) noexcept;
/// The same for a message of a batch.
const tensor_chunk* tensor_of(const batched& msg) noexcept;
tensor_chunk* tensor_of(batched& msg) noexcept;

} // namespace troupe::wire

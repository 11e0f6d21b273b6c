// The data server and data link brokers (see data_link.hpp for the contract and
// data_link_framing.hpp for how bytes become frames and back).
//
// Everything here runs on the middleman's I/O thread: CAF schedules brokers on the multiplexer,
// so the socket callbacks (new_data_msg, data_transferred_msg) and the mailbox (envelopes from
// shards or from the worker) are handled by one thread, and the connection state needs no lock.
// The one exception is a client link with a link_lane (data_link.hpp): its owner's threads may
// stage a small frame and send it on the lane's own descriptor, so that broker holds the lane's
// lock in every handler, and writes nothing while such a send is under way (sending_elsewhere).
//
// Write pacing: the brokers turn on ack_writes, so CAF reports every write the socket took with
// the bytes still in its buffers (data_transferred_msg::remaining). A connection hands CAF at
// most max_bytes_in_flight, in write_chunk_bytes steps, and tops up on each report: the socket
// always has the next chunk ready while tensors wait in the queue uncopied. When CAF holds none
// of a connection's bytes, what is admitted goes straight to the socket with one non-blocking
// send (write_directly), at most direct_write_bytes; what the socket does not take goes to CAF's
// write buffer as above. No timer delays a small frame.
//
// Receive credit: what the peer's window admits goes to CAF, the rest waits in the connection's
// frame_send_queue (data_link_framing.hpp). Received frames are counted by the connection's
// receive_credit; when enough of them are released (on any thread) it wakes the broker with
// released_atom, which also carries the shared-memory releases, and the broker sends a
// link_credit.
//
// Per connection, the link protocol (frames capped at max_handshake_frame_bytes until
// authenticated; the whole handshake within tuning.handshake_timeout):
//
//   listener: open ──our hello──> awaiting the connector's hello ──its hello, proofs good──>
//             our link_auth ──> serving
//                  (require_node_proof, no job secret yet: held ──the secret──> checked as above)
//   connector: open ──> awaiting the listener's hello ──its hello──> our hello with our proofs ──>
//             awaiting link_auth ──its proofs good──> serving
//     (our data frames wait throughout; any other frame: fatal; a missing or wrong proof, a lost
//      node: refused)
//   serving: a second hello or link_auth, a frame beyond the window, an excess credit: fatal
//   fatal: error_reply{bad_frame}, refused: error_reply{not_admitted} (unmetered, frames waiting
//          for credit dropped), then closed once the socket took it (at the latest at the second
//          check_frames), abortively
//
// Receive budget (server): each authenticated connection's frame_receiver claims the budget
// before each read; a connection whose claim waits is stopped (stop_if_waiting) and queued in
// waiting_for_budget, and resume_waiting gives every queued connection its turn when the budget
// wakes the broker (budget_atom). Every check_interval the broker checks its connections
// (check_frames): stalled or too slow frames, peers that take none of their replies, closing
// connections whose peer takes nothing. A peer closed for its behaviour is reset at once
// (close_abortively) and named in a warning (closure_log).
//
// Under TLS (tuning.tls; actors/logic/link_tls.hpp) all of this runs on plaintext: a connection
// first completes its TLS handshake (the listener's hello waits in its queue until then), socket
// reads are ciphertext that read_sealed decrypts into the frame receiver's reads, and pump_sealed
// encrypts what pump would append. A failed TLS session closes the connection after its alert.

#include "actors/data_link.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <sys/socket.h>
#include <unistd.h>
#include <unordered_map>
#include <utility>
#include <vector>

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/broker.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/network/multiplexer.hpp>
#include <caf/io/receive_policy.hpp>
#include <caf/io/system_messages.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/config/local_address.hpp"
#include "actors/io_spin.hpp"
#include "actors/logic/data_link_framing.hpp"
#include "actors/logic/hop_probe.hpp"
#include "actors/logic/link_tls.hpp"
#include "actors/logic/node_identity.hpp"
#include "actors/logic/scheduler_core.hpp"
#include "actors/logic/shm_arena.hpp"
#include "actors/logic/tcp_progress.hpp"

namespace troupe {

namespace {

using caf::io::connection_handle;
using caf::io::receive_policy;

/// To a broker from itself, tuning.handshake_timeout after a connection opened (the uint64 id on
/// a server): close it if its handshake is not done.
using handshake_deadline_atom = caf::atom_constant<caf::atom("handshake")>;
/// To a broker, from whichever thread released something that connection (uint64 id) received: a
/// tensor viewing the peer's arena, or enough frame bytes for a link credit. Send the arena
/// releases and the credit.
using released_atom = caf::atom_constant<caf::atom("released")>;
/// To a server broker, from whichever thread released bytes of its receive budget after a frame
/// had to wait for it: let waiting connections read on.
using budget_atom = caf::atom_constant<caf::atom("budget")>;
/// A server broker's own message: write the replies it held back (defer_writes).
using flush_writes_atom = caf::atom_constant<caf::atom("flushwr")>;
/// To a server broker, posted from itself through the multiplexer: connection (uint64 id) got the
/// budget it waited for, start reading its socket again (read_again).
using read_again_atom = caf::atom_constant<caf::atom("readagain")>;
/// To a server broker from itself, every quarter of stalled_frame_timeout (and of frame_grace):
/// close connections that began a frame and went silent or are too slow, or do not read.
using stall_check_atom = caf::atom_constant<caf::atom("stalls")>;

/// Activity tokens of a server connection's scribe: so many that they never run out. With
/// tokens, a read handler can stop the scribe reading right after its own read (stop_reading);
/// without, CAF would go on reading the socket in the same event.
constexpr std::size_t unlimited_reads = std::numeric_limits<std::size_t>::max() / 2;

/// Offsets per arena_release frame: 32 KiB of them, well below max_link_control_frame_bytes, the
/// most a peer beyond its window reads of a control frame.
constexpr std::size_t max_releases_per_frame = 4096;

/// One connection's receiving and sending state, the same for both broker kinds.
struct link_connection {
  /// `name`: "data server: connection 3" or "data link to host:port", for the log. `waker`: what
  /// a release of something this connection received runs, on any thread (it wakes the broker).
  link_connection(std::uint64_t connection_id, connection_handle handle, bool accepted,
                  std::string name, std::function<void()> waker,
                  std::shared_ptr<receive_buffer_pool> pool, const data_link_tuning& tuning)
      : id(connection_id), hdl(handle), listener(accepted), who(std::move(name)),
        wake(std::move(waker)),
        credit(std::make_shared<receive_credit>(tuning.receive_window_bytes)),
        receiver(std::move(pool), tuning.limits, credit) {
    credit->on_release(wake);
    receiver.set_max_frame_bytes(
        std::min(max_handshake_frame_bytes, tuning.limits.max_frame_bytes));
  }

  std::uint64_t id;
  connection_handle hdl;
  /// This end accepted the connection: it says hello first and checks the connector's proof.
  bool listener;
  std::string who;
  /// The peer's "address:port", for messages that name it (a server's connections).
  std::string peer;
  /// Bytes the socket handed the broker in total (ciphertext under TLS): what the kernel
  /// received beyond them sits in CAF's read buffer, part of a read not yet complete.
  std::uint64_t delivered = 0;
  std::function<void()> wake;
  /// Our receive window: what the peer sent and we have not released or credited.
  std::shared_ptr<receive_credit> credit;
  frame_receiver receiver;
  /// What we send, and the peer's window.
  frame_send_queue queue;
  /// Bytes handed to CAF that the socket has not taken yet (CAF's own count, refreshed by every
  /// data_transferred_msg, plus what was appended since), and `unsent`.
  std::size_t in_flight = 0;
  /// What a send from another thread (link_lane) left over: the broker appends it to CAF's buffer
  /// before anything else (pump), as only the broker's thread may. While such a send is under way
  /// (`sending_elsewhere`) the broker writes nothing.
  std::vector<char> unsent;
  bool sending_elsewhere = false;
  /// The peer broke the framing or the link protocol: whatever else arrives is ignored, nothing
  /// more is queued, and the connection closes as soon as the admitted frames (the error_reply
  /// last) are in CAF's buffer, which CAF still sends.
  bool closing = false;
  /// We sent our link hello (always our first frame), as `our_hello`.
  bool hello_sent = false;
  wire::link_hello our_hello;
  /// The peer's link hello arrived, as `their_hello`.
  bool peer_hello = false;
  wire::link_hello their_hello;
  /// The handshake is done (the peer proved the job token, and at the connector the listener
  /// did): the peer's window is open and frames may be as large as limits.max_frame_bytes.
  bool authenticated = false;
  /// Key exchange (tuning.key_exchange): the connector's key pair, until link_auth brings the
  /// listener's share; then, at both ends, the connection's session key.
  std::unique_ptr<key_exchange> exchange;
  session_key session;
  /// A server's connection under require_node_proof: the peer proved the token and claims a node
  /// (`their_hello.identity`), but the job secret to check its node proof has not arrived.
  bool held = false;
  /// The node the peer proved to be (a server's connection under require_node_proof), and
  /// whether the server counts this connection among that worker's (server_state::per_worker).
  std::optional<wire::node_identity> proven;
  bool counted = false;

  // Same-host fast path (shm_arena.hpp).
  /// Our arena for what we send: created and offered; used once the peer accepted it (tx_on).
  std::unique_ptr<shm_send_arena> tx;
  bool tx_on = false;
  /// The peer's arena, mapped read-only, once we accepted its offer.
  std::shared_ptr<shm_peer_arena> rx;
  /// The peer's link hello showed our host identity.
  bool peer_same_host = false;

  /// TLS (link_tls.hpp): the session, and the frame receiver's read being filled from it (what
  /// the scribe's read buffer is without TLS). read_bytes: the socket read configured.
  std::unique_ptr<tls_session> tls;
  std::vector<char> plain;
  std::size_t read_bytes = 0;
  /// Without TLS, small frames are read coalesced (feed_plain): the socket is read for whatever
  /// has arrived, up to coalesced_read_bytes, and the frame receiver's reads are filled from it
  /// into `plain`, of which plain_filled bytes have arrived. A large body is read exactly, straight
  /// into the receiver's buffer (coalescing false). `unread`: what a coalesced read brought beyond
  /// the point where the receiver stopped to wait for the budget (at most one read's bytes).
  bool coalescing = false;
  /// A server's connection is in server_state::deferred_writes.
  bool writes_deferred = false;
  /// A server's replies held to travel fused in one batch frame (queue_reply_envelope), what
  /// their tensors view, and those tensors' bytes. Sealed into the queue before anything else is
  /// queued (encode_into, queue_unmetered), so the order of frames is kept.
  wire::batch fusing;
  std::vector<std::shared_ptr<const void>> fusing_keepalive;
  std::size_t fusing_bytes = 0;
  std::size_t plain_filled = 0;
  std::vector<char> unread;
  /// The last body announced was large: the next prefix is read exactly, so that a stream of
  /// large frames is never read coalesced (which would copy their bodies).
  bool last_body_large = false;

  /// A server's requests from this peer that wait, in order, while more than
  /// max_send_queue_bytes of replies wait for it (route_parked); each holds its frame, so the
  /// peer's window bounds them.
  std::deque<envelope> parked;
  /// Bytes the socket has taken, in all (from CAF's buffer, data_transferred_msg, or from
  /// write_directly); at the last stall check; and since when none were taken while the peer's
  /// replies were backed up (close_stalled).
  std::uint64_t bytes_taken = 0;
  std::uint64_t taken_at_check = 0;
  std::chrono::steady_clock::time_point stuck_since{};
  /// Why a closing connection closes once its last frames (the error reply, a TLS alert) are
  /// taken by the socket; how many frame checks found it still closing (at the second its peer,
  /// which does not take them, is cut off); and whether what the TLS session would still write
  /// is lost (it failed).
  std::string closing_why;
  int closing_checks = 0;
  bool sealed_off = false;

  /// The rate rule's view of the frame in progress (check_frames).
  struct frame_clock {
    /// A frame is being timed, which one (frame_receiver::frames_read when it was first seen),
    /// the bytes the kernel had received on the connection then, and when it was last checked.
    bool running = false;
    std::uint64_t frame = 0;
    std::uint64_t bytes_at_start = 0;
    std::chrono::steady_clock::time_point checked{};
    /// Time that counts against the peer since it was first seen: not while the connection
    /// waited for the budget or this process left bytes of it unread.
    std::chrono::steady_clock::duration peer_time{};
  } clock;

  link_connection(const link_connection&) = delete;
  link_connection& operator=(const link_connection&) = delete;
  ~link_connection() {
    // Envelopes may still hold received frames, and tensors may still view the peer's arena (the
    // mapping stays until they go); their releases have nowhere to go now.
    credit->on_release({});
    if (rx)
      rx->detach();
  }
};

std::optional<error> check_tuning(const data_link_tuning& tuning, const char* who) {
  if (tuning.write_chunk_bytes == 0 || tuning.max_bytes_in_flight == 0)
    return error{errc::invalid_argument,
                 std::string(who) + ": write_chunk_bytes and max_bytes_in_flight must be positive"};
  if (tuning.limits.max_frame_bytes < 16)
    return error{errc::invalid_argument, std::string(who) + ": limits.max_frame_bytes of " +
                                             std::to_string(tuning.limits.max_frame_bytes) +
                                             " bytes is below the smallest frame (16)"};
  return std::nullopt;
}

/// process_link_refusals(): every connection of the process counts here.
std::atomic<std::uint64_t> refused_frames{0};
std::atomic<std::uint64_t> closed_peers{0};
/// process_link_tensor_bytes(): likewise.
std::atomic<std::uint64_t> socket_tensor_bytes_sent{0};
std::atomic<std::uint64_t> socket_tensor_bytes_received{0};
std::atomic<std::uint64_t> shm_tensor_bytes_sent{0};
std::atomic<std::uint64_t> shm_tensor_bytes_received{0};

/// Counts a tensor payload of a frame queued (`sent`) or handed on, by the way it travels.
void count_tensor_bytes(const wire::message& msg, bool sent) {
  if (const auto* fused = std::get_if<wire::batch>(&msg)) {
    std::uint64_t socket_bytes = 0, shm_bytes = 0;
    for (const auto& one : fused->messages)
      if (const auto* t = wire::tensor_of(one))
        (t->shm ? shm_bytes : socket_bytes) += t->data.size();
    (sent ? socket_tensor_bytes_sent : socket_tensor_bytes_received)
        .fetch_add(socket_bytes, std::memory_order_relaxed);
    (sent ? shm_tensor_bytes_sent : shm_tensor_bytes_received)
        .fetch_add(shm_bytes, std::memory_order_relaxed);
    return;
  }
  const auto* tensor = wire::tensor_of(msg);
  if (tensor == nullptr || tensor->data.empty())
    return;
  auto& counter = tensor->shm ? (sent ? shm_tensor_bytes_sent : shm_tensor_bytes_received)
                              : (sent ? socket_tensor_bytes_sent : socket_tensor_bytes_received);
  counter.fetch_add(tensor->data.size(), std::memory_order_relaxed);
}

wire::message bad_frame_reply(const wire::decode_error& why) {
  return wire::error_reply{0, std::nullopt, wire::error_code::bad_frame,
                           "bad frame: " + std::string(wire::to_string(why.kind)) + ": " +
                               why.message};
}

/// Why a peer broke the link protocol, or was refused: a proof it gave does not check out, or it
/// may not connect at all (a lost node). Either ends the connection.
struct link_violation {
  std::string why;
  /// A refusal (answered error_reply{not_admitted}), not a malformed exchange (bad_frame).
  bool refusal = false;
};

/// The reply a request gets when it cannot be handled or answered at all; a batch's messages get
/// one each, in a batch.
wire::message failure_reply(const wire::message& request, wire::error_code code, std::string why) {
  if (const auto* fused = std::get_if<wire::batch>(&request)) {
    wire::batch replies;
    for (const auto& one : fused->messages)
      replies.messages.push_back(std::visit(
          [&](const auto& m) -> wire::batched {
            std::optional<std::uint64_t> key;
            if constexpr (requires { m.key; })
              key = m.key;
            return wire::error_reply{m.request_id, key, code, why};
          },
          one));
    return replies;
  }
  return wire::error_reply{wire::request_id_of(request), wire::key_of(request), code,
                           std::move(why)};
}

/// Encodes `msg` for the wire, or says why it cannot go: encode refused it, or it is bigger than
/// the peer accepts (our own limit: both ends of a job use one configuration). On a connection
/// with an accepted arena, a tensor payload of at least shm_threshold_bytes is copied into a
/// region of the arena (instead of into CAF's write buffer later) and the frame references it,
/// and so are the tensors of a batch that hold that much together (batch_into_arena); when the
/// ring has no room they go inline, as without an arena.
void seal_fused(link_connection& c, const data_link_tuning& tuning);

/// Copies the tensors of batch `fused` into one region of the arena when they hold at least
/// shm_threshold_bytes together, each at a 64-byte boundary and the first at the region's start:
/// the receiver holds that offset for the whole batch and releases it when the last of the
/// batch's messages is done (data_link_framing.cpp, frame_receiver::deliver). Returns the
/// region, or nothing when the batch stays inline (no arena, too little, no room).
std::optional<std::size_t> batch_into_arena(link_connection& c, wire::batch& fused,
                                            const data_link_tuning& tuning) {
  constexpr std::size_t boundary = 64;
  const auto padded = [](std::size_t bytes) {
    return (bytes + boundary - 1) / boundary * boundary;
  };
  std::size_t total = 0;
  for (auto& one : fused.messages)
    if (auto* t = wire::tensor_of(one)) {
      t->shm.reset(); // an echo of a received tensor references the peer's arena, not ours
      total += padded(t->data.size());
    }
  if (!c.tx_on || total < tuning.shm_threshold_bytes || total >= tuning.limits.max_frame_bytes)
    return std::nullopt;
  const auto region = c.tx->allocate(total);
  if (!region)
    return std::nullopt;
  auto arena = c.tx->bytes();
  std::size_t at = *region;
  for (auto& one : fused.messages) {
    auto* t = wire::tensor_of(one);
    // A tensor of no bytes stays inline (Tensor.shm with 0 bytes means none).
    if (t == nullptr || t->data.empty())
      continue;
    const std::size_t size = t->data.size();
    auto into = arena.subspan(at, size);
    std::memcpy(into.data(), t->data.data(), size);
    t->shm = wire::shm_ref{at, size};
    t->data = into;
    at += padded(size);
  }
  return region;
}

std::optional<std::string> encode_into(link_connection& c, wire::message& msg,
                                       std::shared_ptr<const void> keepalive,
                                       const data_link_tuning& tuning) {
  seal_fused(c, tuning);
  std::optional<std::size_t> region;
  if (auto* tensor = wire::tensor_of(msg)) {
    // A received tensor forwarded as it is (an echo) references the peer's arena, not ours.
    tensor->shm.reset();
    const std::size_t size = tensor->data.size();
    // A payload that could not go inline is refused below as without an arena, so that a
    // caller's mistake does not depend on where the peer runs.
    if (c.tx_on && size >= tuning.shm_threshold_bytes && size < tuning.limits.max_frame_bytes)
      region = c.tx->allocate(size);
    if (region) {
      auto into = c.tx->bytes().subspan(*region, size);
      std::memcpy(into.data(), tensor->data.data(), size);
      tensor->shm = wire::shm_ref{*region, size};
      tensor->data = into;
      keepalive.reset(); // the caller's memory is not read again
    }
  } else if (auto* fused = std::get_if<wire::batch>(&msg)) {
    region = batch_into_arena(c, *fused, tuning);
    if (region)
      keepalive.reset();
  }
  auto give_back = [&] {
    if (region)
      c.tx->release(*region);
  };
  try {
    auto frame = wire::encode(msg);
    if (frame.body_size() > tuning.limits.max_frame_bytes) {
      give_back();
      return std::string(wire::kind_name(msg)) + " frame of " + std::to_string(frame.body_size()) +
             " bytes exceeds max_frame_bytes " + std::to_string(tuning.limits.max_frame_bytes) +
             "; split the tensor (wire::chunker)";
    }
    c.queue.push(std::move(frame), std::move(keepalive));
    count_tensor_bytes(msg, true);
    return std::nullopt;
  } catch (const std::exception& e) {
    give_back();
    return std::string("cannot encode ") + std::string(wire::kind_name(msg)) + ": " + e.what();
  }
}

/// Queues a frame without a tensor (an error reply) behind the others, to go when the peer's
/// window admits it; these are small and always encodable.
void queue_reply(link_connection& c, wire::message reply, const data_link_tuning& tuning) {
  if (auto why = encode_into(c, reply, nullptr, tuning))
    tuning.log.info("data link: dropping a " + std::string(wire::kind_name(reply)) + ": " + *why);
}

/// Whether a reply may wait in link_connection::fusing: an ack, an error, or the whole value of a
/// small key (fuse_item_bytes), which then travels inline.
bool fusable_reply(const wire::message& reply, const data_link_tuning& tuning) {
  if (tuning.fuse_frame_bytes == 0)
    return false;
  if (std::holds_alternative<wire::ack>(reply) || std::holds_alternative<wire::error_reply>(reply))
    return true;
  const auto* value = std::get_if<wire::pull_reply>(&reply);
  return value != nullptr && value->tensor.offset == 0 &&
         value->tensor.data.size() == value->tensor.total_bytes &&
         value->tensor.data.size() <= tuning.fuse_item_bytes;
}

/// Queues the replies held in c.fusing: one batch frame, or the reply alone when it is one.
void seal_fused(link_connection& c, const data_link_tuning& tuning) {
  if (c.fusing.messages.empty())
    return;
  wire::message fused;
  if (c.fusing.messages.size() == 1)
    fused = wire::unbatched(std::move(c.fusing.messages.front()));
  else
    fused = std::move(c.fusing);
  c.fusing = {};
  c.fusing_bytes = 0;
  // A batch's tensors are copied into its frame: what they view may go once it is encoded.
  auto keepalive = std::move(c.fusing_keepalive);
  c.fusing_keepalive = {};
  auto why = encode_into(c, fused, keepalive.size() == 1 ? keepalive.front() : nullptr, tuning);
  if (!why)
    return;
  // Every request answered here waits for its answer: each is told why none comes.
  tuning.log.info("data server: " + *why);
  queue_reply(c, failure_reply(fused, wire::error_code::internal, *why), tuning);
}

/// Queues a frame that needs no credit: link control, or the last error reply of a connection
/// that closes. It goes ahead of the frames waiting for credit.
void queue_unmetered(link_connection& c, const wire::message& msg, const data_link_tuning& tuning) {
  seal_fused(c, tuning);
  try {
    c.queue.push_unmetered(wire::encode(msg));
  } catch (const std::exception& e) {
    tuning.log.info("data link: dropping a " + std::string(wire::kind_name(msg)) + ": " + e.what());
  }
}

/// pump under TLS: what the session says on its own (handshake, alerts) goes first; admitted
/// bytes are sealed into records once the handshake is done, a tensor's straight from its memory
/// and small pieces (prefixes, message headers) gathered into one record. The bound counts
/// ciphertext, as CAF's reports do. Returns why the session cannot send, if it cannot.
std::optional<std::string> pump_sealed(caf::io::abstract_broker* self, link_connection& c,
                                       const data_link_tuning& tuning) {
  // A TLS record holds at most 16 KiB and adds 22 bytes.
  constexpr std::size_t record_bytes = std::size_t{16} << 10;
  // One gathering buffer per thread, however many connections.
  thread_local std::vector<char> gathered;
  for (;;) {
    auto& out = self->wr_buf(c.hdl);
    const std::size_t before = out.size();
    c.tls->drain(out);
    if (c.tls->established() && c.queue.ready() && c.in_flight < tuning.max_bytes_in_flight) {
      const std::size_t budget =
          std::min(tuning.write_chunk_bytes, tuning.max_bytes_in_flight - c.in_flight);
      out.reserve(out.size() + budget + (budget / record_bytes + 2) * 32);
      std::optional<std::string> failed;
      auto seal = [&](std::span<const char> bytes) {
        if (!failed)
          failed = c.tls->seal(bytes, out);
      };
      gathered.clear();
      c.queue.write_to(
          [&](std::span<const char> piece) {
            if (piece.size() >= record_bytes) {
              if (!gathered.empty())
                seal(gathered);
              gathered.clear();
              seal(piece);
              return;
            }
            gathered.insert(gathered.end(), piece.begin(), piece.end());
            if (gathered.size() >= record_bytes) {
              seal(gathered);
              gathered.clear();
            }
          },
          budget);
      if (!gathered.empty())
        seal(gathered);
      if (failed)
        return failed;
    }
    const std::size_t added = out.size() - before;
    if (added == 0)
      return std::nullopt;
    c.in_flight += added;
    self->flush(c.hdl);
  }
}

/// The most write_directly sends at once.
constexpr std::size_t direct_write_bytes = std::size_t{64} << 10;

/// Sends admitted bytes (at most direct_write_bytes) straight to the socket, when CAF's buffers
/// hold none of the connection's, so that nothing is overtaken: a small frame then costs one
/// send, where CAF's write takes a round of the multiplexer (registering the socket for writing,
/// waking for it, writing, unregistering: two epoll_ctl and an epoll_wait more) and a
/// data_transferred_msg. What the socket does not take now goes to CAF's buffer, in order. The
/// descriptor is CAF's (hdl.id()), open while the broker holds the scribe; a failed send leaves
/// the bytes to CAF, whose write fails the same way and reports the connection closed.
void write_directly(caf::io::abstract_broker* self, link_connection& c) {
  if (c.in_flight != 0 || !c.queue.ready() || !self->valid(c.hdl))
    return;
  thread_local std::vector<char> staged;
  staged.clear();
  c.queue.append_to(staged, direct_write_bytes);
  const auto sent = ::send(static_cast<int>(c.hdl.id()), staged.data(), staged.size(),
                           MSG_DONTWAIT | MSG_NOSIGNAL);
  const std::size_t taken = sent > 0 ? static_cast<std::size_t>(sent) : 0;
  c.bytes_taken += taken;
  if (taken == staged.size())
    return;
  auto& out = self->wr_buf(c.hdl);
  out.insert(out.end(), staged.begin() + static_cast<std::ptrdiff_t>(taken), staged.end());
  c.in_flight += staged.size() - taken;
  self->flush(c.hdl);
}

/// Hands admitted bytes to the socket or to CAF while the in-flight bound allows, flushing each
/// step. Returns why the connection must close (its TLS session failed), if it must.
std::optional<std::string> pump(caf::io::abstract_broker* self, link_connection& c,
                                const data_link_tuning& tuning) {
  if (c.tls)
    return pump_sealed(self, c, tuning);
  if (c.sending_elsewhere)
    return std::nullopt; // its end wakes the broker
  if (!c.unsent.empty()) {
    auto& out = self->wr_buf(c.hdl);
    out.insert(out.end(), c.unsent.begin(), c.unsent.end());
    c.unsent.clear();
    self->flush(c.hdl);
  }
  write_directly(self, c);
  while (c.queue.ready() && c.in_flight < tuning.max_bytes_in_flight) {
    const std::size_t budget =
        std::min(tuning.write_chunk_bytes, tuning.max_bytes_in_flight - c.in_flight);
    c.in_flight += c.queue.append_to(self->wr_buf(c.hdl), budget);
    // Starts the write when the socket is idle; otherwise CAF swaps this buffer in when the
    // current one is written, so the next chunk is always ready.
    self->flush(c.hdl);
  }
  return std::nullopt;
}

/// What a socket read under TLS came to.
struct sealed_read {
  /// `consume` returned 0: the connection is closing or gone; do not touch it.
  bool stopped = false;
  /// The TLS session failed: why the connection must close.
  std::optional<std::string> broken;
};

/// A socket read under TLS: its ciphertext may hold handshake messages, many frames or part of
/// one. Runs `on_established` when it completes the TLS handshake, then decrypts into exactly the
/// reads the frame receiver asks for, handing each complete one to `consume`, which returns the
/// size of the next (0: stop).
sealed_read decrypt_kept(link_connection& c,
                         const std::function<std::size_t(std::vector<char>&)>& consume);

sealed_read read_sealed(link_connection& c, const std::vector<char>& cipher,
                        const std::function<void()>& on_established,
                        const std::function<std::size_t(std::vector<char>&)>& consume) {
  const bool was_established = c.tls->established();
  if (auto failed = c.tls->take(cipher))
    return {false, std::move(failed)};
  if (!was_established && c.tls->established())
    on_established();
  return decrypt_kept(c, consume);
}

/// The decrypting half of read_sealed: what the session holds, into the reads the frame
/// receiver asks for (also after a reader waited for the budget, with no new ciphertext).
sealed_read decrypt_kept(link_connection& c,
                         const std::function<std::size_t(std::vector<char>&)>& consume) {
  while (c.tls->established()) {
    auto full = c.tls->fill(c.plain);
    if (!full)
      return {false, full.error().message()};
    if (!*full)
      break;
    const std::size_t next = consume(c.plain);
    if (next == 0)
      return {true, std::nullopt};
    c.plain.resize(next);
  }
  return {};
}

/// Starts TLS on a new connection (a connector's ClientHello is then ready to pump), or plaintext
/// reads of the first frame prefix.
void start_reading(caf::io::abstract_broker* self, link_connection& c,
                   const data_link_tuning& tuning) {
  if (tuning.tls.enabled()) {
    c.tls = std::make_unique<tls_session>(tuning.tls, c.listener);
    c.plain.resize(frame_receiver::first_read);
    c.read_bytes = handshake_read_bytes;
    self->configure_read(c.hdl, receive_policy::at_most(c.read_bytes));
  } else {
    self->configure_read(c.hdl, receive_policy::exactly(frame_receiver::first_read));
  }
}

/// Under TLS, reads grow from about a record to tls_read_bytes once the peer is authenticated.
void widen_reads(caf::io::abstract_broker* self, link_connection& c) {
  if (c.tls && c.authenticated && c.read_bytes != tls_read_bytes) {
    c.read_bytes = tls_read_bytes;
    self->configure_read(c.hdl, receive_policy::at_most(c.read_bytes));
  }
}

/// Without TLS, a read of the socket for small frames takes whatever has arrived, up to this:
/// many frames per system call when they queue up (a worker's many small keys, a server's
/// replies), instead of a prefix read and a body read per frame.
constexpr std::size_t coalesced_read_bytes = std::size_t{64} << 10;
/// A body (or the rest of one) of at least this many bytes is read by the socket whole, into the
/// frame receiver's pooled buffer, without a copy.
constexpr std::size_t exact_read_bytes = std::size_t{64} << 10;

/// Feeds `bytes`, a coalesced read, to the frame receiver in exactly the reads it asks for
/// (c.plain, filled across socket reads). `consume` hands a full read on and returns the size of
/// the next, 0 to stop: the connection waits for the budget, is closing, or is gone, and `c`
/// must not be touched then. Returns how many of `bytes` were fed and whether it stopped.
template <class Consume>
std::pair<std::size_t, bool> feed_plain(link_connection& c, std::span<const char> bytes,
                                        Consume&& consume) {
  std::size_t at = 0;
  while (at < bytes.size()) {
    const std::size_t take = std::min(bytes.size() - at, c.plain.size() - c.plain_filled);
    std::memcpy(c.plain.data() + c.plain_filled, bytes.data() + at, take);
    c.plain_filled += take;
    at += take;
    if (c.plain_filled < c.plain.size())
      break;
    c.plain_filled = 0;
    const std::size_t next = consume(c.plain);
    if (next == 0)
      return {at, true};
    c.plain.resize(next);
  }
  return {at, false};
}

/// Without TLS, once the frame receiver asked for `next` bytes (c.plain_filled of them in hand
/// when coalescing): configures the socket's next read. A large body with nothing of it in hand
/// is read exactly into the receiver's buffer, which goes to the scribe (`scribe_buffer`, the
/// handler's new_data_msg::buf; null outside a read handler, where the scribe's buffer cannot be
/// swapped: the body is then read exactly into the scribe's and copied). Everything else is read
/// coalesced.
void read_plain_next(caf::io::abstract_broker* self, link_connection& c,
                     std::vector<char>* scribe_buffer, std::size_t next) {
  const bool body = c.receiver.body_bytes() != 0;
  if (body)
    c.last_body_large = c.receiver.body_bytes() >= exact_read_bytes;
  const std::size_t in_hand = c.coalescing ? c.plain_filled : 0;
  const std::size_t missing = next - in_hand;
  const bool exact = body ? missing >= exact_read_bytes : c.last_body_large;
  if (exact && in_hand == 0 && (!c.coalescing || scribe_buffer != nullptr)) {
    if (c.coalescing) {
      std::swap(*scribe_buffer, c.plain);
      c.coalescing = false;
    }
    self->configure_read(c.hdl, receive_policy::exactly(next));
    return;
  }
  if (!c.coalescing) {
    // The receiver's buffer for this read (the scribe's until now) becomes `plain`.
    if (scribe_buffer != nullptr)
      std::swap(*scribe_buffer, c.plain);
    c.plain.resize(next);
    c.plain_filled = 0;
    c.coalescing = true;
  }
  self->configure_read(c.hdl, exact ? receive_policy::exactly(missing)
                                    : receive_policy::at_most(coalesced_read_bytes));
}

// ================================================================================================
// the link protocol: the link-control frames, the same at both ends

/// Queues our link hello: host identity, arena size (0 when we cannot tell our host), our receive
/// window, a fresh nonce and, from the connector (the listener's hello has arrived by then), the
/// proof of the job token over both hellos, our key share (tuning.key_exchange) and the node we
/// claim to be with the proof of its key (tuning.node). Always the first frame a connection
/// sends. Throws when the nonce, a key or a proof cannot be made.
void queue_hello(link_connection& c, const data_link_tuning& tuning) {
  if (c.hello_sent)
    return;
  const std::string& id = host_identity();
  c.our_hello = wire::link_hello{
      id.empty() ? std::string("unknown") : id,
      id.empty() ? 0 : static_cast<std::uint64_t>(tuning.shm_arena_bytes),
      static_cast<std::uint64_t>(tuning.receive_window_bytes), fresh_nonce(), std::nullopt};
  if (!c.listener) {
    if (tuning.key_exchange) {
      c.exchange = std::make_unique<key_exchange>();
      c.our_hello.key_share = c.exchange->share();
    }
    if (tuning.node)
      c.our_hello.identity = tuning.node->who;
    c.our_hello.proof = link_proof(tuning.secret, false, c.their_hello, c.our_hello);
    if (tuning.node)
      c.our_hello.node_proof = node_proof(tuning.node->key, false, c.their_hello, c.our_hello);
  }
  c.hello_sent = true;
  queue_unmetered(c, c.our_hello, tuning);
}

/// The handshake is done: the peer's window opens our sending, its frames may be full size, and
/// same-host peers set up arenas.
void on_authenticated(link_connection& c, const data_link_tuning& tuning) {
  c.authenticated = true;
  c.receiver.set_max_frame_bytes(tuning.limits.max_frame_bytes);
  c.queue.open(c.their_hello.window_bytes);
  c.peer_same_host = !host_identity().empty() && c.their_hello.host_id == host_identity();
  if (!c.peer_same_host) {
    tuning.log.info(c.who + ": the peer runs on another host; tensors go over TCP");
    return;
  }
  if (tuning.shm_arena_bytes == 0 || c.their_hello.arena_bytes == 0 || c.tx)
    return;
  auto arena = shm_send_arena::create(tuning.shm_arena_bytes);
  if (!arena) {
    tuning.log.info(c.who +
                    ": no shared-memory arena, tensors go over TCP: " + arena.error().to_string());
    return;
  }
  c.tx = std::move(*arena);
  queue_unmetered(c, wire::arena_offer{c.tx->name(), c.tx->size()}, tuning);
}

/// What a listener that requires node proofs (data_server_options::require_node_proof) checks
/// them against; null where none are required.
struct node_proof_policy {
  /// Empty until the server is admitted: hellos wait for it.
  const job_secret& secret;
  /// Worker ranks the scheduler declared lost.
  const std::set<std::uint32_t>& lost_workers;
  /// Connections open per proven node (by node id: counted_as), and how many one may hold.
  const std::map<std::uint32_t, std::size_t>& per_worker;
  std::size_t max_per_worker;
};

/// The key a proven node's connections are counted under (node_proof_policy::per_worker): its
/// node id, which tells a worker from a server of the same rank.
std::uint32_t counted_as(const wire::node_identity& who) {
  return who.node_role == wire::role::worker ? worker_node_id(who.rank) : server_node_id(who.rank);
}

link_violation refused(std::string why) {
  return link_violation{std::move(why), true};
}

/// The listener's answer to a connector whose proofs checked out: our link_auth with our proof of
/// the token, our key share when the connector sent one and we exchange keys, and our proof of
/// the connector's node key when it proved one (`key`).
std::optional<link_violation> answer_connector(link_connection& c, const data_link_tuning& tuning,
                                               const node_key* key) {
  wire::link_auth auth;
  if (tuning.key_exchange && c.their_hello.key_share) {
    // Made only now that the connector proved the token: a stranger cannot make us work for it.
    key_exchange ours;
    auto shared = ours.agree(*c.their_hello.key_share);
    if (!shared)
      return link_violation{"the link_hello's key share is not a usable X25519 key"};
    auth.key_share = ours.share();
    c.session = link_session_key(tuning.secret, c.our_hello, c.their_hello, ours.share(), *shared);
  }
  auth.proof = link_proof(tuning.secret, true, c.our_hello, c.their_hello, auth.key_share);
  if (key != nullptr)
    auth.node_proof = node_proof(*key, true, c.our_hello, c.their_hello);
  queue_unmetered(c, auth, tuning);
  on_authenticated(c, tuning);
  return std::nullopt;
}

/// The listener's check of the node a connector claims, once the job secret is there: a worker,
/// not declared lost, whose node proof checks out against the key derived for it. Then answers.
std::optional<link_violation> check_node(link_connection& c, const data_link_tuning& tuning,
                                         const node_proof_policy& policy) {
  const auto& who = *c.their_hello.identity;
  if (who.node_role == wire::role::worker && policy.lost_workers.contains(who.rank))
    return refused(wire::describe(who) +
                   " was declared lost by the scheduler: its rank takes no new connections");
  const auto key = derive_node_key(tuning.secret, policy.secret, who);
  if (!same_digest(*c.their_hello.node_proof, node_proof(key, false, c.our_hello, c.their_hello)))
    return refused("the node key of " + wire::describe(who) +
                   " is wrong (the link_hello's proof of it does not check out: not the key this "
                   "job's scheduler gave that node)");
  // Counted only once proven: an impostor cannot use up a real worker's connections.
  if (const auto open = policy.per_worker.find(counted_as(who));
      open != policy.per_worker.end() && open->second >= policy.max_per_worker)
    return refused(wire::describe(who) + " holds " + std::to_string(open->second) +
                   " connections to this server already, the most one worker may "
                   "(max_connections_per_worker " +
                   std::to_string(policy.max_per_worker) + ")");
  c.proven = who;
  return answer_connector(c, tuning, &key);
}

/// The listener's part once the connector's hello arrived: its proof of the token, the node it
/// claims (under `policy`; the hello is held while there is no job secret yet), then our answer.
std::optional<link_violation> check_connector(link_connection& c, const data_link_tuning& tuning,
                                              const node_proof_policy* policy) {
  const auto& hello = c.their_hello;
  if (!hello.proof)
    return refused("the link_hello carries no proof of the job token");
  if (!same_digest(*hello.proof, link_proof(tuning.secret, false, c.our_hello, hello)))
    return refused("the job token is wrong (the link_hello's proof of the job token is wrong: "
                   "another token, or none where the job has one)");
  if (policy == nullptr)
    return answer_connector(c, tuning, nullptr);
  if (!hello.identity || !hello.node_proof)
    return refused("the link_hello proves no node key: this port takes only workers of the job, "
                   "each proving the key its admission gave it");
  // Workers, and the job's other servers handing key ranges over (elastic servers).
  if (hello.identity->node_role != wire::role::worker &&
      hello.identity->node_role != wire::role::server)
    return refused("the link_hello claims to be " + wire::describe(*hello.identity) +
                   ": this port takes only workers and servers");
  if (policy->secret.empty()) {
    c.held = true;
    return std::nullopt;
  }
  return check_node(c, tuning, *policy);
}

/// The connector's check of the listener's link_auth: its proof of the token (over its key share),
/// its key share when we sent ours, its proof of our node key when we claimed one.
std::optional<link_violation> check_listener(link_connection& c, const wire::link_auth& auth,
                                             const data_link_tuning& tuning) {
  if (!same_digest(auth.proof,
                   link_proof(tuning.secret, true, c.their_hello, c.our_hello, auth.key_share)))
    return refused("the server's proof of the job token is wrong (it has another token, or none "
                   "where this node has one)");
  if (c.exchange) {
    if (!auth.key_share)
      return refused("the server made no key exchange (it takes no node's registration)");
    auto shared = c.exchange->agree(*auth.key_share);
    if (!shared)
      return link_violation{"the server's key share is not a usable X25519 key"};
    c.session =
        link_session_key(tuning.secret, c.their_hello, c.our_hello, *auth.key_share, *shared);
    c.exchange.reset();
  }
  if (tuning.node) {
    const std::string who = wire::describe(tuning.node->who);
    if (!auth.node_proof)
      return refused("the server did not prove the node key of " + who +
                     ": it is not a server of this job");
    if (!same_digest(*auth.node_proof,
                     node_proof(tuning.node->key, true, c.their_hello, c.our_hello)))
      return refused("the server's proof of the node key of " + who +
                     " is wrong: it is not a server of this job");
  }
  on_authenticated(c, tuning);
  return std::nullopt;
}

/// A frame before the handshake is done: the peer's hello (at the listener, with the connector's
/// proofs, answered by our link_auth or held; at the connector, answered by our hello) or, at the
/// connector, the listener's link_auth. Returns why the peer broke the handshake or is refused.
std::optional<link_violation> handshake_step(link_connection& c, const wire::message& msg,
                                             const data_link_tuning& tuning,
                                             const node_proof_policy* policy) {
  if (!c.peer_hello) {
    const auto* hello = std::get_if<wire::link_hello>(&msg);
    if (hello == nullptr)
      return link_violation{"the first frame must be a link_hello, not a " +
                            std::string(wire::kind_name(msg))};
    c.peer_hello = true;
    c.their_hello = *hello;
    if (!c.listener) {
      queue_hello(c, tuning);
      return std::nullopt;
    }
    return check_connector(c, tuning, policy);
  }
  if (c.listener)
    return link_violation{"a " + std::string(wire::kind_name(msg)) +
                          " before the handshake was done (wait for link_auth)"};
  const auto* auth = std::get_if<wire::link_auth>(&msg);
  if (auth == nullptr)
    return link_violation{"expected the server's link_auth after the link hellos, not a " +
                          std::string(wire::kind_name(msg))};
  return check_listener(c, *auth, tuning);
}

void on_arena_offer(link_connection& c, const wire::arena_offer& offer,
                    const data_link_tuning& tuning) {
  std::string refusal;
  if (tuning.shm_arena_bytes == 0)
    refusal = "shared memory is off here (data.shm_arena_bytes = 0)";
  else if (!c.peer_same_host)
    refusal = "no link hello from the same host came first";
  else if (c.rx)
    refusal = "an arena was accepted already";
  else if (offer.bytes > std::numeric_limits<std::size_t>::max())
    refusal = "the arena is too large";
  if (refusal.empty()) {
    auto arena = shm_peer_arena::open(offer.name, static_cast<std::size_t>(offer.bytes));
    if (arena) {
      c.rx = std::move(*arena);
      c.rx->on_release(c.wake);
      c.receiver.set_peer_arena(c.rx);
    } else {
      refusal = arena.error().to_string();
    }
  }
  if (!refusal.empty())
    tuning.log.info(
        c.who + ": refused the peer's shared-memory arena, its tensors come over TCP: " + refusal);
  queue_unmetered(c, wire::arena_accept{refusal.empty(), refusal}, tuning);
}

void on_arena_accept(link_connection& c, const wire::arena_accept& accept,
                     const data_link_tuning& tuning) {
  if (!c.tx || c.tx_on) {
    tuning.log.debug(c.who + ": ignoring an arena_accept nobody asked for");
    return;
  }
  // Mapped by the peer or refused: either way the name is no longer needed.
  c.tx->unlink();
  if (accept.ok) {
    c.tx_on = true;
    tuning.log.info(c.who + ": tensors of at least " + std::to_string(tuning.shm_threshold_bytes) +
                    " bytes go through shared memory (" + std::to_string(c.tx->size()) + " bytes)");
  } else {
    tuning.log.info(c.who + ": the peer refused our shared-memory arena, tensors go over TCP: " +
                    accept.detail);
    c.tx.reset();
  }
}

/// Handles a link-control frame (link_hello, link_auth, link_credit, arena_*) from the peer, or
/// any frame that arrives before the handshake is done (`policy`: a listener's node proofs).
/// Queues the answers; the caller pumps. Returns why the peer broke the link protocol or was
/// refused, if it was (the caller closes the connection).
std::optional<link_violation> handle_link_control(link_connection& c, const wire::message& msg,
                                                  const data_link_tuning& tuning,
                                                  const node_proof_policy* policy) {
  if (!c.authenticated) {
    try {
      return handshake_step(c, msg, tuning, policy);
    } catch (const std::exception& e) {
      return link_violation{std::string("the handshake failed here: ") + e.what()};
    }
  }
  if (std::holds_alternative<wire::link_hello>(msg))
    return link_violation{"a second link_hello"};
  if (std::holds_alternative<wire::link_auth>(msg))
    return link_violation{"a link_auth after the handshake"};
  if (const auto* credit = std::get_if<wire::link_credit>(&msg)) {
    if (auto broken = c.queue.credit(credit->bytes))
      return link_violation{std::move(*broken)};
  } else if (const auto* offer = std::get_if<wire::arena_offer>(&msg)) {
    on_arena_offer(c, *offer, tuning);
  } else if (const auto* accept = std::get_if<wire::arena_accept>(&msg)) {
    on_arena_accept(c, *accept, tuning);
  } else if (const auto* release = std::get_if<wire::arena_release>(&msg)) {
    std::size_t unknown = 0;
    for (std::uint64_t offset : release->offsets)
      if (!c.tx || !c.tx->release(offset))
        ++unknown;
    if (unknown != 0)
      tuning.log.debug(c.who + ": ignoring " + std::to_string(unknown) +
                       " releases of regions not in use");
  }
  return std::nullopt;
}

/// Sends what was released of what the peer sent: the regions of its arena (in frames of at
/// most max_releases_per_frame offsets) and, once enough frame bytes are released, a credit.
void send_releases(link_connection& c, const data_link_tuning& tuning) {
  if (c.rx) {
    auto offsets = c.rx->take_releases();
    for (std::size_t first = 0; first < offsets.size(); first += max_releases_per_frame) {
      const auto last = std::min(offsets.size(), first + max_releases_per_frame);
      queue_unmetered(c,
                      wire::arena_release{std::vector<std::uint64_t>(
                          offsets.begin() + static_cast<std::ptrdiff_t>(first),
                          offsets.begin() + static_cast<std::ptrdiff_t>(last))},
                      tuning);
    }
  }
  if (const std::uint64_t bytes = c.credit->take())
    queue_unmetered(c, wire::link_credit{bytes}, tuning);
}

/// What a release of something connection `id` received runs, on any thread: tells the broker,
/// if it still exists.
std::function<void()> release_waker(caf::io::abstract_broker* self, std::uint64_t id) {
  return [broker = self->address(), id] {
    if (auto strong = caf::actor_cast<caf::actor>(broker))
      caf::anon_send(strong, released_atom::value, id);
  };
}

/// What a connection made of one completed read.
struct incoming {
  /// Bytes to read next (receive_outcome::next_read).
  std::size_t next_read = 0;
  /// A frame for an actor.
  std::optional<envelope> frame;
  /// Why the bytes were refused; the peer (or the client's receiver) is told.
  std::optional<wire::decode_error> refused;
  /// The connection must close (after the error reply, on a server).
  bool fatal = false;
  /// The peer itself was refused (a proof that does not check out, a lost node): why. Fatal.
  std::optional<std::string> denied;
  /// At a connector: the listener answered the handshake with this error (a refused proof).
  std::optional<std::string> handshake_refused;

  /// What the peer is told on a fatal read: the refusal, or what broke.
  wire::message fatal_reply() const {
    if (denied)
      return wire::error_reply{0, std::nullopt, wire::error_code::not_admitted, *denied};
    return bad_frame_reply(*refused);
  }
};

/// Counts and logs a refused frame or peer (process_link_refusals).
void note_refusal(const link_connection& c, const incoming& in, const data_link_tuning& tuning) {
  refused_frames.fetch_add(1, std::memory_order_relaxed);
  if (in.fatal)
    closed_peers.fetch_add(1, std::memory_order_relaxed);
  if (in.denied)
    tuning.log.info(c.who + " refused (closing): " + *in.denied);
  else
    tuning.log.info(c.who + " sent a bad frame" + (in.fatal ? " (closing): " : ": ") +
                    std::string(wire::to_string(in.refused->kind)) + ": " + in.refused->message);
}

/// Makes a link violation the read's fatal outcome.
void take_violation(incoming& in, link_violation violation) {
  in.fatal = true;
  if (violation.refusal)
    in.denied = std::move(violation.why);
  else
    in.refused = wire::decode_error{wire::decode_error::code::invalid_value,
                                    "the link protocol is broken: " + violation.why};
}

/// Takes a read's outcome: link control and the hello order are handled here (`policy`: a
/// listener's node proofs), refusals and protocol violations become `refused` or `denied`, and a
/// refused frame's credit is sent when due.
incoming take_incoming(link_connection& c, receive_outcome out, const data_link_tuning& tuning,
                       const node_proof_policy* policy = nullptr) {
  incoming in{out.next_read, std::nullopt, std::move(out.error),
              out.fatal(),   std::nullopt, std::nullopt};
  if (!c.authenticated && in.refused)
    in.fatal = true; // nothing but a valid handshake may come first
  if (out.frame && !c.authenticated && !c.listener) {
    if (const auto* refusal = std::get_if<wire::error_reply>(&out.frame->msg)) {
      in.handshake_refused = refusal->message;
      in.fatal = true;
      in.refused = wire::decode_error{wire::decode_error::code::invalid_value,
                                      "the server refused the handshake: " + refusal->message};
      return in;
    }
  }
  if (out.frame) {
    std::optional<link_violation> violation;
    if (!c.authenticated || wire::is_link_control(out.frame->msg))
      violation = handle_link_control(c, out.frame->msg, tuning, policy);
    else
      in.frame = std::move(out.frame);
    if (in.frame)
      count_tensor_bytes(in.frame->msg, false);
    if (violation)
      take_violation(in, std::move(*violation));
  }
  if (in.refused || in.denied)
    note_refusal(c, in, tuning);
  // A frame refused for its content was released right here; the others are released by
  // whoever drops their envelope, which wakes the broker.
  if (in.refused && !in.fatal)
    send_releases(c, tuning);
  return in;
}

/// The connection's state for (stats_atom).
data_link_stats stats_of(const link_connection& c) {
  // Everything not yet taken by the socket, CAF's buffer included.
  const auto credit = c.credit->stats();
  data_link_stats s;
  s.connected = true;
  s.peer_hello = c.peer_hello;
  s.authenticated = c.authenticated;
  s.held = c.held;
  s.tls = c.tls && c.tls->established();
  s.peer_window = c.queue.peer_window();
  s.outstanding = c.queue.outstanding();
  s.waiting_frames = c.queue.waiting_frames();
  s.waiting_bytes = c.queue.waiting_bytes();
  s.credit_received = c.queue.credited();
  s.window = credit.window;
  s.unreleased = credit.unreleased;
  s.uncredited = credit.uncredited;
  s.credit_sent = credit.credited;
  s.shm_send = c.tx_on;
  s.shm_receive = c.rx != nullptr;
  s.queued_bytes = c.queue.queued_bytes() + c.in_flight;
  s.waits_for_budget = c.receiver.waits_for_budget();
  s.body_arrived = c.receiver.body_bytes_arrived();
  return s;
}

// ================================================================================================
// server

/// Warnings about the peers a server closes: every one while info lines print; else at most a
/// burst of them and then one a second, the next one shown saying how many were not, so that an
/// attack cannot flood the log (or block a node whose stderr is a pipe nobody drains).
class closure_log {
public:
  void warn(const logger& log, std::string line) {
    if (!log.enabled(log_level::info)) {
      const auto now = std::chrono::steady_clock::now();
      tokens_ = std::min(burst, tokens_ + std::chrono::duration<double>(now - refilled_).count());
      refilled_ = now;
      if (tokens_ < 1) {
        ++unshown_;
        return;
      }
      tokens_ -= 1;
    }
    if (unshown_ != 0) {
      line += " (and " + std::to_string(unshown_) +
              " more peers closed since the last such line; verbose 1 shows each)";
      unshown_ = 0;
    }
    log.warning(line);
  }

private:
  static constexpr double burst = 10;
  double tokens_ = burst;
  std::chrono::steady_clock::time_point refilled_ = std::chrono::steady_clock::now();
  std::uint64_t unshown_ = 0;
};

struct server_state {
  data_server_options options;
  std::shared_ptr<receive_buffer_pool> pool;
  std::unordered_map<connection_handle, link_connection> connections;
  /// Our own connection ids: CAF's handles are socket numbers, which the kernel reuses, and a
  /// late reply must never reach the next peer that gets the same number.
  std::unordered_map<std::uint64_t, connection_handle> handles;
  /// The connections still in their handshake, oldest (lowest id) first.
  std::set<std::uint64_t> unauthenticated;
  /// The receive budget of all connections (options.receive_budget_bytes), and the connections
  /// whose next frame waits for it, first come first served.
  std::shared_ptr<receive_budget> budget;
  std::deque<std::uint64_t> waiting_for_budget;
  /// Connections whose replies wait to be written with the next ones (defer_writes), and
  /// whether the broker's flush_writes_atom to itself is on its way.
  std::vector<std::uint64_t> deferred_writes;
  bool flush_posted = false;
  /// A socket read is being handled: it writes what it deferred when it ends, so no flush is
  /// posted for it (a message dispatched after every small request's reply).
  bool in_read = false;
  std::uint64_t next_id = 1;
  /// "host:port" bound, the answer to (get_atom).
  std::string endpoint;
  /// Under require_node_proof: the job secret (empty until the server is admitted), the workers
  /// declared lost, and the connections whose peer proved the token and waits for the secret
  /// (moved out of `unauthenticated`: strangers' connections cannot push them out).
  job_secret secret;
  std::set<std::uint32_t> lost_workers;
  std::set<std::uint64_t> held;
  /// Authenticated connections open per proven node, by node id (counted_as;
  /// options.max_connections_per_worker).
  std::map<std::uint32_t, std::size_t> per_worker;

  /// What hellos are checked against, or null when no node proofs are required.
  std::optional<node_proof_policy> policy() const {
    if (!options.require_node_proof)
      return std::nullopt;
    return node_proof_policy{secret, lost_workers, per_worker, options.max_connections_per_worker};
  }
  closure_log closures;

  static inline const char* name = "troupe.data_server";
};

using server_broker = caf::io::stateful_broker<server_state>;

/// How a server connection ends.
enum class closure {
  /// CAF reported the close (the peer left): the socket is CAF's to close.
  by_peer,
  /// The server stops: CAF sends what its buffers hold, then FIN.
  by_us,
  /// The peer misbehaved or failed: the socket goes at once, and a warning names the peer.
  of_peer,
};

/// Drops connection `hdl` at once: the kernel discards what it still holds for the peer and
/// answers with a reset, and CAF, whose writes and reads on the socket then fail, forgets the
/// scribe and closes the descriptor. A plain close(hdl) waits until CAF's buffer is written and
/// the peer closes its end: a peer that reads nothing and never closes would keep the socket,
/// its buffers and the descriptor forever. The descriptor is CAF's (hdl.id()) and still open
/// while the broker holds the scribe; it is never closed here, so a number the kernel reuses is
/// never touched.
void close_abortively(server_broker* self, connection_handle hdl) {
  if (!self->valid(hdl))
    return;
  const int fd = static_cast<int>(hdl.id());
  const ::linger reset{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  ::shutdown(fd, SHUT_RDWR);
  self->close(hdl);
}

/// Forgets a connection, closes it as `how` says and reports it, `why` naming the reason in
/// plain numbers (for of_peer and by_us).
void drop_connection(server_broker* self, connection_handle hdl, closure how, std::string why) {
  auto& st = self->state;
  auto i = st.connections.find(hdl);
  if (i == st.connections.end())
    return;
  const std::uint64_t id = i->second.id;
  const std::string peer = i->second.peer;
  if (i->second.counted) {
    auto open = st.per_worker.find(counted_as(*i->second.proven));
    if (--open->second == 0)
      st.per_worker.erase(open);
  }
  if (how == closure::of_peer)
    close_abortively(self, hdl);
  else if (how == closure::by_us)
    self->close(hdl);
  st.unauthenticated.erase(id);
  st.held.erase(id);
  st.handles.erase(id);
  st.connections.erase(i);
  const auto& log = st.options.tuning.log;
  const std::string named = "data server: connection " + std::to_string(id) + " (" + peer + ")";
  if (how == closure::of_peer) {
    st.closures.warn(log, "data server: closed the peer " + peer + " (connection " +
                              std::to_string(id) + "): " + why);
  } else if (how == closure::by_peer) {
    log.info(named + " closed by the peer");
  } else {
    log.info(named + " closed: " + why);
  }
  if (st.options.on_disconnect)
    st.options.on_disconnect(id);
}

/// Starts closing connection `c` after its last frames (an error reply, a TLS alert): nothing
/// else is queued or read, and once the socket has taken what is queued (or at the second frame
/// check, for a peer that takes nothing) the connection is closed as a misbehaving peer's, for
/// `why`.
void start_closing(link_connection& c, std::string why) {
  c.closing = true;
  c.closing_why = std::move(why);
  c.queue.drop_waiting();
}

/// Writes what the connection may, and closes it once a fatal frame's reply is handed over, or
/// when its TLS session failed. Returns whether the connection is still open (else `c` is gone).
void route_parked(server_broker* self, link_connection& c);

bool serve_writes(server_broker* self, link_connection& c) {
  const auto& options = self->state.options;
  if (!c.sealed_off) {
    if (auto failed = pump(self, c, options.tuning)) {
      drop_connection(self, c.hdl, closure::of_peer, "its TLS session failed: " + *failed);
      return false;
    }
  }
  if (!c.closing)
    route_parked(self, c);
  if (c.closing && (c.sealed_off || c.queue.empty()) && c.in_flight == 0) {
    drop_connection(self, c.hdl, closure::of_peer, c.closing_why);
    return false;
  }
  return true;
}

/// A reply was queued while more messages wait for the broker (the replies to a read of many
/// small requests): it is written with the replies after it, in one send, by the last of them or
/// by the flush_writes_atom the broker sends itself, which comes after every message waiting now.
void defer_writes(server_broker* self, link_connection& c) {
  auto& st = self->state;
  if (!c.writes_deferred) {
    c.writes_deferred = true;
    st.deferred_writes.push_back(c.id);
  }
  if (!st.flush_posted && !st.in_read) {
    st.flush_posted = true;
    self->send(self, flush_writes_atom::value);
  }
}

/// Writes what defer_writes held back.
void flush_deferred(server_broker* self) {
  auto& st = self->state;
  auto ids = std::move(st.deferred_writes);
  st.deferred_writes.clear();
  for (const std::uint64_t id : ids) {
    auto h = st.handles.find(id);
    if (h == st.handles.end())
      continue;
    auto& c = st.connections.at(h->second);
    c.writes_deferred = false;
    if (!c.closing) {
      seal_fused(c, st.options.tuning);
      serve_writes(self, c);
    }
  }
}

/// Bytes of frames that wait for the peer: queued, and handed to CAF but not taken by the socket.
std::size_t queued_for_peer(const link_connection& c) {
  return c.queue.queued_bytes() + c.in_flight;
}

/// Queues a reply on its connection (reply.connection), and writes it unless more replies are
/// coming: `reading` (made while a read is handled, which writes what it made when it ends) or
/// messages waiting in the mailbox (defer_writes).
void queue_reply_envelope(server_broker* self, envelope& reply, bool reading) {
  auto& st = self->state;
  auto h = st.handles.find(reply.connection);
  auto* c = h == st.handles.end() ? nullptr : &st.connections.at(h->second);
  if (c == nullptr || c->closing) {
    st.options.tuning.log.debug([&] {
      return "data server: dropping a " + std::string(wire::kind_name(reply.msg)) +
             " for connection " + std::to_string(reply.connection) + ", which is closed";
    });
    return;
  }
  const auto& tuning = st.options.tuning;
  const bool more_coming = reading || !self->mailbox().empty();
  if (more_coming && fusable_reply(reply.msg, tuning)) {
    // More replies come with it: they leave together, in one frame, when it is written.
    const auto* tensor = wire::tensor_of(reply.msg);
    const std::size_t bytes = tensor == nullptr ? 0 : tensor->data.size();
    if (c->fusing_bytes + bytes > tuning.fuse_frame_bytes ||
        c->fusing.messages.size() == wire::max_batch_messages)
      seal_fused(*c, tuning);
    c->fusing.messages.push_back(*wire::to_batched(std::move(reply.msg)));
    c->fusing_keepalive.push_back(std::move(reply.keepalive));
    c->fusing_bytes += bytes;
    defer_writes(self, *c);
    return;
  }
  if (auto why = encode_into(*c, reply.msg, std::move(reply.keepalive), st.options.tuning)) {
    // The peer waits for an answer to this request id: tell it why none comes.
    st.options.tuning.log.info("data server: " + *why);
    queue_reply(*c, failure_reply(reply.msg, wire::error_code::internal, *why), st.options.tuning);
  }
  TROUPE_HOP(server_queued);
  if (more_coming) {
    defer_writes(self, *c);
    return;
  }
  serve_writes(self, *c);
  if (!st.deferred_writes.empty())
    flush_deferred(self);
}

/// Hands a request to the actor options.route picks (or answers it at once).
void route_request(server_broker* self, link_connection& c, envelope&& request);

/// A server's connection finished its handshake: its frames count against the budget from now
/// on, and the owner learns what it established.
void on_server_authenticated(server_broker* self, link_connection& c) {
  const auto& options = self->state.options;
  c.receiver.set_budget(self->state.budget);
  if (c.proven) {
    ++self->state.per_worker[counted_as(*c.proven)];
    c.counted = true;
  }
  if (options.on_authenticated)
    options.on_authenticated(c.id, link_authentication{c.session, c.proven});
}

/// A fatal read: the peer gets the reason, whatever its window (what waited for credit is not
/// sent), and the connection closes once it is written.
void close_after(link_connection& c, const incoming& in, const data_link_tuning& tuning) {
  start_closing(c, in.denied ? "it was refused: " + *in.denied
                             : "it sent a frame that breaks the framing or the link protocol: " +
                                   std::string(wire::to_string(in.refused->kind)) + ": " +
                                   in.refused->message);
  queue_unmetered(c, in.fatal_reply(), tuning);
}

/// The job secret arrived: the held hello of connection `id` has its node proof checked now, and
/// is answered or refused.
void resume_held(server_broker* self, std::uint64_t id) {
  auto& st = self->state;
  st.held.erase(id);
  auto h = st.handles.find(id);
  if (h == st.handles.end())
    return;
  auto& c = st.connections.at(h->second);
  if (c.closing || !c.held)
    return;
  c.held = false;
  const auto& tuning = st.options.tuning;
  std::optional<link_violation> violation;
  try {
    violation = check_node(c, tuning, *st.policy());
  } catch (const std::exception& e) {
    violation = link_violation{std::string("the handshake failed here: ") + e.what()};
  }
  if (violation) {
    incoming in;
    take_violation(in, std::move(*violation));
    note_refusal(c, in, tuning);
    close_after(c, in, tuning);
  } else {
    on_server_authenticated(self, c);
    widen_reads(self, c);
  }
  serve_writes(self, c);
}

/// Replies are snapshots (a pull's value is copied), so a peer that sends requests and does not
/// read the replies, or a worker that pulls a model larger than the window in one go, would make
/// them pile up without end. So while more than max_send_queue_bytes wait for the peer, its
/// requests wait here instead, in order, holding their frames: the peer's window fills and it
/// can send no more, while its link control (credit) still gets through. They go on as the
/// queue drains (serve_writes); a peer that takes none of it for stalled_frame_timeout is closed
/// (close_stalled).
void dispatch(server_broker* self, link_connection& c, envelope&& request) {
  request.connection = c.id;
  if (!c.parked.empty() || queued_for_peer(c) > self->state.options.max_send_queue_bytes) {
    c.parked.push_back(std::move(request));
    return;
  }
  route_request(self, c, std::move(request));
}

void route_parked(server_broker* self, link_connection& c) {
  while (!c.parked.empty() && queued_for_peer(c) <= self->state.options.max_send_queue_bytes) {
    auto request = std::move(c.parked.front());
    c.parked.pop_front();
    route_request(self, c, std::move(request));
  }
  if (c.parked.empty())
    c.stuck_since = {};
}

void route_request(server_broker* self, link_connection& c, envelope&& request) {
  auto& st = self->state;
  if (auto* fused = std::get_if<wire::batch>(&request.msg)) {
    // Each as if it had come in a frame of its own, in order.
    for (auto& one : fused->messages) {
      route_request(
          self, c,
          envelope{wire::unbatched(std::move(one)), request.keepalive, request.connection});
    }
    return;
  }
  if (c.proven && st.options.authorize)
    if (auto refusal = st.options.authorize(request.msg, *c.proven)) {
      st.options.tuning.log.info(c.who + " (" + wire::describe(*c.proven) + "): refused a " +
                                 std::string(wire::kind_name(request.msg)) + ": " +
                                 refusal->message);
      queue_reply(c, std::move(*refusal), st.options.tuning);
      return;
    }
  TROUPE_HOP(server_to_shard);
  request_handler target;
  try {
    if (st.options.take_request) {
      const auto sink = caf::actor_cast<reply_sink>(self);
      reply_collector here{caf::actor_cast<caf::abstract_actor*>(sink), {}};
      bool taken = false;
      {
        const reply_collector::scope collecting{here};
        taken = st.options.take_request(request, sink);
      }
      // The connection being read writes them with the replies to the rest of its read.
      for (auto& reply : here.replies)
        queue_reply_envelope(self, reply, true);
      if (taken)
        return;
    }
    target = st.options.route(request);
  } catch (const std::exception& e) {
    queue_reply(c,
                failure_reply(request.msg, wire::error_code::internal,
                              std::string("routing failed: ") + e.what()),
                st.options.tuning);
    return;
  }
  if (!target) {
    queue_reply(c, no_handler_reply(request.msg), st.options.tuning);
    return;
  }
  self->send(target, std::move(request), caf::actor_cast<reply_sink>(self));
}

/// A read of the size the frame receiver asked for completed on connection `c`: dispatch its
/// frame, answer a refusal, or start closing. Returns the size of the next read; 0 when the
/// connection closes (then `c` may be gone).
std::size_t on_outcome(server_broker* self, link_connection& c, receive_outcome out);

std::size_t on_read(server_broker* self, link_connection& c, std::vector<char>& buffer) {
  return on_outcome(self, c, c.receiver.consume(buffer));
}

/// The frame receiver's verdict on a read (or on a resume after waiting for the budget): as
/// on_read. A frame that waits for the budget queues the connection and returns 0 with `c` still
/// open (its reader waits_for_budget()); under TLS what the session has not decrypted is kept.
std::size_t on_outcome(server_broker* self, link_connection& c, receive_outcome out) {
  auto& st = self->state;
  const auto& tuning = st.options.tuning;
  if (out.waits_for_budget) {
    if (c.tls)
      c.tls->keep_unread();
    st.waiting_for_budget.push_back(c.id);
    tuning.log.debug([&] {
      return c.who + " waits for the receive budget: " + std::to_string(st.budget->stats().in_use) +
             " of " + std::to_string(st.options.receive_budget_bytes) + " bytes are held";
    });
    return 0;
  }
  const auto policy = st.policy();
  auto in = take_incoming(c, std::move(out), tuning, policy ? &*policy : nullptr);
  if (c.held && st.unauthenticated.erase(c.id) != 0)
    st.held.insert(c.id);
  if (c.authenticated && st.unauthenticated.erase(c.id) != 0)
    on_server_authenticated(self, c);
  if (in.fatal) {
    close_after(c, in, tuning);
  } else if (in.refused) {
    queue_reply(c, bad_frame_reply(*in.refused), tuning);
  }
  if (in.frame)
    dispatch(self, c, std::move(*in.frame));
  return serve_writes(self, c) && !c.closing ? in.next_read : 0;
}

/// Starts reading connection `id` again after it waited for the budget, from the multiplexer's
/// next round. Not at once: a scribe stopped in this round (stop_if_waiting) stays registered for
/// reading until the round ends, and CAF 0.17 ignores a trigger meanwhile (a stream registers
/// again only once its reader is gone), which would leave the connection unread for good. A
/// function posted to the multiplexer runs after the round's changes to the poll set.
void read_again(server_broker* self, std::uint64_t id) {
  self->backend().post([broker = caf::actor_cast<caf::actor>(self), id] {
    caf::anon_send(broker, read_again_atom::value, id);
  });
}

void stop_if_waiting(server_broker* self, connection_handle hdl);
void finish_sealed_read(server_broker* self, connection_handle hdl, const sealed_read& read,
                        bool in_read_handler);

/// Feeds `bytes`, a coalesced read or the rest of one kept for a resume, to connection `c`'s frame
/// receiver (feed_plain). True when all of it went; false when the receiver stopped: the
/// connection is closing or gone, or it waits for the budget and keeps in `unread` what was not
/// fed, for its resume (`bytes` must not view `unread`).
bool feed_coalesced(server_broker* self, link_connection& c, std::span<const char> bytes) {
  const connection_handle hdl = c.hdl;
  auto [fed, stopped] =
      feed_plain(c, bytes, [&](std::vector<char>& plain) { return on_read(self, c, plain); });
  if (!stopped)
    return true;
  // The connection may be gone: looked up again.
  auto i = self->state.connections.find(hdl);
  if (i != self->state.connections.end() && i->second.receiver.waits_for_budget())
    i->second.unread.assign(bytes.begin() + static_cast<std::ptrdiff_t>(fed), bytes.end());
  return false;
}

/// Bytes arrived on connection `c`: without TLS exactly the read the frame receiver asked for;
/// under TLS ciphertext, handled by read_sealed. A failed TLS session closes the connection after
/// its alert.
void on_socket_read(server_broker* self, link_connection& c, std::vector<char>& buffer) {
  if (buffer.size() == wire::frame_prefix_bytes)
    TROUPE_HOP(server_prefix);
  else
    TROUPE_HOP(server_body);
  c.delivered += buffer.size();
  const connection_handle hdl = c.hdl;
  if (!c.tls) {
    if (!c.coalescing) {
      if (const std::size_t next = on_read(self, c, buffer))
        read_plain_next(self, c, &buffer, next);
      else
        stop_if_waiting(self, hdl);
      return;
    }
    if (feed_coalesced(self, c, {buffer.data(), buffer.size()}))
      read_plain_next(self, c, &buffer, c.plain.size());
    else
      stop_if_waiting(self, hdl);
    return;
  }
  const auto& options = self->state.options;
  auto read = read_sealed(
      c, buffer,
      [&] {
        const node_role role = *c.tls->peer_role();
        options.tuning.log.info(c.who + ": TLS is up; the peer's certificate is for a " +
                                std::string(to_string(role)));
        if (options.on_certified)
          options.on_certified(c.id, role);
      },
      [&](std::vector<char>& plain) { return on_read(self, c, plain); });
  finish_sealed_read(self, hdl, read, true);
}

/// After a TLS read on connection `hdl` (`in_read_handler`), or a resume after the budget,
/// decrypted what it could: close the connection when the session broke; else, when its reader
/// waits for the budget, keep the socket from being read (in a read handler: stop it; after a
/// resume it is stopped), and when it does not, have it read (after a resume: start it again).
void finish_sealed_read(server_broker* self, connection_handle hdl, const sealed_read& read,
                        bool in_read_handler) {
  auto& st = self->state;
  auto i = st.connections.find(hdl);
  if (i == st.connections.end())
    return;
  auto& c = i->second;
  const bool waits = c.receiver.waits_for_budget();
  if (in_read_handler && waits)
    stop_if_waiting(self, hdl);
  else if (!in_read_handler && !waits && !read.broken)
    read_again(self, c.id);
  if (read.stopped)
    return;
  if (read.broken) {
    // The session's alert goes out last; nothing else can be sealed any more.
    auto& out = self->wr_buf(c.hdl);
    const std::size_t before = out.size();
    c.tls->drain(out);
    c.in_flight += out.size() - before;
    self->flush(c.hdl);
    c.sealed_off = true;
    start_closing(c, "its TLS session failed: " + *read.broken);
    serve_writes(self, c);
    return;
  }
  widen_reads(self, c);
  serve_writes(self, c);
}

/// Inside the read handler of connection `hdl`: when its reader waits for the budget, CAF reads
/// nothing more from the socket after this read (its one remaining activity token is spent by
/// the read being handled) until resume_waiting triggers it again.
void stop_if_waiting(server_broker* self, connection_handle hdl) {
  auto& st = self->state;
  auto i = st.connections.find(hdl);
  if (i == st.connections.end() || !i->second.receiver.waits_for_budget())
    return;
  self->halt(hdl);
  self->trigger(hdl, 1);
}

/// Releases made room in the budget: every waiting connection, in the order they came, claims
/// again in its turn. One that still does not fit keeps its place (and the next release wakes
/// the broker again); one that does reads on, and waits again at the end of the queue when its
/// next claim (its next step, its first step after a commitment) does not fit: so waiting
/// connections are served in turn, one read at a time.
void resume_waiting(server_broker* self) {
  auto& st = self->state;
  std::deque<std::uint64_t> turns;
  turns.swap(st.waiting_for_budget);
  std::deque<std::uint64_t> kept;
  for (const std::uint64_t id : turns) {
    auto h = st.handles.find(id);
    if (h == st.handles.end())
      continue;
    const connection_handle hdl = h->second;
    auto& c = st.connections.at(hdl);
    if (c.closing || !c.receiver.waits_for_budget())
      continue;
    const bool for_commitment = c.receiver.waits_for_commitment();
    auto out = c.receiver.resume(c.tls || c.coalescing ? &c.plain : nullptr);
    if (out.waits_for_budget && c.receiver.waits_for_commitment() == for_commitment) {
      kept.push_back(id);
      continue;
    }
    if (!c.tls && c.coalescing) {
      // The rest of the read it stopped in comes first, then the socket again.
      const std::size_t next = on_outcome(self, c, std::move(out));
      if (next == 0)
        continue;
      c.plain.resize(next);
      c.plain_filled = 0;
      std::vector<char> rest = std::move(c.unread);
      c.unread.clear();
      if (!feed_coalesced(self, c, rest))
        continue;
      read_plain_next(self, c, nullptr, c.plain.size());
      read_again(self, id);
      continue;
    }
    if (!c.tls) {
      // The body goes into a buffer CAF allocates this once: outside a read handler the broker
      // cannot swap a pooled one in.
      if (const std::size_t next = on_outcome(self, c, std::move(out))) {
        self->configure_read(hdl, receive_policy::exactly(next));
        read_again(self, id);
      }
      continue;
    }
    // Decrypt what the session kept, then read the socket again unless a frame waits once more.
    const std::size_t next = on_outcome(self, c, std::move(out));
    sealed_read read{next == 0, std::nullopt};
    if (next != 0) {
      c.plain.resize(next);
      read = decrypt_kept(c, [&](std::vector<char>& plain) { return on_read(self, c, plain); });
    }
    finish_sealed_read(self, hdl, read, false);
  }
  // Those still waiting keep their places ahead of those that began to wait meanwhile.
  kept.insert(kept.end(), st.waiting_for_budget.begin(), st.waiting_for_budget.end());
  st.waiting_for_budget.swap(kept);
}

/// Milliseconds of `d`, for messages.
std::string ms_of(std::chrono::steady_clock::duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

/// The rate rule on connection `c`, whose peer has begun a frame (kernel view: `progress`): why
/// it must close, if it must. Times the frame from the first check that sees it, counting only
/// the peer's time: a check that finds bytes of it unread in the kernel does not count the time
/// since the previous one (nor does check_frames while the connection waits for the budget).
std::optional<std::string> too_slow(link_connection& c, const tcp_progress& progress,
                                    const data_server_options& options,
                                    std::chrono::steady_clock::time_point now) {
  auto& clock = c.clock;
  const std::uint64_t frame = c.receiver.frames_read();
  if (!clock.running || clock.frame != frame) {
    clock = {true, frame, progress.bytes_received, now, {}};
    return std::nullopt;
  }
  if (progress.unread == 0)
    clock.peer_time += now - clock.checked;
  clock.checked = now;
  if (options.min_frame_rate == 0 || clock.peer_time <= options.frame_grace)
    return std::nullopt;
  const double late = std::chrono::duration<double>(clock.peer_time - options.frame_grace).count();
  const double owed = static_cast<double>(options.min_frame_rate) * late;
  const std::uint64_t arrived = progress.bytes_received - clock.bytes_at_start;
  if (static_cast<double>(arrived) >= owed)
    return std::nullopt;
  return "it sends its frame too slowly: " + std::to_string(arrived) + " bytes arrived in " +
         ms_of(clock.peer_time) + " ms of its time (" + std::to_string(c.receiver.body_bytes()) +
         " body bytes announced; min_frame_rate " + std::to_string(options.min_frame_rate) +
         " bytes/s after frame_grace " + std::to_string(options.frame_grace.count()) +
         " ms asks for " + std::to_string(static_cast<std::uint64_t>(owed)) + " by now)";
}

/// The periodic check of every connection (stall_check_atom). Closes, naming the peer and the
/// numbers:
/// - a connection whose replies are backed up and whose socket took none of them for
///   stalled_frame_timeout (the peer does not read);
/// - an authenticated connection that began a frame (the broker is reading its body, the TLS
///   session holds part of a record, or the kernel received bytes that CAF holds as part of a
///   read not yet complete) and received nothing for stalled_frame_timeout, or whose frame
///   arrives slower than the rate rule allows (too_slow);
/// - a closing connection whose last frames the peer has not taken by the second check.
/// A connection waiting for the budget is not the peer's doing and is left alone.
void check_frames(server_broker* self) {
  auto& st = self->state;
  const auto timeout = st.options.stalled_frame_timeout;
  const bool stall_rule = timeout.count() > 0;
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::pair<connection_handle, std::string>> stalled;
  for (auto& [hdl, c] : st.connections) {
    if (c.closing) {
      if (++c.closing_checks >= 2)
        stalled.emplace_back(hdl, c.closing_why + " (it did not take its last " +
                                      std::to_string(queued_for_peer(c)) + " bytes)");
      continue;
    }
    // Replies are backed up when requests wait for them to drain (dispatch), or when more than
    // the bound is queued because requests were routed before their replies came: either way
    // the peer must take some of them. Progress is the bytes the socket took, not the queue's
    // size, which replies still being made may grow while the peer reads.
    const std::size_t queued = queued_for_peer(c);
    const bool backed_up =
        stall_rule && (!c.parked.empty() || queued > st.options.max_send_queue_bytes);
    if (!backed_up) {
      c.stuck_since = {};
    } else {
      if (c.stuck_since == std::chrono::steady_clock::time_point{} ||
          c.bytes_taken != c.taken_at_check)
        c.stuck_since = now;
      c.taken_at_check = c.bytes_taken;
      if (now - c.stuck_since >= timeout) {
        stalled.emplace_back(hdl, "it is not reading its replies: " + std::to_string(queued) +
                                      " bytes queued (max_send_queue_bytes " +
                                      std::to_string(st.options.max_send_queue_bytes) +
                                      "), none taken for " + ms_of(now - c.stuck_since) +
                                      " ms (stalled_frame_timeout " +
                                      std::to_string(timeout.count()) + " ms)");
        continue;
      }
    }
    if (!c.authenticated)
      continue;
    if (c.receiver.waits_for_budget()) {
      c.clock.checked = now; // the wait is not the peer's time
      continue;
    }
    const auto progress = read_tcp_progress(static_cast<int>(hdl.id()));
    if (!progress)
      continue;
    const bool mid_frame = c.receiver.body_bytes() != 0 || (c.tls && c.tls->mid_record()) ||
                           c.plain_filled != 0 || !c.unread.empty() ||
                           progress->bytes_received > c.delivered;
    if (!mid_frame) {
      c.clock.running = false;
      continue;
    }
    if (stall_rule && std::chrono::milliseconds{progress->ms_since_data} >= timeout) {
      stalled.emplace_back(hdl, "it began a frame and sent nothing more for " +
                                    std::to_string(progress->ms_since_data) +
                                    " ms (stalled_frame_timeout " +
                                    std::to_string(timeout.count()) + " ms)");
      continue;
    }
    if (auto why = too_slow(c, *progress, st.options, now))
      stalled.emplace_back(hdl, std::move(*why));
  }
  for (const auto& [hdl, why] : stalled)
    drop_connection(self, hdl, closure::of_peer, why);
}

/// How often check_frames runs: a quarter of the shortest of its timeouts (stalled_frame_timeout,
/// frame_grace when the rate rule is on), at least every second (closing connections) and at most
/// every 10 ms.
std::chrono::milliseconds check_interval(const data_server_options& options) {
  auto interval = std::chrono::milliseconds{1'000};
  if (options.stalled_frame_timeout.count() > 0)
    interval = std::min(interval, options.stalled_frame_timeout / 4);
  if (options.min_frame_rate != 0)
    interval = std::min(interval, options.frame_grace / 4);
  return std::max(interval, std::chrono::milliseconds{10});
}

caf::behavior data_server_impl(server_broker* self, caf::io::doorman_ptr acceptor,
                               std::string endpoint, data_server_options options) {
  auto& st = self->state;
  st.options = std::move(options);
  st.endpoint = std::move(endpoint);
  st.pool = std::make_shared<receive_buffer_pool>(st.options.tuning.max_cached_buffer_bytes);
  st.budget = std::make_shared<receive_budget>(st.options.receive_budget_bytes);
  st.budget->on_room([broker = self->address()] {
    if (auto strong = caf::actor_cast<caf::actor>(broker))
      caf::anon_send(strong, budget_atom::value);
  });
  self->add_doorman(std::move(acceptor));
  // A stalled frame is closed within 1.25 timeouts, a slow one within a quarter grace of its
  // deadline.
  const auto stall_check_interval = check_interval(st.options);
  self->delayed_send(self, stall_check_interval, stall_check_atom::value);
  return {
      [=](const caf::io::new_connection_msg& msg) {
        auto& st = self->state;
        const auto& tuning = st.options.tuning;
        const std::string from =
            self->remote_addr(msg.handle) + ":" + std::to_string(self->remote_port(msg.handle));
        if (st.connections.size() >= st.options.max_connections) {
          close_abortively(self, msg.handle);
          st.closures.warn(tuning.log, "data server: refused a connection from " + from + ": " +
                                           std::to_string(st.connections.size()) +
                                           " are open, the most it holds (max_connections)");
          return;
        }
        if (st.unauthenticated.size() >= st.options.max_unauthenticated) {
          const std::uint64_t oldest = *st.unauthenticated.begin();
          drop_connection(self, st.handles.at(oldest), closure::of_peer,
                          "its handshake was not done while " +
                              std::to_string(st.unauthenticated.size()) +
                              " connections were waiting to authenticate (max_unauthenticated), "
                              "and it was the oldest");
        }
        const std::uint64_t id = st.next_id++;
        auto& c = st.connections
                      .try_emplace(msg.handle, id, msg.handle, true,
                                   "data server: connection " + std::to_string(id),
                                   release_waker(self, id), st.pool, tuning)
                      .first->second;
        c.peer = from;
        c.receiver.set_receive_step(st.options.receive_step_bytes);
        st.handles.emplace(id, msg.handle);
        st.unauthenticated.insert(id);
        self->ack_writes(msg.handle, true);
        tuning.log.info(c.who + " from " + from);
        try {
          start_reading(self, c, tuning);
          self->trigger(msg.handle, unlimited_reads);
          // Under TLS it waits in the queue until the TLS handshake is done.
          queue_hello(c, tuning);
        } catch (const std::exception& e) {
          drop_connection(self, msg.handle, closure::of_peer,
                          std::string("this server cannot say hello: ") + e.what());
          return;
        }
        self->delayed_send(self, tuning.handshake_timeout, handshake_deadline_atom::value, id);
        serve_writes(self, c);
      },
      [=](handshake_deadline_atom, std::uint64_t id) {
        auto& st = self->state;
        if (!st.unauthenticated.contains(id) && !st.held.contains(id))
          return;
        const auto& c = st.connections.at(st.handles.at(id));
        drop_connection(self, c.hdl, closure::of_peer,
                        "no authenticated handshake within " +
                            std::to_string(st.options.tuning.handshake_timeout.count()) + " ms" +
                            (c.held ? " (its hello waited for the job secret: this server was "
                                      "not admitted to its job in time)"
                             : c.tls && !c.tls->established()
                                 ? " (no TLS handshake: does the peer run TLS?)"
                                 : ""));
      },
      [=](const job_secret& secret) {
        auto& st = self->state;
        if (!st.options.require_node_proof || !st.secret.empty() || secret.empty())
          return;
        st.secret = secret;
        const std::vector<std::uint64_t> waiting(st.held.begin(), st.held.end());
        for (const auto id : waiting)
          resume_held(self, id);
      },
      [=](const wire::membership& table) {
        auto& st = self->state;
        std::set<std::uint32_t> newly_lost;
        for (const auto& node : table.nodes)
          if (node.node_role == wire::role::worker && !node.alive &&
              st.lost_workers.insert(node.rank).second)
            newly_lost.insert(node.rank);
        // A lost worker's open connections go too, at once (it may be frozen and read nothing):
        // what it sends from now on is not the job's.
        std::vector<std::pair<connection_handle, std::uint32_t>> closing;
        for (const auto& [hdl, c] : st.connections)
          if (c.proven && c.proven->node_role == wire::role::worker &&
              newly_lost.contains(c.proven->rank))
            closing.emplace_back(hdl, c.proven->rank);
        for (const auto& [hdl, rank] : closing)
          drop_connection(self, hdl, closure::of_peer,
                          "worker " + std::to_string(rank) + " was declared lost by the scheduler");
      },
      [=](caf::io::new_data_msg& msg) {
        auto& st = self->state;
        keep_multiplexer_polling(self->backend(), st.options.tuning.io_spin);
        auto i = st.connections.find(msg.handle);
        if (i == st.connections.end() || i->second.closing)
          return;
        // (An exception out of a handler ends the broker: the flag needs no guard.)
        st.in_read = true;
        on_socket_read(self, i->second, msg.buf);
        st.in_read = false;
        // The replies made while reading (answered on this thread) go in one write per
        // connection.
        if (!st.deferred_writes.empty())
          flush_deferred(self);
      },
      [=](const caf::io::data_transferred_msg& msg) {
        auto& st = self->state;
        auto i = st.connections.find(msg.handle);
        if (i == st.connections.end())
          return;
        TROUPE_HOP(server_written);
        i->second.in_flight = msg.remaining;
        i->second.bytes_taken += msg.written;
        serve_writes(self, i->second);
      },
      [=](const caf::io::connection_closed_msg& msg) {
        drop_connection(self, msg.handle, closure::by_peer, "");
      },
      [=](const caf::io::acceptor_closed_msg&) {
        // Existing connections keep being served; only new peers are turned away.
        self->state.options.tuning.log.info("data server: the listening socket closed");
      },
      [=](envelope& reply) {
        TROUPE_HOP(server_reply_in);
        queue_reply_envelope(self, reply, false);
      },
      [=](flush_writes_atom) {
        self->state.flush_posted = false;
        flush_deferred(self);
      },
      [=](released_atom, std::uint64_t id) {
        auto& st = self->state;
        auto h = st.handles.find(id);
        if (h == st.handles.end())
          return;
        auto& c = st.connections.at(h->second);
        if (c.closing)
          return;
        send_releases(c, st.options.tuning);
        serve_writes(self, c);
      },
      [=](budget_atom) { resume_waiting(self); },
      [=](read_again_atom, std::uint64_t id) {
        auto& st = self->state;
        auto h = st.handles.find(id);
        if (h == st.handles.end())
          return;
        const auto& c = st.connections.at(h->second);
        if (!c.closing && !c.receiver.waits_for_budget())
          self->trigger(c.hdl, unlimited_reads);
      },
      [=](stall_check_atom) {
        check_frames(self);
        self->delayed_send(self, stall_check_interval, stall_check_atom::value);
      },
      [=](const caf::io::connection_passivated_msg&) {
        // A connection spent its last activity token: it waits for the budget (stop_if_waiting).
      },
      [=](caf::get_atom) { return self->state.endpoint; },
      [=](stats_atom, std::uint64_t id) {
        auto& st = self->state;
        auto h = st.handles.find(id);
        auto stats =
            h == st.handles.end() ? data_link_stats{} : stats_of(st.connections.at(h->second));
        const auto budget = st.budget->stats();
        stats.budget = budget.limit;
        stats.budget_in_use = budget.in_use;
        stats.budget_peak = budget.peak;
        stats.budget_waits = budget.waits;
        stats.budget_committed = budget.committed;
        return stats;
      },
      [=](stop_atom) {
        // Replies held back for a burst were sent before the stop: they go first.
        flush_deferred(self);
        auto& st = self->state;
        std::vector<connection_handle> open;
        for (const auto& entry : st.connections)
          open.push_back(entry.first);
        for (auto hdl : open)
          drop_connection(self, hdl, closure::by_us, "the server stops");
        // Quitting closes the listening socket with every other servant of the broker.
        self->quit();
      },
  };
}

// ================================================================================================
// client

struct client_state {
  client_state() = default;
  client_state(const client_state&) = delete;
  client_state& operator=(const client_state&) = delete;
  ~client_state() {
    if (lane) {
      std::lock_guard hold{lane->mutex()};
      lane->close();
    }
  }
  /// With the lane's lock held: write_now takes nothing more.
  void close_lane() {
    if (lane)
      lane->close();
  }

  data_link_tuning tuning;
  /// data_link_options::tag, carried by everything sent to the receiver.
  std::uint64_t tag = 0;
  caf::actor receiver;
  /// "host:port", for every message about this link.
  std::string peer;
  /// data_link_options::on_authenticated.
  std::function<void(const link_authentication&)> on_authenticated;
  std::optional<link_connection> connection;
  bool down = false;
  /// data_link_options::lane, once opened (open_lane).
  std::shared_ptr<link_lane> lane;
  bool lane_open = false;

  static inline const char* name = "troupe.data_link";
};

using client_broker = caf::io::stateful_broker<client_state>;

/// How a link_down reason starts when the server refused the handshake (handshake_refusal).
constexpr std::string_view refused_by = "refused by ";

/// Tells the receiver once that the link is gone, and ends the broker (which closes the socket).
void link_down(client_broker* self, std::string reason) {
  auto& st = self->state;
  if (!st.down) {
    st.down = true;
    st.close_lane();
    st.tuning.log.info("data link: " + reason);
    self->send(st.receiver, link_down_atom::value, st.tag, std::move(reason));
  }
  self->quit();
}

/// A local reply to the receiver, for a request that never left or a frame that was refused.
void tell_receiver(client_broker* self, wire::message msg) {
  self->send(self->state.receiver, envelope{std::move(msg), nullptr, self->state.tag});
}

/// Writes what the link may; a failed TLS session takes the link down. Returns whether the link
/// is still up.
bool send_writes(client_broker* self) {
  auto& st = self->state;
  if (auto failed = pump(self, *st.connection, st.tuning)) {
    link_down(self, "data link to " + st.peer + " closed: " + *failed);
    return false;
  }
  return true;
}

/// link_lane's writer, on the owner's thread with the lane's lock held. when_idle (write_now):
/// the frame of a small `request` encoded and staged for one non-blocking send
/// (link_lane::send_staged) when the connection has nothing else to send, so that nothing
/// overtakes it; false, and nothing done, otherwise. always (take): the frame is queued in any
/// case, behind what the connection holds, and staged the same way when the connection is idle;
/// when it is not, or the frame cannot be encoded, what the broker must hear of it (a wake-up, the
/// receiver's error reply) is sent after the locks (link_lane::after_locks). Either way a frame
/// the peer's window does not admit waits in the queue, for the broker, which reads the credit.
bool stage_from_elsewhere(client_broker* self, envelope& request, std::vector<char>* staged,
                          link_lane::write_mode mode) {
  const bool always = mode == link_lane::write_mode::always;
  auto& st = self->state;
  if (st.down || !st.connection)
    return always; // taken: dropped, as the broker drops what reaches a link that is down
  if (!st.lane_open)
    return false;
  auto& c = *st.connection;
  const bool idle = staged != nullptr && !c.closing && c.authenticated && !c.tls &&
                    !c.sending_elsewhere && c.in_flight == 0 && c.queue.empty() && c.unsent.empty();
  const auto* tensor = wire::tensor_of(request.msg);
  const bool small =
      tensor == nullptr || (tensor->data.size() <= link_lane::direct_tensor_bytes &&
                            !(c.tx_on && tensor->data.size() >= st.tuning.shm_threshold_bytes));
  if (!always && !(idle && small))
    return false;
  TROUPE_HOP(link_in);
  // The keepalive is copied: a frame that write_now cannot encode goes to the broker as it was,
  // which tells the receiver why.
  if (auto why = encode_into(c, request.msg, request.keepalive, st.tuning)) {
    if (!always)
      return false;
    st.tuning.log.info("data link: " + *why);
    link_lane::after_locks([receiver = st.receiver,
                            reply = std::make_shared<envelope>(
                                failure_reply(request.msg, wire::error_code::internal, *why),
                                nullptr, st.tag)] { caf::anon_send(receiver, std::move(*reply)); });
    request.keepalive.reset();
    return true;
  }
  request.keepalive.reset();
  TROUPE_HOP(link_queued);
  if (idle && small) {
    staged->clear();
    if (c.queue.ready()) {
      c.queue.append_to(*staged, direct_write_bytes);
      c.sending_elsewhere = true;
    }
    return true;
  }
  // Busy, or the frame goes as the broker sends large ones: the broker writes it. A send from
  // another thread under way wakes it when it ends (finish_from_elsewhere).
  if (!c.sending_elsewhere)
    link_lane::after_locks([broker = caf::actor_cast<caf::actor>(self), id = c.id] {
      caf::anon_send(broker, released_atom::value, id);
    });
  return true;
}

/// A send from another thread is done, with the lane's lock held: what the socket did not take
/// goes to CAF's buffer first, then anything queued meanwhile, on the broker's thread, which is
/// woken once this thread holds the lock no more.
void finish_from_elsewhere(client_broker* self, std::span<const char> left, std::size_t taken) {
  auto& st = self->state;
  if (!st.connection)
    return;
  auto& c = *st.connection;
  c.sending_elsewhere = false;
  c.bytes_taken += taken;
  if (!left.empty()) {
    c.unsent.assign(left.begin(), left.end());
    c.in_flight += c.unsent.size();
  }
  if (!st.down && (!c.unsent.empty() || c.queue.ready()))
    link_lane::after_locks([broker = caf::actor_cast<caf::actor>(self), id = c.id] {
      caf::anon_send(broker, released_atom::value, id);
    });
}

/// Opens the lane (data_link_options::lane), once the handshake is done, without TLS: the
/// owner's threads may write small frames from now on, on a duplicate of the socket's descriptor
/// (CAF's own may be closed on the I/O thread at any time; the lane closes its own).
void open_lane(client_broker* self) {
  auto& st = self->state;
  if (!st.lane || st.down || st.connection->tls || st.lane_open)
    return;
  const int fd = ::dup(static_cast<int>(st.connection->hdl.id()));
  if (fd < 0)
    return;
  st.lane_open = true;
  st.lane->open(
      fd,
      [self](envelope& request, std::vector<char>* staged, link_lane::write_mode mode) {
        return stage_from_elsewhere(self, request, staged, mode);
      },
      [self](std::span<const char> left, std::size_t taken) {
        finish_from_elsewhere(self, left, taken);
      });
}

/// A read of the size the frame receiver asked for completed: forward its frame, tell the
/// receiver of a refusal, or go down. Returns the size of the next read; 0 once the link is down.
std::size_t on_read(client_broker* self, std::vector<char>& buffer) {
  auto& st = self->state;
  auto& c = *st.connection;
  const bool was_authenticated = c.authenticated;
  auto in = take_incoming(c, c.receiver.consume(buffer), st.tuning);
  if (in.handshake_refused) {
    link_down(self, std::string(refused_by) + st.peer + ": " + *in.handshake_refused);
    return 0;
  }
  if (in.denied) {
    link_down(self, "data link to " + st.peer + " closed: " + *in.denied);
    return 0;
  }
  if (in.fatal) {
    link_down(self, "data link to " + st.peer + " closed: the server sent a frame that breaks " +
                        "the framing or the link protocol: " + in.refused->message);
    return 0;
  }
  if (!was_authenticated && c.authenticated) {
    if (st.on_authenticated)
      st.on_authenticated(link_authentication{c.session, std::nullopt});
    open_lane(self);
  }
  if (in.frame) {
    in.frame->connection = st.tag;
    TROUPE_HOP(client_to_worker);
    self->send(st.receiver, std::move(*in.frame));
  }
  if (in.refused)
    tell_receiver(self, bad_frame_reply(*in.refused));
  return send_writes(self) ? in.next_read : 0;
}

/// Bytes arrived: without TLS exactly the read the frame receiver asked for; under TLS
/// ciphertext, handled by read_sealed. A failed TLS session takes the link down after its alert.
void on_socket_read(client_broker* self, std::vector<char>& buffer) {
  if (buffer.size() == wire::frame_prefix_bytes)
    TROUPE_HOP(client_prefix);
  else
    TROUPE_HOP(client_body);
  auto& st = self->state;
  auto& c = *st.connection;
  if (!c.tls) {
    if (!c.coalescing) {
      if (const std::size_t next = on_read(self, buffer))
        read_plain_next(self, c, &buffer, next);
      return;
    }
    // A worker's link has no receive budget: 0 means the link is down or closing.
    auto [fed, stopped] =
        feed_plain(c, std::span<const char>{buffer.data(), buffer.size()},
                   [&](std::vector<char>& plain) { return on_read(self, plain); });
    if (!stopped)
      read_plain_next(self, c, &buffer, c.plain.size());
    return;
  }
  auto read = read_sealed(
      c, buffer,
      [&] {
        st.tuning.log.info(c.who + ": TLS is up; the server's certificate is for a " +
                           std::string(to_string(*c.tls->peer_role())));
      },
      [&](std::vector<char>& plain) { return on_read(self, plain); });
  if (read.stopped)
    return;
  if (read.broken) {
    c.tls->drain(self->wr_buf(c.hdl));
    self->flush(c.hdl);
    link_down(self, "data link to " + st.peer + " closed: " + *read.broken);
    return;
  }
  widen_reads(self, c);
  send_writes(self);
}

/// The lane's lock, held by every handler of a link with a lane (link_lane): its owner's threads
/// use the connection's sending state too.
std::unique_lock<std::mutex> hold_lane(client_broker* self) {
  auto& lane = self->state.lane;
  return lane ? std::unique_lock<std::mutex>{lane->mutex()} : std::unique_lock<std::mutex>{};
}

/// An envelope from the owner: encoded and sent in order, or, when it cannot be encoded, a local
/// error reply to the receiver.
void take_request(client_broker* self, envelope& request) {
  TROUPE_HOP(link_in);
  auto& st = self->state;
  if (st.down)
    return;
  auto& c = *st.connection;
  if (auto why = encode_into(c, request.msg, std::move(request.keepalive), st.tuning)) {
    st.tuning.log.info("data link: " + *why);
    tell_receiver(self, failure_reply(request.msg, wire::error_code::internal, *why));
    return;
  }
  TROUPE_HOP(link_queued);
  send_writes(self);
}

caf::behavior data_link_impl(client_broker* self, connection_handle hdl, caf::actor receiver,
                             std::string peer, data_link_options options) {
  auto& st = self->state;
  st.tuning = std::move(options.tuning);
  st.tag = options.tag;
  st.receiver = std::move(receiver);
  st.peer = std::move(peer);
  st.on_authenticated = std::move(options.on_authenticated);
  st.lane = std::move(options.lane);
  st.connection.emplace(1, hdl, false, "data link to " + st.peer, release_waker(self, 1),
                        std::make_shared<receive_buffer_pool>(st.tuning.max_cached_buffer_bytes),
                        st.tuning);
  // Nobody would read what arrives once the receiver is gone.
  self->monitor(st.receiver);
  self->set_down_handler([=](caf::down_msg& msg) {
    auto held = hold_lane(self);
    if (msg.source == self->state.receiver)
      self->quit();
  });
  self->ack_writes(hdl, true);
  // The listener speaks first; we answer its hello (on_read). Under TLS, our ClientHello opens.
  try {
    start_reading(self, *st.connection, st.tuning);
    send_writes(self);
  } catch (const std::exception& e) {
    link_down(self, "data link to " + st.peer + " closed: cannot start TLS: " + e.what());
  }
  self->delayed_send(self, st.tuning.handshake_timeout, handshake_deadline_atom::value);
  return {
      [=](caf::io::new_data_msg& msg) {
        keep_multiplexer_polling(self->backend(), self->state.tuning.io_spin);
        auto held = hold_lane(self);
        if (!self->state.down)
          on_socket_read(self, msg.buf);
      },
      [=](const caf::io::data_transferred_msg& msg) {
        auto held = hold_lane(self);
        auto& st = self->state;
        if (st.down)
          return;
        TROUPE_HOP(link_written);
        st.connection->in_flight = msg.remaining + st.connection->unsent.size();
        send_writes(self);
      },
      [=](const caf::io::connection_closed_msg&) {
        auto held = hold_lane(self);
        link_down(self, "data link to " + self->state.peer + " closed by the peer");
      },
      [=](envelope& request) {
        auto held = hold_lane(self);
        take_request(self, request);
      },
      [=](handed_atom, envelope& request) {
        auto held = hold_lane(self);
        if (self->state.lane)
          self->state.lane->handled_one();
        take_request(self, request);
      },
      [=](handshake_deadline_atom) {
        auto held = hold_lane(self);
        auto& st = self->state;
        if (st.down || st.connection->authenticated)
          return;
        const auto& c = *st.connection;
        link_down(self, "data link to " + st.peer + " closed: no handshake within " +
                            std::to_string(st.tuning.handshake_timeout.count()) + " ms (" +
                            (c.tls && !c.tls->established()
                                 ? "the server did not finish the TLS handshake: does it run TLS?"
                             : c.peer_hello ? "the server did not answer our proof of the job token"
                             : c.tls        ? "the server did not say hello inside TLS"
                                            : "the server did not say hello: is it a troupe node, "
                                              "and without TLS as this one?") +
                            ")");
      },
      [=](released_atom, std::uint64_t) {
        auto held = hold_lane(self);
        auto& st = self->state;
        if (st.down)
          return;
        send_releases(*st.connection, st.tuning);
        send_writes(self);
      },
      [=](caf::get_atom) { return self->state.peer; },
      [=](stats_atom) {
        auto held = hold_lane(self);
        return stats_of(*self->state.connection);
      },
      [=](stop_atom) {
        auto held = hold_lane(self);
        link_down(self, "data link to " + self->state.peer + " stopped by its owner");
      },
  };
}

/// Waits until `broker` has run its first message. The socket it was spawned with is registered
/// with the multiplexer through the same queue as that message, so afterwards the broker is
/// really listening (or reading). Without this, a broker stopped right after its spawn makes
/// CAF 0.17.6 register the socket after the broker is gone and leak it (LeakSanitizer shows the
/// same with middleman::spawn_server).
/// A client broker may also be gone already, having run (the server refused its handshake, and
/// the receiver was told why): a broker that quits with the question in its mailbox never answers
/// it, so its exit counts as an answer.
std::optional<std::string> await_started(caf::actor_system& sys, const caf::actor& broker) {
  caf::scoped_actor self{sys};
  self->monitor(broker);
  self->send(broker, caf::get_atom::value);
  std::optional<std::string> failure;
  bool answered = false;
  while (!answered)
    self->receive([&](const std::string&) { answered = true; },
                  [&](const caf::down_msg& down) { answered = down.source == broker.address(); },
                  caf::after(std::chrono::seconds(10)) >>
                      [&] {
                        failure = "the broker did not start within 10 s";
                        answered = true;
                      });
  self->demonitor(broker);
  return failure;
}

} // namespace

namespace {
/// The lanes this thread staged a send on (link_lane::write_now, take), and the messages it left
/// for after the locks (link_lane::after_locks), for send_staged.
thread_local std::vector<std::shared_ptr<link_lane>> staged_lanes;
thread_local std::vector<std::function<void()>> messages_after_locks;
} // namespace

link_lane::~link_lane() {
  if (fd_ >= 0)
    ::close(fd_);
}

bool link_lane::write_now(envelope& request) {
  if (handed_.load(std::memory_order_relaxed) != 0)
    return false;
  std::lock_guard hold{mutex_};
  // With the lock held the broker runs nothing, and it lowers handed_ under the lock: 0 here
  // means every handed envelope is in the connection's queue (or gone with the link).
  if (!writer_ || sending_ || handed_.load(std::memory_order_relaxed) != 0 ||
      !writer_(request, &staged_, write_mode::when_idle))
    return false;
  if (!staged_.empty()) {
    sending_ = true;
    staged_lanes.push_back(shared_from_this());
  }
  return true;
}

bool link_lane::takes_now() {
  std::lock_guard hold{mutex_};
  return writer_ && handed_.load(std::memory_order_relaxed) == 0;
}

void link_lane::take(envelope& request) {
  std::lock_guard hold{mutex_};
  // Closed since takes_now(): the link is down, and drops what it is sent.
  if (!writer_)
    return;
  const bool staging = !sending_;
  if (staging)
    staged_.clear();
  writer_(request, staging ? &staged_ : nullptr, write_mode::always);
  if (staging && !staged_.empty()) {
    sending_ = true;
    staged_lanes.push_back(shared_from_this());
  }
}

void link_lane::after_locks(std::function<void()> message) {
  messages_after_locks.push_back(std::move(message));
}

void link_lane::send_staged() {
  auto lanes = std::move(staged_lanes);
  staged_lanes.clear();
  for (auto& lane : lanes)
    lane->send_now();
  // Messages last: a wake-up of the broker finds the ends of the sends above.
  auto messages = std::move(messages_after_locks);
  messages_after_locks.clear();
  for (auto& message : messages)
    message();
}

void link_lane::send_now() {
  // While sending_, the broker neither writes on the connection nor touches fd_ or staged_.
  const auto sent = ::send(fd_, staged_.data(), staged_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  const std::size_t taken = sent > 0 ? static_cast<std::size_t>(sent) : 0;
  std::lock_guard hold{mutex_};
  sending_ = false;
  if (finish_)
    finish_(std::span<const char>{staged_}.subspan(taken), taken);
  staged_.clear();
  if (close_after_send_) {
    ::close(fd_);
    fd_ = -1;
    close_after_send_ = false;
  }
}

void link_lane::open(int fd, writer_function writer,
                     std::function<void(std::span<const char>, std::size_t)> finish) {
  fd_ = fd;
  writer_ = std::move(writer);
  finish_ = std::move(finish);
}

void link_lane::close() noexcept {
  writer_ = nullptr;
  finish_ = nullptr;
  if (sending_) {
    close_after_send_ = true;
  } else if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

link_refusals process_link_refusals() noexcept {
  return {refused_frames.load(std::memory_order_relaxed),
          closed_peers.load(std::memory_order_relaxed)};
}

link_tensor_bytes process_link_tensor_bytes() noexcept {
  return {socket_tensor_bytes_sent.load(std::memory_order_relaxed),
          socket_tensor_bytes_received.load(std::memory_order_relaxed),
          shm_tensor_bytes_sent.load(std::memory_order_relaxed),
          shm_tensor_bytes_received.load(std::memory_order_relaxed)};
}

std::string describe_tensor_bytes(const link_tensor_bytes& moved) {
  return "tensor bytes: " + std::to_string(moved.socket_received) + " in and " +
         std::to_string(moved.socket_sent) + " out through sockets, " +
         std::to_string(moved.shm_received) + " in and " + std::to_string(moved.shm_sent) +
         " out through shared memory";
}

result<data_server> spawn_data_server(caf::actor_system& sys, const std::string& bind_host,
                                      std::uint16_t port, data_server_options options) {
  if (!options.route)
    return error{errc::invalid_argument, "spawn_data_server: options.route is empty"};
  if (bind_host.empty())
    return error{errc::invalid_argument,
                 "spawn_data_server: empty bind address (use 0.0.0.0 for every interface)"};
  if (auto bad = check_tuning(options.tuning, "spawn_data_server"))
    return *bad;
  for (const auto& [bytes, name] :
       {std::pair{options.receive_budget_bytes, "receive_budget_bytes"},
        std::pair{options.max_send_queue_bytes, "max_send_queue_bytes"}})
    if (bytes < options.tuning.limits.max_frame_bytes)
      return error{errc::invalid_argument,
                   "spawn_data_server: " + std::string(name) + " of " + std::to_string(bytes) +
                       " bytes is below limits.max_frame_bytes (" +
                       std::to_string(options.tuning.limits.max_frame_bytes) + ")"};
  const std::string where = bind_host + ":" + std::to_string(port);
  auto& middleman = sys.middleman();
  // The doorman is made here, not with spawn_server, because only the multiplexer takes the
  // address to bind: spawn_server would listen on every interface.
  auto acceptor =
      middleman.backend().new_tcp_doorman(port, bind_host.c_str(), options.reuse_address);
  if (!acceptor) {
    // CAF only says "No local interface available" when the name is the cause: say why.
    auto why = nonlocal_address_reason(bind_host);
    return error{errc::io_error, "cannot listen for data links on " + where + ": " +
                                     (why.empty() ? sys.render(acceptor.error()) : why)};
  }
  data_server server;
  server.port = (*acceptor)->port();
  server.host = (*acceptor)->addr();
  server.broker =
      middleman.spawn_broker(data_server_impl, std::move(*acceptor),
                             server.host + ":" + std::to_string(server.port), std::move(options));
  if (auto failure = await_started(sys, server.broker)) {
    caf::anon_send_exit(server.broker, caf::exit_reason::kill);
    return error{errc::internal, "data server on " + where + ": " + *failure};
  }
  return server;
}

result<caf::actor> connect_data_link(caf::actor_system& sys, const std::string& host,
                                     std::uint16_t port, caf::actor receiver,
                                     data_link_options options) {
  const std::string peer = host + ":" + std::to_string(port);
  if (!receiver)
    return error{errc::invalid_argument, "connect_data_link to " + peer + ": invalid receiver"};
  if (auto bad = check_tuning(options.tuning, "connect_data_link"))
    return *bad;
  auto link = sys.middleman().spawn_client(data_link_impl, host, port, std::move(receiver), peer,
                                           std::move(options));
  if (!link)
    return error{errc::peer_lost,
                 "cannot connect a data link to " + peer + ": " + sys.render(link.error())};
  if (auto failure = await_started(sys, *link)) {
    caf::anon_send_exit(*link, caf::exit_reason::kill);
    return error{errc::peer_lost, "data link to " + peer + ": " + *failure};
  }
  return *link;
}

std::optional<std::string> handshake_refusal(const std::string& reason) {
  // "refused by host:port: words"; a host never holds ": " (an IPv6 address has no space).
  if (!reason.starts_with(refused_by))
    return std::nullopt;
  const auto words = reason.find(": ", refused_by.size());
  if (words == std::string::npos)
    return std::nullopt;
  return reason.substr(words + 2);
}

wire::message no_handler_reply(const wire::message& request) {
  return failure_reply(request, wire::error_code::unsupported,
                       "no handler for " + std::string(wire::kind_name(request)) +
                           " frames on this server");
}

void tune_for_data_path(caf::actor_system_config& cfg) {
  cfg.set("work-stealing.moderate-poll-attempts", 0);
  cfg.set("middleman.max-consecutive-reads", 1);
}

} // namespace troupe

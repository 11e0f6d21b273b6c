#pragma once
// Framed links between processes: pushes, pulls and their replies (and, through the same
// brokers, control messages) travel as Cap'n Proto frames (schema/codec.hpp) over CAF broker
// connections, one per pair of peers, never as BASP messages (CAF's remote actors allocate and
// copy per message, carried 3-5 % of the wire for large tensors and have no backpressure; a
// broker runs at 0.6-1.0x raw TCP and adds ~10 µs to a round trip). docs/data-path.md has the
// design and the measurements.
//
//   // server process: every incoming frame goes to the actor `route` picks
//   auto server = spawn_data_server(sys, "127.0.0.1", 0, {.route = [&](const envelope&) {
//     return shard; }}).value();
//   // shard: (envelope request, reply_sink reply_to) -> send (envelope reply) to reply_to,
//   //        with reply.connection = request.connection
//
//   // worker process: frames from the server arrive at `receiver` as (envelope)
//   auto link = connect_data_link(sys, "127.0.0.1", server.port, receiver).value();
//   caf::anon_send(link, envelope{wire::push{...}, tensor_owner});
//
// Both ends cut frames from the stream into pooled buffers and decode them in place (a decoded
// tensor views the frame buffer, which the envelope's keepalive owns), and write outgoing frames
// in bounded steps as the socket drains, referencing tensors without copying them until CAF's
// write buffer (actors/logic/data_link_framing.hpp). Frames of one connection never interleave.
//
// Handshake: each end's first frame is a link_hello (host identity, shared-memory arena size,
// receive window, a fresh nonce). The listener sends its hello as the connection opens; the
// connector waits for it and answers with its own, which carries an HMAC of the job token over
// both hellos (actors/logic/link_auth.hpp); the listener checks it and answers with link_auth, its
// own proof, which the connector checks. Until then neither end sends anything else, frames are
// capped at max_handshake_frame_bytes, and a wrong or missing proof, any other frame, or a
// handshake not done within tuning.handshake_timeout closes the connection. So nothing an
// unauthenticated peer sends makes a broker allocate more than a few KiB, and its frames never
// reach an actor. A listener refuses a wrong or missing proof with error_reply{not_admitted}
// naming it ("the job token is wrong ..."), any other violation with error_reply{bad_frame}.
//
// Identity (actors/logic/node_identity.hpp): a control connection exchanges keys in the same
// handshake (tuning.key_exchange), and both ends tell their owner the session key
// (on_authenticated), under which the scheduler seals each node's own secret. A worker's data
// link claims its node (tuning.node) and proves its node key; a server that requires it
// (data_server_options::require_node_proof) checks the proof against the key it derives from the
// job secret, holding the hello until that secret arrives, refuses workers declared lost, proves
// the key back, and checks every request of the connection against the proven node
// (data_server_options::authorize) before routing it.
//
// Receive credit: every connection is flow-controlled per direction. The receive window
// (tuning.receive_window_bytes, announced in the hello) bounds the bytes of frames a peer may
// have sent that the receiving process has not yet released: a received frame's bytes come back
// to the sender in a link_credit once the last copy of its envelope is gone (whoever drops it, on
// any thread), and frames beyond the window wait in the sender's queue, still referencing their
// tensors. So an actor that keeps received envelopes holds back its peer: it must not keep more
// than a window's worth while it waits for further frames of the same connection, or the
// connection stalls. The details (batching, a single frame larger than the window, link control
// needing no credit) are in actors/logic/data_link_framing.hpp. Link-control frames (link_hello,
// link_credit, arena_*) are handled by the brokers and never reach an actor.
//
// Trust: every frame is validated (decode_limits) before anything else sees it. A frame that
// fails validation gets an error_reply{bad_frame} naming what was wrong and the connection keeps
// serving; a frame whose length cannot be right (above the cap, not a multiple of 8, contradicted
// by its segment table), and a peer that breaks the link protocol (no hello first, a second
// hello, a frame beyond the window it was granted, a credit for more than it was sent) gets the
// error_reply and then the connection is closed, since the stream cannot be trusted any more.
// Nothing a peer sends can make a broker allocate more than max_frame_bytes for one frame or
// hold more than about a window (plus one frame) of its frames, crash, or touch another
// connection; a peer that has not authenticated, not more than max_handshake_frame_bytes. A
// server holds at most max_connections connections, of which at most max_unauthenticated are
// still in their handshake, and at most options.receive_budget_bytes of authenticated frames over
// all of them: every read is reserved before it is configured, a body above receive_step_bytes
// one step at a time as its bytes arrive, so a connection holds at most a step beyond what
// arrived, and a read beyond the budget waits, its connection unread, in turn with the others
// (connections share the budget, so one may slow another, never fail it). While more than
// max_send_queue_bytes of replies wait for a peer, its requests wait too (held by its window).
// A server closes a connection that stalls inside a frame or takes none of its replies for
// stalled_frame_timeout, or whose frame arrives slower than min_frame_rate once older than
// frame_grace; every peer it closes for its behaviour loses its socket at once (a reset, not a
// close that waits for the peer to read), with a warning naming the peer and why.
//
// TLS (tuning.tls, actors/logic/link_tls.hpp): with credentials, every connection first runs a
// TLS 1.3 handshake with certificates at both ends, from the job's CA and naming a role this end
// takes on the connection (tuning.tls.peer_roles); the link hello, the job token's proof and
// every frame after them travel inside it, unchanged. A handshake that fails closes the
// connection (a client's receiver gets link_down naming the reason); a server reports the role
// each peer's certificate names to options.on_certified. The socket's bytes are then ciphertext
// read in bounded steps (handshake_read_bytes until authenticated, then tls_read_bytes) and
// decrypted into the frame receiver's reads; the handshake timeout covers TLS too.
//
// Same host: when both ends of a connection run on one host (the link hello compares boot id and
// hostname) and tuning.shm_arena_bytes is not 0 at both, tensor payloads of at least
// shm_threshold_bytes travel through a shared-memory arena per direction and only small frames
// through the socket (actors/logic/shm_arena.hpp). Setting it up never fails a link: any failure,
// and a full arena, just means the bytes go through the socket.
//
// Failure detection: brokers have no CAF heartbeats; a closed or reset connection is the signal
// (on_disconnect on the server, link_down_atom at the client's receiver). A peer that hangs with
// its socket open is noticed by the request timeouts of the callers.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>

#include "actors/logic/link_auth.hpp"
#include "actors/logic/link_tls.hpp"
#include "actors/logic/shm_arena.hpp"
#include "actors/protocols.hpp"
#include "engine/error.hpp"
#include "engine/log.hpp"
#include "schema/codec.hpp"

namespace troupe {

/// The address a data server listens on unless configured otherwise: loopback only.
inline constexpr std::string_view default_data_bind_host = "127.0.0.1";

/// A node's identity and key, as its data links prove them.
struct node_credentials {
  wire::node_identity who;
  node_key key;
};

/// Limits and pacing shared by both ends of a data connection.
struct data_link_tuning {
  /// What a frame from the peer may contain. limits.max_frame_bytes (256 MiB by default) caps
  /// every frame body in both directions: an incoming prefix above it closes the connection, an
  /// outgoing frame above it is refused locally (split the tensor with wire::chunker).
  wire::decode_limits limits;
  /// Bytes appended to a connection's write buffer per step (~4 MiB pieces measured best).
  std::size_t write_chunk_bytes = std::size_t{4} << 20;
  /// Most bytes per connection handed to CAF and not yet taken by the socket; more frames wait
  /// in the broker, still referencing their tensors (no copy) until they are appended.
  std::size_t max_bytes_in_flight = std::size_t{8} << 20;
  /// Capacity of received frame buffers one broker keeps for reuse (warm, pre-faulted).
  std::size_t max_cached_buffer_bytes = std::size_t{1} << 30;
  /// Same-host fast path (actors/logic/shm_arena.hpp): size of the shared-memory arena each end of
  /// a connection creates for what it sends, when the link hello shows both ends on one host and
  /// both have a non-zero size. 0: tensors always travel through the socket.
  std::size_t shm_arena_bytes = std::size_t{64} << 20;
  /// Smallest tensor payload sent through the arena; smaller ones, and any that find no room
  /// in the ring, go inline as without an arena.
  std::size_t shm_threshold_bytes = default_shm_threshold_bytes;
  /// Receive window of every connection, announced in the link hello: the bytes of frames
  /// (prefixes included) the peer may have sent that this process has not released yet. 0: no
  /// flow control (the peer may send without bound).
  std::size_t receive_window_bytes = std::size_t{64} << 20;
  /// The job token, which every connection proves in its handshake before anything else
  /// (actors/logic/link_auth.hpp); both ends of a connection need the same one. Empty: the
  /// handshake runs but authenticates nobody.
  link_secret secret;
  /// TLS on every connection: this node's credentials and the roles a peer's certificate may
  /// name; without credentials, plaintext. Both ends of a connection must agree.
  link_tls tls;
  /// Control connections: the connector's hello carries an X25519 key share and it requires the
  /// listener's in link_auth; a listener answers a connector's share with its own. Both ends then
  /// hold the connection's session key (link_authentication::session).
  bool key_exchange = false;
  /// A worker's data links: the node this end is and its key (actors/logic/node_identity.hpp).
  /// The connector claims it in its hello with a proof of the key, and requires the listener's
  /// proof of the same key, which only a server of this job can give.
  std::optional<node_credentials> node{};
  /// From a connection's opening to its authenticated handshake (TLS included) at most this
  /// long; then it is closed (a listener frees the slot, a connector reports link_down).
  std::chrono::milliseconds handshake_timeout{10'000};
  /// After each frame it receives, the broker's multiplexer polls its sockets for this long
  /// before it sleeps in epoll_wait again (actors/io_spin.hpp): the next frame of a small round
  /// trip is then found without a wake-up. Zero (the default: on a loaded machine a polling
  /// thread waits behind the threads that compute; docs/data-path.md): CAF's blocking loop.
  std::chrono::microseconds io_spin{0};
  /// Fusion (docs/data-path.md, "Fusion"): a server's replies made together (the answers to one
  /// read, or to messages waiting in its mailbox) travel in one batch frame of at most
  /// fuse_frame_bytes of tensor, each carrying at most fuse_item_bytes. Nothing waits to be
  /// fused: only what is ready together goes together. fuse_frame_bytes 0: no fusion.
  std::size_t fuse_item_bytes = default_fuse_item_bytes;
  std::size_t fuse_frame_bytes = default_fuse_frame_bytes;
  /// Diagnostics, on the broker's thread: info for connections, the shared-memory set-up and
  /// refused frames; debug for dropped replies and ignored releases. Silent by default.
  logger log;
};

/// One connection's state as its broker sees it (the answer to stats_atom), for tests and
/// diagnostics. Bytes include the 8-byte frame prefixes.
struct data_link_stats {
  /// The connection exists (a server asked for an unknown or closed id says false).
  bool connected = false;
  /// The peer's link hello has arrived.
  bool peer_hello = false;
  /// The handshake is done: the peer proved the job token (and, at the connector, the listener
  /// did too). Until then only the hellos and the listener's link_auth are sent.
  bool authenticated = false;
  /// A server's connection whose peer proved the token and claims a node, and waits for the job
  /// secret to have its node proof checked.
  bool held = false;
  /// The connection runs TLS and its TLS handshake is done.
  bool tls = false;
  /// Sending: the window the peer granted (0: none), bytes sent and not credited back, frames
  /// (and their bytes) waiting for credit, and what the peer credited back in total.
  std::uint64_t peer_window = 0;
  std::uint64_t outstanding = 0;
  std::uint64_t waiting_frames = 0;
  std::uint64_t waiting_bytes = 0;
  std::uint64_t credit_received = 0;
  /// Receiving: our window, received bytes not released yet, released bytes not credited yet,
  /// and what we credited back in total.
  std::uint64_t window = 0;
  std::uint64_t unreleased = 0;
  std::uint64_t uncredited = 0;
  std::uint64_t credit_sent = 0;
  /// Same host: our arena was accepted (tensors we send may go through it), and we mapped the
  /// peer's.
  bool shm_send = false;
  bool shm_receive = false;
  /// Sending: bytes of frames not yet taken by the socket (waiting for credit, queued, or in
  /// CAF's buffer), what data_server_options::max_send_queue_bytes bounds.
  std::uint64_t queued_bytes = 0;
  /// Receiving, on a server: this connection stopped reading because its next read (a body, a
  /// step of one, or the commitment of a body read in steps) does not fit the node's receive
  /// budget; and that budget (data_server_options::receive_budget_bytes, 0 at a client), the
  /// bytes reserved in it now over all connections, the most ever, and how many reads had to
  /// wait for it.
  bool waits_for_budget = false;
  std::uint64_t budget = 0;
  std::uint64_t budget_in_use = 0;
  std::uint64_t budget_peak = 0;
  std::uint64_t budget_waits = 0;
  /// The whole sizes of the frames being read in steps over all connections (they are sure to
  /// fit the budget once they have arrived), and this connection's body bytes of such a frame
  /// that have arrived.
  std::uint64_t budget_committed = 0;
  std::uint64_t body_arrived = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, data_link_stats& x) {
  return f(caf::meta::type_name("data_link_stats"), x.connected, x.peer_hello, x.authenticated,
           x.held, x.tls, x.peer_window, x.outstanding, x.waiting_frames, x.waiting_bytes,
           x.credit_received, x.window, x.unreleased, x.uncredited, x.credit_sent, x.shm_send,
           x.shm_receive, x.queued_bytes, x.waits_for_budget, x.budget, x.budget_in_use,
           x.budget_peak, x.budget_waits, x.budget_committed, x.body_arrived);
}

/// How a data server dispatches and reports.
struct data_server_options {
  /// Chooses the actor that gets each incoming request as (envelope, reply_sink reply_to), the
  /// sink being the broker itself.
  /// Called on the broker's thread for every frame, so it must be quick and must not block.
  /// Required. Returning an invalid actor answers the request with error_reply{unsupported}.
  std::function<request_handler(const envelope&)> route;
  /// Offered each request before route, on the broker's thread, with the broker as the sink of
  /// its replies: returns true when it took the request (a server's shards answer a small one
  /// on this thread when they are idle, or hand it to their actor themselves:
  /// request_router::take in actors/server_node.hpp), false to leave it to route. It must not
  /// block. Optional.
  std::function<bool(envelope& request, const reply_sink& broker)> take_request{};
  /// Told the id of each connection that closed (the peer left, a fatal frame, stop), once per
  /// connection, on the broker's thread. Optional.
  std::function<void(std::uint64_t connection)> on_disconnect;
  /// Under TLS, told the role each connection's peer certificate names once its TLS handshake is
  /// done (before any frame of it is routed), on the broker's thread. Optional.
  std::function<void(std::uint64_t connection, node_role role)> on_certified;
  /// Told what each connection's handshake established (its session key under
  /// tuning.key_exchange, the node its peer proved under require_node_proof) once it is done,
  /// before any frame of it is routed, on the broker's thread. Optional.
  std::function<void(std::uint64_t connection, const link_authentication&)> on_authenticated{};
  /// Every connector must claim a worker and prove its node key (tuning.node at the worker): the
  /// broker derives the key from the job secret, which it is sent as (job_secret) once this
  /// server is admitted; until then a hello that proved the token waits (within
  /// tuning.handshake_timeout; processes start in any order). A worker the broker was told is
  /// lost (a wire::membership listing it not alive) is refused. Either refusal closes the
  /// connection with error_reply{not_admitted} naming the node and the proof.
  bool require_node_proof = false;
  /// Under require_node_proof, checks each request against the node its connection proved before
  /// it is routed (node_identity.hpp's request_refusal): a refusal is answered instead, the
  /// request reaches no actor, and the connection goes on. Called on the broker's thread for
  /// every frame, so it must be quick. Optional.
  std::function<std::optional<wire::error_reply>(const wire::message&, const wire::node_identity&)>
      authorize{};
  /// Under require_node_proof, connections one worker may hold open at once: a further one is
  /// refused at its handshake (error_reply{not_admitted} naming the worker and the bound), so one
  /// member cannot take a share of the receive budget, or of max_connections, that grows with
  /// the connections it opens (a worker needs one per server, and one more while it relinks).
  std::size_t max_connections_per_worker = 4;
  /// SO_REUSEADDR, so a restarted server can rebind its port while old connections linger.
  bool reuse_address = true;
  /// Connections open at once; a new one beyond it is closed as it arrives.
  std::size_t max_connections = 4096;
  /// Connections not yet authenticated; a new one beyond it closes the oldest of them, so a peer
  /// that opens connections and stays silent cannot lock the job's nodes out. A connection whose
  /// peer proved the token and waits for the job secret (require_node_proof) no longer counts:
  /// strangers cannot push it out (it still closes at the handshake timeout).
  std::size_t max_unauthenticated = 64;
  /// Bytes of frames read (or being read) and not yet released, over all connections: windows
  /// bound each connection, this bounds their sum. A read (a body, or a step of one above
  /// receive_step_bytes) that does not fit stops its connection reading until releases make room
  /// (backpressure; nothing is closed); waiting connections are served in turn, and a frame
  /// always fits when nothing else is held (actors/logic/data_link_framing.hpp,
  /// receive_budget). So actors must not keep more than this of received frames while they wait
  /// for frames from other connections. At least limits.max_frame_bytes.
  std::size_t receive_budget_bytes = std::size_t{1} << 30;
  /// Bytes of frames waiting to go to one peer (for its credit or for its socket, CAF's buffer
  /// included) beyond which its further requests wait, in order, unrouted, until the queue
  /// drains (so a worker pulling a model larger than this in one go is slowed, not cut off, and
  /// a peer that does not read cannot make replies pile up: its waiting requests fill its
  /// window). A peer that takes none of its queue for stalled_frame_timeout meanwhile is closed,
  /// naming it. At least limits.max_frame_bytes.
  std::size_t max_send_queue_bytes = std::size_t{256} << 20;
  /// An authenticated connection that has begun a frame (part of its prefix or body arrived) and
  /// sends no further byte for this long is closed, naming the peer (a slow-loris peer would
  /// hold a frame's buffer and budget forever); between frames a connection may be silent as
  /// long as it likes. 0: never. Linux: progress is read from the socket's TCP_INFO.
  std::chrono::milliseconds stalled_frame_timeout{30'000};
  /// A frame in progress must arrive at this rate at least (bytes per second) once it is older
  /// than frame_grace: an authenticated peer whose frame has delivered fewer than
  /// min_frame_rate x (age - frame_grace) bytes is closed, naming it and the numbers. So every
  /// frame ends within frame_grace + its size / min_frame_rate, whatever the trickle (one byte
  /// every few seconds defeats stalled_frame_timeout alone). Age counts only the peer's time:
  /// not while the connection waits for the receive budget, nor while this process has unread
  /// bytes of it in the kernel. Measured from the socket's TCP_INFO every quarter of frame_grace
  /// (and of stalled_frame_timeout). 0: no rate rule. The default, 64 KiB/s (0.5 Mbit/s), is
  /// below any link a job can train over.
  std::uint64_t min_frame_rate = std::uint64_t{64} << 10;
  /// The time a frame may take before min_frame_rate applies. The default, 10 s, is longer than
  /// a node may stay silent before the job counts it lost (timeouts.peer, 5 s).
  std::chrono::milliseconds frame_grace{10'000};
  /// Bodies above this size are read in steps of it (actors/logic/data_link_framing.hpp): each
  /// step claims the receive budget only when the previous one arrived, and is copied into a
  /// body that grows with the bytes (smaller bodies are read whole, in place). So a connection
  /// holds at most this much of the budget that has not arrived. Keep it above the tensor chunk
  /// size (data.chunk_bytes) plus a header, so that tensors are never copied. At least 8.
  std::size_t receive_step_bytes = std::size_t{4} << 20;
  data_link_tuning tuning;
};

/// A running data server.
struct data_server {
  /// The broker. Accepts
  ///   (envelope)      write it on connection envelope.connection (dropped, and logged, when that
  ///                   connection is gone); a message that cannot be encoded is answered to the
  ///                   peer with error_reply{internal} instead;
  ///   (stop_atom)     close the acceptor and every connection (on_disconnect for each), and quit;
  ///   (caf::get_atom) -> std::string: the "host:port" it listens on;
  ///   (stats_atom, std::uint64_t connection) -> data_link_stats of that connection (the budget
  ///                   fields whatever the connection);
  ///   (job_secret)    under require_node_proof: the job secret node keys derive from (the first
  ///                   one counts); held hellos are checked now;
  ///   (wire::membership) under require_node_proof: workers not alive take no new connections,
  ///                   and the connections they hold are closed at once.
  /// An envelope's tensor bytes must stay alive (keepalive) and unchanged until the broker has
  /// copied them into the connection's write buffer, which may be a while after the send when
  /// the connection is busy: reply with a snapshot, not with memory the next update overwrites.
  caf::actor broker;
  /// The port actually bound (the kernel's pick when 0 was asked).
  std::uint16_t port = 0;
  /// The address actually bound, as the socket reports it ("127.0.0.1").
  std::string host;
};

/// What this process's links refused since it started, for the job's summary: frames that
/// failed validation or broke the link protocol (each answered with error_reply{bad_frame}, as is
/// a peer that fails the handshake), and the connections closed for it.
struct link_refusals {
  std::uint64_t bad_frames = 0;
  std::uint64_t peers_closed = 0;
};
link_refusals process_link_refusals() noexcept;

/// Tensor payload bytes this process's data links moved since it started, by way: through the
/// sockets (inline in frames) or through same-host shared-memory arenas (docs/data-path.md,
/// "Same host"). Sent: payloads encoded for a peer (counted when queued); received: payloads of
/// valid frames handed on. The summary's "tensor bytes" line; a job between hosts moves none
/// through shared memory.
struct link_tensor_bytes {
  std::uint64_t socket_sent = 0;
  std::uint64_t socket_received = 0;
  std::uint64_t shm_sent = 0;
  std::uint64_t shm_received = 0;
};
link_tensor_bytes process_link_tensor_bytes() noexcept;

/// The summary line of `moved`, the same on servers and workers: "tensor bytes: A in and B out
/// through sockets, C in and D out through shared memory".
std::string describe_tensor_bytes(const link_tensor_bytes& moved);

/// Listens on bind_host:port (bind_host exactly: "0.0.0.0" is the only way to listen on every
/// interface; port 0 lets the kernel pick) and spawns the server broker. For each complete,
/// valid frame on connection c except link control it sends (envelope{msg, keepalive = frame
/// buffer and receive credit, connection = c}, reply_sink broker) to options.route(envelope),
/// unless options.take_request took it; whoever answers sends (envelope) with the same connection
/// id back to the broker. Dropping the last copy of a request envelope returns its bytes to the
/// peer's window. Returns once the broker is listening. Errors: invalid_argument (no route, empty
/// bind_host, zero write pacing), io_error (the address cannot be bound), naming host:port.
/// receive_budget_bytes or max_send_queue_bytes below limits.max_frame_bytes is invalid_argument
/// too.
result<data_server> spawn_data_server(caf::actor_system& sys, const std::string& bind_host,
                                      std::uint16_t port, data_server_options options);

/// A client link's sending side as the threads of its owner may use it, so that a small frame goes
/// from the thread that made it straight to the socket, without a message to the broker and the
/// wake-up of the middleman's I/O thread that it costs (docs/data-path.md, "Where a small
/// request's time goes"). The broker keeps the connection's state under the lane's lock while it
/// runs, and opens the lane once the link's handshake is done (never under TLS). Thread-safe.
///
/// Order: an owner that uses a lane hands the link every envelope through write_now or take, or
/// as (handed_atom, envelope) after handing() (never plain), so that write_now and take, which
/// write only when every handed envelope has been taken, never overtake an earlier frame.
///
/// Locks: the lane's lock is only ever taken alone or under the owner's one lock (the worker's,
/// actors/kv_worker.hpp), and nothing that holds it blocks: the send on the socket happens after
/// it is released (send_staged), and so does every message that a thread other than the I/O
/// thread would send from here (a message to a broker may write to the multiplexer's pipe, whose
/// write end blocks when the pipe is full).
class link_lane : public std::enable_shared_from_this<link_lane> {
public:
  link_lane() = default;
  ~link_lane();
  link_lane(const link_lane&) = delete;
  link_lane& operator=(const link_lane&) = delete;

  /// On the owner's actor's thread: encodes `request` for one non-blocking send of its frame when
  /// the lane is open, nothing handed to the broker is still in its mailbox, the connection has
  /// nothing queued, waiting for credit, in CAF's buffers or being sent from another thread, and
  /// the frame is small (its tensor at most direct_tensor_bytes and inline, not through the
  /// shared-memory arena). The bytes are staged: the send itself happens in send_staged(), which
  /// the same thread must call once it holds no lock of its own (a thread preempted inside the
  /// send would otherwise hold up every thread waiting for that lock); meanwhile the broker writes
  /// nothing on the connection, so nothing overtakes the frame. A frame the peer's window does not
  /// admit yet waits in the connection's queue, as any other. Returns true when the link took the
  /// frame (request.keepalive is then gone: dropped once the bytes are staged, or kept in the
  /// queue); false, with `request` as it was, when it must be handed instead.
  bool write_now(envelope& request);
  /// Whether take() would take the owner's frames now: the lane is open and nothing handed to the
  /// broker is still in its mailbox. With the owner's lock held, which every handing() and take()
  /// needs too, the answer holds until that lock is released (the lane can only close meanwhile:
  /// the link went down, and take() then drops the frame, as the broker would).
  bool takes_now();
  /// On any thread of the owner, holding the owner's lock, after takes_now() said yes: the frame
  /// goes into the connection's queue behind whatever it holds, its bytes staged as write_now
  /// stages them when the connection is idle; when it is not, the broker is woken (after the
  /// locks, by send_staged) to write it. A frame that cannot be encoded is not sent: the link's
  /// receiver gets the error reply the broker would send, after the locks too. Never sends a
  /// message itself, so it never blocks.
  void take(envelope& request);
  /// On the thread that called write_now or take: sends what it staged, then lets the broker write
  /// what the socket did not take (and anything queued meanwhile), and sends the messages those
  /// calls left for after the locks. No lock may be held.
  static void send_staged();
  /// Before sending (handed_atom, envelope) to the broker: counts it as handed.
  void handing() noexcept { handed_.fetch_add(1, std::memory_order_relaxed); }

  /// Tensors larger than this never go through write_now.
  static constexpr std::size_t direct_tensor_bytes = std::size_t{64} << 10;

  // The broker's side.

  /// What the broker's writer does with a frame (open).
  enum class write_mode {
    /// write_now: take it only when its bytes can be staged for one send.
    when_idle,
    /// take: take it in any case, staging its bytes when the connection is idle and `staged` is
    /// free (not null).
    always,
  };
  using writer_function = std::function<bool(envelope&, std::vector<char>* staged, write_mode)>;

  /// The lock the broker holds while it runs.
  std::mutex& mutex() noexcept { return mutex_; }
  /// With the lock held: write_now and take run `writer` from now on, which stages a frame's
  /// bytes (it returns whether it took the frame, and leaves the staging empty when nothing is to
  /// be sent), and the staged bytes go out on `fd`, which the lane owns from now on; `finish` runs,
  /// with the lock held, once a send is done, with the bytes the socket did not take.
  void open(int fd, writer_function writer,
            std::function<void(std::span<const char> left, std::size_t taken)> finish);
  /// With the lock held: write_now and take take nothing more and the descriptor is closed (after
  /// the send in progress, if any).
  void close() noexcept;
  /// With the lock held: a handed envelope is being taken into the connection's queue.
  void handled_one() noexcept { handed_.fetch_sub(1, std::memory_order_relaxed); }
  /// With the lock held, on a thread other than the broker's: `message` runs once this thread
  /// holds no lock (send_staged), e.g. a message to the broker, which may block.
  static void after_locks(std::function<void()> message);

private:
  void send_now();

  std::mutex mutex_;
  writer_function writer_;
  std::function<void(std::span<const char>, std::size_t)> finish_;
  /// Ours, a duplicate of the broker's socket: CAF may close its own on the I/O thread at any
  /// time.
  int fd_ = -1;
  /// Bytes staged by write_now or take, sent by send_staged (the only user while `sending_`).
  std::vector<char> staged_;
  bool sending_ = false;
  bool close_after_send_ = false;
  /// Envelopes handed to the broker that it has not taken yet. Raised by the owner's threads,
  /// lowered by the broker under the lock.
  std::atomic<std::size_t> handed_{0};
};

/// How a client data link behaves.
struct data_link_options {
  data_link_tuning tuning;
  /// Carried by everything the link tells its receiver: envelope::connection of each frame, and
  /// the link_down notice, so that one receiver can tell several links apart.
  std::uint64_t tag = 0;
  /// Told what the handshake established (the session key under tuning.key_exchange) once it is
  /// done, on the broker's thread, before the receiver gets any frame of the link. Optional.
  std::function<void(const link_authentication&)> on_authenticated{};
  /// Shared with the link's owner, which may then write small frames from its own threads
  /// (link_lane). Optional.
  std::shared_ptr<link_lane> lane{};
};

/// Connects to a data server at host:port (blocks for the TCP handshake) and spawns the client
/// broker, which accepts:
///   (envelope), (handed_atom, envelope) with options.lane (link_lane::handing)
///                encode and send it; frames go out in the order sent, never interleaved. A
///                message that cannot be encoded (or exceeds max_frame_bytes) is not sent:
///                `receiver` gets (envelope{error_reply{request id, internal, why}}) instead;
///   (stop_atom)  close the connection (frames not yet handed to the socket are dropped);
///   (caf::get_atom) -> std::string: the peer's "host:port";
///   (stats_atom) -> data_link_stats of the connection.
/// As on the server, an envelope's tensor bytes must stay alive and unchanged until written.
/// Every frame from the server except link control arrives at `receiver` as (envelope)
/// (keepalive = frame buffer and receive credit, connection = options.tag); dropping its last
/// copy returns its bytes to the server's window. A frame that fails validation arrives as a local
/// (envelope{error_reply{0, bad_frame, what}}). When the connection closes, fails, carries a
/// frame that breaks the framing or the link protocol, or is stopped, `receiver` gets
/// (link_down_atom, options.tag, std::string reason naming host:port) once and the broker quits;
/// it also quits when `receiver` terminates. When the server refused the handshake, the reason is
/// "refused by host:port: " and the server's words ("the job token is wrong (...)").
/// Errors: invalid_argument (invalid receiver), peer_lost (no connection: names host:port and
/// why).
result<caf::actor> connect_data_link(caf::actor_system& sys, const std::string& host,
                                     std::uint16_t port, caf::actor receiver,
                                     data_link_options options = {});

/// The server's words ("the job token is wrong (...)") when a client link's link_down `reason`
/// says the server refused its handshake ("refused by host:port: ..."); nullopt for any other
/// reason (the link closed, failed or broke).
std::optional<std::string> handshake_refusal(const std::string& reason);

/// The answer to a request that options.route sends to nobody: error_reply{unsupported} with its
/// request id and key, naming its kind. In-process links answer the same way.
wire::message no_handler_reply(const wire::message& request);

/// Scheduler settings for processes with actors on the data path, written into `cfg` (call it
/// after cfg.parse(), which it overrides): work-stealing.moderate-poll-attempts = 0. CAF's idle
/// workers otherwise spend their second polling phase in 50 µs sleeps and take up to ~100 µs to
/// notice a request the broker hands them; without that phase they spin briefly and then wait
/// on a condition variable that every enqueue signals. Measured (docs/data-path.md): a 4 KiB
/// push round trip went from ~130 µs to ~33 µs. Has no effect under scheduler.policy=sharing.
/// And middleman.max-consecutive-reads = 1: a socket's readiness is served by one read. Small
/// frames are read coalesced (whatever has arrived, many frames per read) and a large body by
/// reads of what remains of it, so a second read per readiness would mostly return EAGAIN; more
/// bytes waiting wake the level-triggered epoll again at once.
void tune_for_data_path(caf::actor_system_config& cfg);

} // namespace troupe

#pragma once
// The rules of a KVStore worker (MXNet's KVStoreDist / ps-lite's KVWorker): everything between a
// call and the servers, as a plain class that takes calls and replies and says what to send to
// which server. The worker actor (actors/kv_worker.hpp) wraps it: it owns the links, the copier
// thread for large replies, the helper thread that relinks a restarted server, and the ticks.
//
//   facade (dist_kvstore) ──kv_operation──> worker_core ──envelope──> output.send(server s)
//                         <──completion────             <──envelope── on_reply (tag s + 1)
//
// It owns routing (a key's slices and their servers, actors/logic/key_placement.hpp), the requests
// under way, the reassembly of pull replies into the caller's outputs, and the round numbers of
// every ps-key. Calls are handled in the order they are made, and the requests of one ps-key
// leave in that order on that server's link, so a pull after a push sees the push.
//
// Sync credit. In dist_sync a server accepts pushes at most max_rounds_ahead rounds beyond the
// round it is collecting (sync_settings). The worker sends the push of round t of a ps-key only
// while t < completed + max_rounds_ahead, `completed` being the latest Ack.round or
// PullReply.round of that key; later requests of the key wait here, in order, holding their
// tensors (no copy), until an answer brings credit. A push acked `dropped` (its round closed with
// a quorum of other workers) is counted and leaves the key's round numbers as they are: a
// straggler keeps pushing the rounds in order, its late ones dropped, so that every round of
// every worker reaches its quorum and the last rounds of a job close.
//
// The send queue. A request that may leave (it has credit) waits in its server's send queue, and
// the queue hands the link one frame at a time while fewer than send_window_bytes of tensor are
// with the link (handed over, not yet let go: send_receipt). The next frame is always the head of
// the request with the highest priority (kv_operation::priority; equal priorities in the order
// they were queued), and a large tensor leaves chunk by chunk (chunk_bytes), so a small urgent
// request queued behind a large one overtakes its remaining chunks (P3's slicing):
//
//   calls ──> per ps-key: waiting for credit ──> server s: ready requests, by priority ──> link s
//              (in call order)                     (head of each ps-key; then keyless)  (≤ window
//                                                                                        of bytes)
//        push  key 9 (priority -9, 64 chunks)  ──┐   ┌─ push 0 (prio 0) ─┐
//        push  key 0 (priority  0,  1 chunk)   ──┴─> │  push 9 (prio -9)  │ ──> 9.0 9.1 0.0 9.2 ...
//
// Slice credit (slice_credit, dist_sync). Every slice of a key is a ps-key with rounds of its
// own, so sync credit alone lets a worker push all of a key's slices at once. Where several
// workers push to one server, their flows share its ingress unevenly: the slowest worker's push
// of a slice arrives long after the others', its round closes only then, and the server's
// answers trail what it received (BENCHMARKS.md, "Issue 24's targets across hosts"). The slices
// of one key on one server (a group) therefore share slice_credit credits: a push of a key cut
// into several slices on its server takes one when it is sent and gives it back with its answer
// (the pushpull's value once its round closed, the push's ack, a failure, a timeout,
// cancellation). Credits are granted in the order the group's pushes ask for them, which is call
// order and then slice order, the same sequence on every worker, so a worker that runs ahead
// waits for the rounds of its earlier slices, that is for the slowest worker, and the rounds close
// in order while the uploads go on:
//
//   key of 8 slices on server s, slice_credit 3     time ─>
//     worker → s   [0][1][2]  .  [3]  .  [4]  .  [5] ...   slice 3 leaves once slice 0's round
//     s → worker          .  [0]  .  [1]  .  [2] ...       closed and its value came back
//
// A ps-key whose waiting push lacks sync credit keeps its place in the turn, so the grants stay in
// that order. Never a deadlock: a worker that has not sent the earliest push of a group that some
// worker has not had answered holds none of the group's credits (its earlier pushes were
// answered), so every worker sends it, its round closes (or closed without it: dropped, answered
// at once), and it is answered; groups wait on nothing of each other, and priorities only order
// what may leave. A push sent again after a server restart keeps the credit it took and takes
// none. Pulls, inits, a key that is one ps-key per server, dist_async and a job of one worker
// (nobody to keep in step with) take none.
//
// Fusion. Small requests (a push, pull or pushpull whose tensor holds at most fuse_item_bytes, in
// one frame) that are ready together leave in one batch frame (wire::batch), in the order the
// queue would have sent them one by one; the server handles them in that order, as if each had
// come alone, and answers those it answers together in one batch too. So nothing of the rules
// changes, only the frames. Nothing waits to be fused: while a call of many keys is taken, its
// requests gather in the send queue and leave once fuse_frame_bytes of them are ready, and the
// rest when the call has been taken (a window that is full gathers them the same way).
//
// Only the head of a ps-key is ready: a key's requests leave in call order whatever their
// priorities, one after the other, so a pull after a push still sees the push. A keyless request
// (every_server) leaves after everything queued before it and before everything queued after.
// A request's frames interleave only with other ps-keys' frames, at frame boundaries (a shard
// takes a push's chunks in order per key, docs/protocol.md). Once its first frame is queued a
// request goes out whole even if its call ends meanwhile: its round is spent.
//
// Timeouts and cancellation. A request's timeout runs from when it was sent (not from when it was
// queued behind others for credit; waiting in the send queue counts, as time in the link's
// queue did); the worker sweeps every tick (on_tick) and fails a request that is
// overdue, with the requests of its ps-key waiting behind it. Outputs are written only inside the
// call's completion (completion::while_live), so once the caller has stopped waiting (a failure
// was delivered, or it cancelled), a late reply never writes into a buffer it took back.
//
// Failure. A link that goes down, or the node agent's notice that the job failed, fails every
// call under way and every later one with errc::peer_lost naming the lost node and its role. A
// server that refused the link's handshake (this worker's node key or token) fails them at once
// with errc::invalid_argument, "server 0 (node 8) at host:port refused this worker: ...".
//
// Server recovery (server_rejoin > 0 and a way to relink). Every push is copied when it leaves,
// and the copy is kept until the server says that the push is durable (Ack.durable,
// PullReply.durable: the rounds in the shard's last checkpoint written to disk in dist_sync; in
// dist_async the number of this worker's next push there, a push's round being its sequence
// number). A server link that goes down then fails nothing: the requests to that server stay
// under way (their timeouts stop) and new ones queue, until a membership table lists the server
// alive again after one listed it lost. The worker links to its new address (output::relink) and
// sends again, per ps-key and in order, every kept push (Push.resent: the shard acks without
// applying one that its restored checkpoint already holds) and every pull under way, with the
// credit counted from the durable round. So an acked push lost with the server is applied exactly
// once, in dist_async too (a push the server refused is not kept: it was never applied). Commands
// under way to that server (every_server calls) and an init or a large reply being copied when the
// server went fail with errc::peer_lost. If the server is not back within server_rejoin +
// request_timeout, everything fails as above.
//
// Key ranges that move (elastic servers: range_owner set, job.max_servers above the servers). A
// server hands a key range to another at once, with the rounds its keys completed; what a round
// not completed held there is gone, and later requests of the range are refused with error moved.
// So the worker keeps a copy of every push until the server says its round is complete (as for a
// server's recovery, the durable round of Ack.durable and PullReply.durable, which a shard without
// checkpoints sets to the rounds completed). A request refused as moved stays under way (its
// timeout runs) until a membership table gives its range to another server
// (Membership.keyRanges); then, per ps-key of the range and in round order, every kept push and
// every request no reply has reached yet goes there (pushes as resent: one whose round the new
// server's state already holds is acknowledged without being applied), and the range's later
// requests go there too. A reply of the old server that arrives after that finds no request under
// its id and is dropped. A server a table lists for the first time
// joined the running job: the worker links to it (output::relink) and its requests wait for the
// link (calls for every server include it from then on).
//
// Threads: one thread at a time calls a worker_core (the actor's, or a caller's under the lock it
// shares with the actor: actors/kv_worker.hpp, worker_lane); only the copy jobs it hands to
// output::copy_elsewhere run elsewhere, and they touch nothing but their request's reassembly and
// the call's completion. Time is options.clock, so tests move it by hand.

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/logic/completion.hpp"
#include "actors/logic/envelope.hpp"
#include "actors/logic/key_placement.hpp"
#include "actors/logic/kv_operation.hpp"
#include "actors/logic/latency_histogram.hpp"
#include "engine/error.hpp"
#include "engine/log.hpp"
#include "engine/ndarray.hpp"
#include "schema/chunking.hpp"

namespace troupe {

using worker_clock = std::chrono::steady_clock;

/// Replies at least this large are copied into the caller's output elsewhere
/// (output::copy_elsewhere), not on the worker's thread: a 128 MiB push+pull copied on the I/O
/// thread kept it from reading the next chunks meanwhile, and took 1.02-1.05x the time of the old
/// worker, whose copies ran elsewhere (BENCHMARKS.md). Smaller replies are copied at once: a hop
/// to another thread would cost more than the copy.
inline constexpr std::size_t copy_off_thread_bytes = std::size_t{1} << 20;

struct worker_core_options {
  std::uint32_t rank = 0;
  std::uint32_t num_servers = 1;
  /// The server that holds each of the job's key ranges (Membership.keyRanges, in range order):
  /// keys are placed by MXNet's rule over range_owner.size() ranges (key_placement.hpp), each
  /// range's slices sent to its owner. Empty: one range per server, range i on server i.
  std::vector<std::uint32_t> range_owner;
  /// Workers in the job: slice credit keeps several in step, and a worker alone takes none.
  std::uint32_t num_workers = 1;
  /// dist_sync (rounds, credit) or dist_async.
  bool sync = true;
  /// The worker joined the running job (Admitted.joined): in dist_sync a ps-key's rounds start
  /// where the server says, in the reply to the worker's first pull of it (dist_kvstore's init
  /// pulls every key), not at 0.
  bool joined = false;
  /// MXNET_KVSTORE_BIGARRAY_BOUND.
  std::int64_t bigarray_bound = 1'000'000;
  /// Largest tensor payload per frame.
  std::size_t chunk_bytes = wire::default_chunk_bytes;
  /// The servers' largest frame (data.max_frame_bytes): a row-sparse push, one frame per server,
  /// must fit it.
  std::uint64_t max_frame_bytes = std::uint64_t{256} << 20;
  /// Keys larger than this many bytes are cut into slices (key_placement.hpp); 0: none.
  std::size_t slice_bytes = 0;
  /// A request not answered this long after it was sent fails with errc::timeout.
  std::chrono::milliseconds request_timeout{30'000};
  /// The servers' sync_settings::max_rounds_ahead.
  std::uint32_t max_rounds_ahead = 2;
  /// Bytes of tensor per server handed to its link and not yet let go (send_receipt): the rest
  /// waits in the send queue, where priority orders it. A frame larger than the window goes
  /// alone. 0: no bound (every frame is handed over at once, in queue order).
  std::size_t send_window_bytes = default_send_window_bytes;
  /// Fusion (see "The send queue"): requests whose tensor holds at most fuse_item_bytes leave
  /// together in one batch frame of at most fuse_frame_bytes of tensor when they are ready
  /// together. fuse_frame_bytes 0: each in a frame of its own.
  std::size_t fuse_item_bytes = default_fuse_item_bytes;
  std::size_t fuse_frame_bytes = default_fuse_frame_bytes;
  /// dist_sync: pushes of one key's slices on one server whose answers may be outstanding at
  /// once (see "Slice credit"). 0: no bound.
  std::uint32_t slice_credit = default_slice_credit;
  /// How long the job keeps a lost server's rank open for a server restarted from its
  /// checkpoint (timeouts.server_rejoin). Above 0, with can_relink, a server link that goes down
  /// holds the calls to that server instead of failing them (see "Server recovery").
  std::chrono::milliseconds server_rejoin{0};
  /// The output can link to a restarted server's new address (output::relink).
  bool can_relink = false;
  logger log;
  /// Where the end-of-job summary goes (observe.summary): per server the requests and bytes, and
  /// the p50 / p99 time of pushes, pulls and pushpulls. A silent logger: none.
  logger summary_log;
  /// The summary's last line (the process's data links' counters); null: none.
  std::function<std::string()> summary_footer;
  /// The time requests are stamped and swept against; null: worker_clock::now.
  std::function<worker_clock::time_point()> clock;
};

class worker_core {
public:
  /// What the core asks of whoever runs it (the worker actor, a test). Called on the core's
  /// thread, from inside the core's own calls.
  class output {
  public:
    virtual ~output() = default;
    /// Hands `request` to the link of `server` (request.connection is server + 1). When
    /// receipt.bytes is not 0, calls frame_left(receipt) once the link has let go of the frame
    /// (the last copy of request.keepalive is gone), on the core's thread.
    virtual void send(std::uint32_t server, envelope request, send_receipt receipt) = 0;
    /// Runs `copy` on another thread (a large reply chunk, see copy_off_thread_bytes), then
    /// calls on_copied(id, ...) on the core's thread with what it returned. Copy jobs of the core
    /// run one at a time, in the order they were handed over.
    virtual void copy_elsewhere(std::uint64_t id,
                                std::function<std::pair<chunk_copy, std::string>()> copy) = 0;
    /// The link with `tag` went down: on_lost_report(tag, why) after a grace, so that a notice
    /// naming the node that was really lost (or a table saying the server left) comes first.
    virtual void report_lost_later(std::uint64_t tag, std::string why) = 0;
    /// Server recovery: links to `server` at its new address, then calls on_relink.
    virtual void relink(const wire::node_info& server) = 0;
  };

  /// `out` outlives the core.
  worker_core(worker_core_options options, output& out);
  /// Whatever is still under way ends now with errc::peer_lost ("the KVStore worker stopped"): a
  /// caller never waits on a worker that is gone.
  ~worker_core();
  worker_core(const worker_core&) = delete;
  worker_core& operator=(const worker_core&) = delete;

  /// The servers' links are open; `names` says how messages name each server ("server 1 (node
  /// 10) at 127.0.0.1:40123"; empty: "server 1"). Calls before this fail.
  void on_links(std::vector<std::string> names);
  /// A call from the facade; its outcome goes to op.done.
  void on_call(kv_operation& op);
  /// Between these, the requests of the calls taken gather in the send queues, to leave fused
  /// (see "Fusion") once a fused frame's worth is ready for a server, or at end_gathering. Calls
  /// handed to the actor together are taken so. They nest.
  void begin_gathering() noexcept { ++gathering_; }
  void end_gathering();
  /// A reply from the server linked under tag reply.connection.
  void on_reply(envelope& reply);
  /// A frame handed over with this receipt has left: its bytes no longer count against its
  /// server's window, and more frames may go.
  void frame_left(const send_receipt& receipt);
  /// The copy job handed to output::copy_elsewhere for request `id` ended so.
  void on_copied(std::uint64_t id, chunk_copy how, const std::string& problem);
  /// The link with `tag` (server + 1) went down, and why; `current` says whether it is the
  /// server's current link (an old one may close after its replacement opened).
  void on_link_down(std::uint64_t tag, const std::string& why, bool current);
  /// The server linked with `tag` refused this worker's handshake, in `words` (its node key, its
  /// token): everything fails with errc::invalid_argument, as the server will say no again.
  void on_refused(std::uint64_t tag, const std::string& words);
  /// The grace after the link with `tag` went down is over (output::report_lost_later): every
  /// call fails with errc::peer_lost and `why`, unless a membership table has listed the server
  /// left meanwhile (elastic servers: it handed its key ranges over and stopped).
  void on_lost_report(std::uint64_t tag, const std::string& why);
  /// Every call under way and every later one fails with `why`; the first failure wins.
  void fail_everything(error why);
  /// The job's membership changed: lost workers are logged; with server recovery, a server
  /// listed lost holds its requests, and listed alive again is relinked (output::relink).
  void on_membership(const wire::membership& table);

  /// What to do with a relink that came back (output::relink).
  enum class relink_step : std::uint8_t {
    ignore,         ///< nothing: no such server, or it could not link (everything failed)
    close_new_link, ///< the worker failed meanwhile: close the new link
    install         ///< close the old link, use the new one, then call server_back
  };
  /// A relink of `server` came back: linked, or not (then `problem` says why).
  relink_step on_relink(std::uint32_t server, bool linked, const std::string& name,
                        const std::string& problem);
  /// The new link of `server` (named `name` from now on) is installed: sends again what the
  /// server needs (see "Server recovery").
  void server_back(std::uint32_t server, std::string name);

  /// Fails overdue requests, drops cancelled ones, gives up on a server that did not come back,
  /// ends a finalize that ran out of time. The actor calls it every tick_interval().
  void on_tick();
  std::chrono::milliseconds tick_interval() const noexcept;
  /// `done` is delivered once nothing is under way (after the summary), or with errc::timeout
  /// when requests are still under way request_timeout from now.
  void on_finalize(completion<result<std::uint64_t>> done);

  /// Whether `op` would leave at once, whole and alone: a push, pull or pushpull of one key whose
  /// tensor holds at most `max_bytes` and goes to one server, with credit, nothing queued for that
  /// server, nothing of its ps-key waiting or queued, room in the server's window, the server not
  /// held for recovery and the worker not failed. A caller's thread runs such a call itself
  /// (actors/kv_worker.hpp, worker_lane); the rules are the same either way.
  bool sends_at_once(const kv_operation& op, std::size_t max_bytes) const;
  /// The same, with the server it would go to.
  std::optional<std::uint32_t> sends_at_once_to(const kv_operation& op,
                                                std::size_t max_bytes) const;
  /// What sends_at_once asks of the call alone (one key of at most `max_bytes`, a push, pull or
  /// pushpull), without the worker's state: a call that fails it never leaves at once, so a
  /// caller learns so without taking the lock the worker's I/O thread may hold for a while (a
  /// reply's copy into the caller's array).
  static bool small_enough_to_send_at_once(const kv_operation& op, std::size_t max_bytes);

  /// Requests sent and not yet answered.
  std::size_t under_way() const noexcept { return parts_.size(); }
  /// Requests of ps-key `ps_key` held back for credit.
  std::size_t waiting_for_credit(std::uint64_t ps_key) const;
  /// Bytes of tensor handed to the link of `server` and not yet let go.
  std::uint64_t bytes_with_link(std::uint32_t server) const;
  /// Slice credits of key `key`'s slices on `server` taken by pushes not yet answered.
  std::uint32_t slice_credits_taken(std::uint64_t key, std::uint32_t server) const;
  /// Pushes that arrived after their round had closed and were dropped.
  std::uint64_t dropped_pushes() const noexcept { return dropped_pushes_; }

private:
  /// The key ranges keys are placed over (worker_core_options::range_owner).
  std::uint32_t num_ranges() const noexcept;
  /// `slices` as placed over the key ranges, each sent to the server that holds its range.
  key_slices to_owners(key_slices slices) const;

  /// A call under way: how many of its requests are still expected, and how it ends.
  struct call_state {
    call_state() = default;
    explicit call_state(completion<status> outcome) : done(std::move(outcome)) {}

    completion<status> done;
    std::size_t remaining = 0;
    bool ended = false;

    /// The first end wins; later ones (a second failure, a late success) change nothing.
    void end(status outcome) {
      if (ended)
        return;
      ended = true;
      done.deliver(std::move(outcome));
    }
    /// Nothing more of this call needs doing: it ended, or its caller stopped waiting.
    bool over() const { return ended || done.cancelled(); }
  };

  /// Where the value of one key's pull lands: straight in the one host output, or in a staging
  /// buffer copied to every output once each slice has arrived.
  struct pull_target {
    ndarray buffer;
    std::vector<ndarray> copies; ///< empty when buffer is the output itself
    std::size_t slices_left = 0;
  };

  /// One request to one server: one slice of one key, or a keyless message.
  struct part {
    std::shared_ptr<call_state> call;
    kv_call kind = kv_call::every_server;
    std::uint32_t server = 0;
    /// The key's name, or for a keyless request the call's (how errors name it: what_of).
    std::string name;
    /// Keyed requests.
    key_slice slice;
    bool whole = true; ///< the slice is the whole key (not split over servers)
    /// init, push, pushpull: the host value whose slice is sent (kept alive while frames view it).
    ndarray value;
    /// pull, pushpull: the reassembly of the reply into target->buffer.
    std::optional<wire::reassembler> assembly;
    std::shared_ptr<pull_target> target;
    /// Set when the request leaves; its timeout runs from here.
    worker_clock::time_point sent_at;
    /// When it left on the job trace's clock (job_trace.hpp); 0: not traced.
    std::int64_t traced_since_us = 0;
    /// The first chunk of the reply has arrived (its round was learnt).
    bool reply_seen = false;
    /// The reply's chunks are copied elsewhere (copy_off_thread_bytes), by jobs that alone touch
    /// `assembly` from then on.
    bool copy_off_thread = false;
    /// pull, pushpull: where `assembly` writes, so that a resent request starts it afresh.
    std::span<std::byte> out_bytes;
    wire::dtype out_type = wire::dtype::float32;
    wire::tensor_shape out_shape;
    /// push, pushpull, pull: the round it was sent with.
    std::uint64_t round = 0;
    /// Sent again after its server restarted: with `round`, as Push.resent.
    bool resend = false;
    /// kv_operation::priority.
    int priority = 0;
    /// push, pushpull: kv_operation::compression, when it applies to the key's dtype.
    gradient_compression compression;
    /// pull, pushpull: the rule its reply may be packed by (compression.pulls), or none.
    gradient_compression reply_compression = {compression_type::none};
    /// Once sent compressed: the slice's packed bytes (int32 words), which its frames view.
    ndarray packed;
    /// The key has several slices on this server: its pushes take slice credit of `group`.
    bool sliced = false;
    std::uint64_t group = 0;
    /// It took one of its group's slice credits, not yet given back.
    bool holds_slice_credit = false;
    /// A row_sparse key's part (kv_key_work::row_sparse): init sends the dense rows
    /// [slice.first_row, slice.end_row) with shape `part_shape`; a push sends the rows `rows`
    /// (relative to slice.first_row), whose values are elements [slice.begin, slice.end) of
    /// `value`, with shape `part_shape`; a pull asks for the rows `rows` into out_bytes.
    bool row_sparse = false;
    std::shared_ptr<const std::vector<std::int64_t>> rows = {};
    wire::tensor_shape part_shape;
  };

  /// Where a ready request stands in its server's send queue: earlier barrier epochs first (a
  /// keyless request ends one), keyed requests before the keyless one of their epoch, then
  /// higher priority, then the order they were queued.
  struct send_order {
    std::uint64_t epoch = 0;
    bool keyless = false;
    int priority = 0;
    std::uint64_t sequence = 0;
    bool operator<(const send_order& other) const {
      if (epoch != other.epoch)
        return epoch < other.epoch;
      if (keyless != other.keyless)
        return !keyless;
      if (priority != other.priority)
        return priority > other.priority;
      return sequence < other.sequence;
    }
  };

  /// A request in its server's send queue: its frames (one, or a tensor's chunks) and how many
  /// have gone.
  struct outgoing {
    std::shared_ptr<part> p; ///< holds the value its frames view
    std::optional<wire::chunker> frames;
    std::shared_ptr<const void> keepalive;
    std::size_t next = 0;
    send_order order;
  };

  /// A server's ready requests, by send_order.
  using send_queue = std::map<send_order, outgoing>;

  /// A copy of a push this worker sent, kept until its round is durable at the server.
  struct kept_push {
    std::uint64_t round = 0;
    ndarray copy;
    /// A row-sparse push: its rows (the copy holds their values).
    std::shared_ptr<const std::vector<std::int64_t>> rows = {};
  };

  /// The rounds of one ps-key as this worker sees them, and its requests waiting for credit.
  struct ps_key_state {
    /// Pushes of the key sent so far: the round of the next push, and of a pull's value.
    std::uint64_t next_round = 0;
    /// A push of the key has been sent (a worker that joined starts its rounds before that).
    bool pushed = false;
    /// Rounds the server has completed, from its latest answer.
    std::uint64_t completed = 0;
    /// Requests not yet sent, in call order, behind a push that has no credit.
    std::deque<std::shared_ptr<part>> waiting;
    /// The server that holds the ps-key.
    std::uint32_t server = 0;
    /// Server recovery: rounds the server's last written checkpoint holds, and copies of the
    /// pushes of later rounds, in round order.
    std::uint64_t durable = 0;
    std::deque<kept_push> kept;
    /// In the send queue: whether the key's head is among its server's ready requests, and the
    /// requests behind it, in order.
    bool head_ready = false;
    std::deque<outgoing> queued;
    /// Slice credit: the group of the key's slices on its server, once a push of a key with
    /// several slices there came; whether a push of it waits in that group's turn.
    std::optional<std::uint64_t> group;
    bool in_turn = false;
    /// Gradient compression: what the pushes sent compressed have not carried yet, one float per
    /// element of the slice (kernels/cpu/compression.hpp); empty until the first such push.
    std::vector<float> residual;
  };

  /// The slice credit of the slices of one key on one server.
  struct slice_group {
    /// Credits taken by pushes not yet answered.
    std::uint32_t taken = 0;
    /// ps-keys whose waiting requests hold a push that needs a credit, in the order they asked;
    /// one whose push left or failed meanwhile is passed over.
    std::deque<std::uint64_t> turn;
    /// advance_turn is running (it may be reached again from inside itself).
    bool advancing = false;
  };

  /// A server link as the worker sees it (server recovery).
  struct server_state {
    /// The link went down, or a membership table listed the server lost: requests wait.
    bool down = false;
    worker_clock::time_point down_since;
    /// A membership table listed it lost: the next one listing it alive names its new address.
    bool seen_lost = false;
    /// A helper is connecting to its new address.
    bool relinking = false;
    /// A server that joined the running job (elastic servers): the worker links to it for the
    /// first time, and its requests wait until then.
    bool joining = false;
    /// A membership table listed it left (it handed its key ranges over): its link's end is no
    /// loss, and calls for every server pass it by.
    bool left = false;
    /// The send queue: the requests that may go next, by send_order (the head of each ps-key
    /// with requests queued, and keyless requests).
    send_queue ready;
    std::uint64_t next_sequence = 0;
    std::uint64_t epoch = 0;
    /// Bytes of tensor with the current link (send_receipt), and which link that is.
    std::uint64_t with_link = 0;
    std::uint64_t link = 0;
    /// Bytes of tensor queued while a call is being taken (gathering_), not pumped yet.
    std::size_t gathered = 0;
  };

  worker_clock::time_point now() const;
  bool recovery() const;
  std::string what_of(const part& p) const;
  std::shared_ptr<part> new_part(const std::shared_ptr<call_state>& call, kv_call kind,
                                 std::uint32_t server, std::string name);
  void add_key(const std::shared_ptr<call_state>& call, const kv_operation& op, kv_key_work& work);
  /// add_key for a row_sparse key.
  void add_rows(const std::shared_ptr<call_state>& call, const kv_operation& op, kv_key_work& work);
  bool has_credit(const ps_key_state& ps, const part& p) const;
  bool needs_slice_credit(const part& p) const;
  bool wants_slice_credit(const ps_key_state& ps) const;
  bool slice_credit_free(const part& p) const;
  void settle_turn(std::uint64_t ps_key, ps_key_state& ps);
  void advance_turn(std::uint64_t group);
  void give_back_slice_credit(part& p);
  void submit(const std::shared_ptr<part>& p);
  void release_waiting(std::uint64_t ps_key, ps_key_state& ps);
  void send_keyed(const std::shared_ptr<part>& p, ps_key_state& ps);
  /// (Re)starts the reassembly of `p`'s reply into p.out_bytes, taking packed chunks when its
  /// reply may be packed (reply_compression).
  void open_assembly(part& p);
  /// Push `p` compressed: its slice quantized with the ps-key's residual into p->packed.
  void pack(part& p, ps_key_state& ps);
  wire::tensor_chunk part_tensor(const part& p) const;
  void sent(std::uint64_t id, const std::shared_ptr<part>& p);
  void enqueue(const std::shared_ptr<part>& p, wire::message request, ps_key_state* ps);
  void pump(std::uint32_t server);
  bool fusable(const outgoing& o) const;
  bool fuses_with_next(const server_state& state, send_queue::iterator head) const;
  static std::size_t tensor_bytes(const outgoing& o);
  void took_frame(server_state& state, send_queue::iterator head);
  void drop_send_queue(std::uint32_t server);
  void note_answered(const part& p);
  void log_summary() const;
  void learn_round(std::uint64_t ps_key, std::uint64_t completed, bool dropped,
                   std::uint64_t durable);
  void forget_failed_push(const part& p);
  static std::pair<chunk_copy, std::string> copy_chunk(part& p, const wire::pull_reply& value);
  void on_value(std::uint64_t id, const std::shared_ptr<part>& p, envelope& reply);
  void on_chunk_copied(std::uint64_t id, const std::shared_ptr<part>& p, chunk_copy how,
                       const std::string& problem);
  void finish(std::uint64_t id, const std::shared_ptr<part>& p, status outcome);
  void hold_server(std::uint32_t server, const std::string& why);
  std::pair<std::size_t, std::size_t> resend(std::uint32_t server);
  /// Elastic servers: the key ranges `table` gives to other servers than before move there with
  /// their ps-keys (see "Key ranges that move").
  void follow_key_ranges(const wire::membership& table);
  /// Elastic servers: marks the servers `table` lists left (passed by from then on), and links to
  /// those it lists for the first time (they joined the running job; their requests wait until
  /// the link is there).
  void follow_servers(const wire::membership& table);
  /// Sends `ps_key`'s kept pushes and its requests no reply has reached (taken out of parts_) to
  /// server `to`, in round order, ahead of those still waiting; returns how many went again.
  std::size_t move_ps_key(std::uint64_t ps_key, ps_key_state& ps, std::uint32_t to);
  /// What resend and move_ps_key share: `sent` (the ps-key's requests under way with their ids,
  /// out of parts_) and its kept pushes go to the front of its waiting requests, for `server`;
  /// returns how many kept pushes and how many other requests.
  std::pair<std::size_t, std::size_t>
  requeue(std::uint64_t ps_key, ps_key_state& ps,
          std::vector<std::pair<std::uint64_t, std::shared_ptr<part>>> sent, std::uint32_t server);
  /// Copies of pushes are kept until their round is durable: server recovery or elastic servers.
  bool keeps_pushes() const;
  void fail_waiting(std::uint64_t ps_key, const error& why);
  void maybe_finalized();
  void remember(std::uint64_t id, const std::shared_ptr<part>& p);
  void forget(std::uint64_t id);
  void recycle(std::shared_ptr<part> p);
  void make_ready(server_state& state, outgoing o);

  worker_core_options options_;
  output& out_;
  std::vector<std::string> names_;
  std::vector<server_state> servers_;
  using part_map = std::unordered_map<std::uint64_t, std::shared_ptr<part>>;
  part_map parts_;
  std::unordered_map<std::uint64_t, ps_key_state> keys_;
  /// Slice credit, by group (part::group).
  std::unordered_map<std::uint64_t, slice_group> slice_groups_;
  /// resend() is putting a restarted server's requests in order again: no turn advances.
  bool turns_held_ = false;
  /// Calls are being taken (begin_gathering, a call of several keys): requests gather in the send
  /// queues (fusion); the depth of the nesting.
  std::uint32_t gathering_ = 0;
  std::uint64_t next_request_id_ = 1;
  std::uint64_t dropped_pushes_ = 0;
  /// For the summary: per server, and the answer times per kind of request.
  struct server_traffic {
    std::uint64_t requests = 0;
    std::uint64_t bytes_pushed = 0;
    std::uint64_t bytes_pulled = 0;
  };
  std::vector<server_traffic> traffic_;
  std::array<latency_histogram, 3> answer_times_;
  std::optional<error> failure_;
  std::optional<completion<result<std::uint64_t>>> finalizing_;
  worker_clock::time_point finalize_deadline_;
  /// What answered requests leave behind, kept for the next ones (at most max_spares of each):
  /// a call of 10,000 small keys allocated a part, a pull target, a node of parts_ and one of a
  /// send queue per key, and freeing them cost the worker's thread as much as the copies did
  /// (docs/data-path.md, "Per-key work").
  static constexpr std::size_t max_spares = std::size_t{1} << 16;
  std::vector<std::shared_ptr<call_state>> spare_calls_;
  std::vector<std::shared_ptr<part>> spare_parts_;
  std::vector<std::shared_ptr<pull_target>> spare_targets_;
  std::vector<part_map::node_type> spare_part_nodes_;
  std::vector<send_queue::node_type> spare_queue_nodes_;
  /// What a spare call's completion is set to, so that it keeps no caller's alive (a fresh
  /// completion would allocate).
  completion<status> idle_completion_;
};

} // namespace troupe

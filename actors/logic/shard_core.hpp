#pragma once
// The logic of a server shard: holds the values and optimizer state of the ps-keys routed to it
// and answers init, push, pull, pushpull, set_optimizer, sync_settings and checkpoint commands
// (MXNet's KVStoreDistServer, src/kvstore/kvstore_dist_server.h, one per key range instead of one
// per process).
//
// How pushes are applied is the job's sync policy, which worker rank 0 sends before any init
// (sync_settings; the older sync_mode / async_mode commands set the mode with the defaults).
// Settings that differ from the current ones are refused once the shard holds a key, whose
// rounds are built for the policy it was initialised under.
//  - dist_sync: a key's rounds are a sync_round (actors/logic/sync_round.hpp, the rules in full): a
//    round closes as soon as `quorum` workers (default all N) have pushed every byte of it, and
//    the optimizer runs once on the sum of exactly those pushes, or, with no optimizer, the sum
//    replaces the value. MXNet scales nothing on the server; with rescale_quorum and a quorum
//    K < N the sum is multiplied by N / K first (for integer dtypes the factor is converted to
//    the dtype). Pushes for a round that closed without them are acknowledged with
//    ack.dropped and not applied (quorum < N; with quorum N a push from the past is a
//    stale_round error). Pushes up to max_rounds_ahead rounds early wait, copied out of their
//    frames; later ones are refused. A pull for round t is answered once t rounds are complete.
//  - dist_async: each worker's push is applied as soon as all of its bytes have arrived
//    (actors/logic/async_pushes.hpp); a pull is answered at once with the current value, or, with
//    max_staleness = s >= 0 (stale synchronous parallel), once every live worker has pushed the
//    key at least t - s times, which is checked after each applied push and each membership
//    change. s = 0 orders pushes and pulls as dist_sync does. Each worker numbers its pushes of
//    a key; a push numbered below the worker's next is refused as a replay, or, marked resent
//    after this server restarted from a checkpoint that holds it, acknowledged and not applied.
// Acks of pushes carry the key's completed rounds (dist_sync) or applied pushes (dist_async):
// the worker's credit for max_rounds_ahead. Pull replies carry the same count as their round.
// Both carry what the last checkpoint on disk holds of the key for the receiving worker
// (key_entry::durable_for), so that the worker drops the copies it keeps for a recovery.
// A pushpull is a push whose pull half waits like a pull for round (push round + 1); when the
// push came too late for its round, the pull half is answered at once with the current value
// (its round, past push round + 1, tells the worker that the push was dropped).
//
// Waiting pulls are bounded and expire: a worker may have at most max_rounds_ahead + 1 pulls of
// a key waiting when it sends another (a pushpull is checked at its first chunk, so pushpulls
// already under way may add theirs); each expires with its request (timeout_ms, or
// shard_options::pull_timeout when 0) and is then dropped without a reply, when the actor's
// periodic sweep finds it.
//
// Memory per key is bounded whatever the workers send: the value, a merge buffer, a staging
// buffer per worker and at most max_rounds_ahead deferred pushes per worker (dist_sync), or a
// staging buffer per worker (dist_async); init may declare at most max_value_bytes, and the
// declared bytes of all of a server's keys share its key budget (max_store_bytes).
//
// Memory follows bytes while an init is under way: a value of 64 KiB or more that does not arrive
// whole in its first chunk is received into fresh mapped memory whose pages the system commits
// only as chunks are copied in (its chunks come in order, like a push's), so a short frame that
// declares 4 GiB costs about its own bytes (a smaller value takes its declared size at once). The
// value is readable (pulls, pushes, checkpoints) only once every byte has arrived. An init under
// way belongs to the connection that began it: a chunk from another connection is refused, and the
// init is dropped as if never begun (memory freed, key budget returned, a later init of the key
// accepted) when that connection closes (on_connection_closed) or no chunk of it came for
// stalled_init (drop_stalled_inits). A closed connection also takes with it what its workers'
// unfinished pushes hold (see on_connection_closed).
//
// Values are read by pull replies on other threads (the broker writes them to the socket) while
// the shard goes on, so a buffer that a reply still holds is never overwritten: the shard takes a
// fresh one from the pool instead (copy-on-write).
//
// Every request is checked before it touches state: an unknown key, a tensor whose dtype, shape
// or size differs from init, a sender rank out of range, a chunk out of order, a round from the
// past or too far ahead: the sender gets an error_reply naming the key and the values, and the
// stored value is unchanged. An exception while handling a request (an allocation, the
// optimizer) becomes an error_reply naming the request; none leaves the shard. If the optimizer
// fails on a round's sum, that round still closes (so that no worker waits forever) with the
// value as the optimizer left it, and the push that completed the round gets the error instead
// of its ack (in dist_async: the push whose update failed, which is not counted).
//
// shard_core is the logic, callable without CAF; the server shard actor
// (actors/server_shard.hpp) wraps it.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "actors/logic/async_pushes.hpp"
#include "actors/logic/envelope.hpp"
#include "actors/logic/pending_pulls.hpp"
#include "actors/logic/shard_checkpoint.hpp"
#include "actors/logic/shard_stats.hpp"
#include "actors/logic/sparse_round.hpp"
#include "actors/logic/sync_round.hpp"
#include "engine/log.hpp"
#include "engine/ndarray.hpp"
#include "engine/optimizer.hpp"
#include "schema/chunking.hpp"

namespace troupe {

/// dist_sync or dist_async: the wire's enumeration, under the name the engine side uses.
using consistency = wire::consistency_mode;

/// Makes the optimizer that set_optimizer names (optimizer::create unless a test says otherwise).
using optimizer_factory =
    std::function<result<std::unique_ptr<optimizer>>(std::string_view, const optimizer_params&)>;

struct shard_options {
  std::uint32_t shard_index = 0;
  /// The job's first workers (ranks 0..num_workers-1), members from its start.
  std::uint32_t num_workers = 1;
  /// Ranks below this may join the running job (job.max_workers): a rank of at least
  /// num_workers is a member once a membership table lists it (see on_membership). 0: num_workers.
  std::uint32_t max_workers = 0;
  /// Where the shard sits in the job, which decides its ps-keys; written into its files and
  /// checked when they are loaded.
  std::uint32_t num_servers = 1;
  std::uint32_t server_rank = 0;
  std::uint32_t shards_per_server = 1;
  /// The key ranges keys are placed over (job.max_servers); 0: num_servers.
  std::uint32_t num_ranges = 0;
  /// Where the shard's files go and when it writes checkpoints.
  checkpoint_schedule checkpoint;
  /// Until worker rank 0 sends sync_settings (or a sync_mode / async_mode command).
  sync_policy policy;
  /// Largest tensor payload per reply frame.
  std::size_t chunk_bytes = wire::default_chunk_bytes;
  /// How long a pull waits at most when its request names no timeout (timeout_ms = 0).
  std::chrono::milliseconds pull_timeout{30'000};
  /// The actor's sweep for expired pulls runs this often.
  std::chrono::milliseconds sweep_interval{1'000};
  /// Largest value a key may have (init), so that no peer makes the shard allocate more
  /// (data.max_value_bytes).
  std::uint64_t max_value_bytes = std::uint64_t{1} << 32;
  /// The key budget: the declared bytes of every key of the server (all its shards share the
  /// count), inits under way included, may not exceed max_store_bytes (data.max_store_bytes); an
  /// init beyond it is refused, naming the key. A key's footprint is a small multiple of its
  /// declared size (the round's sum, the optimizer's state, per-worker staging in dist_async).
  /// Null: no budget.
  std::shared_ptr<std::atomic<std::uint64_t>> store_bytes;
  std::uint64_t max_store_bytes = 0;
  /// An init whose value still misses bytes and has had no chunk for this long is dropped by
  /// drop_stalled_inits (timeouts.stalled_frame). Zero: only its connection's close drops it.
  std::chrono::milliseconds stalled_init{30'000};
  logger log;
  /// The time pulls wait against; null: shard_clock::now.
  std::function<shard_clock::time_point()> clock;
  /// Null: optimizer::create.
  optimizer_factory make_optimizer;
  /// Where a key's value is kept and updated when the optimizer runs here: on a gpu, each key
  /// has a device copy that the updater (and its state) works on, and `stored` on the host is
  /// refreshed from it after every update to answer pulls from. Without an optimizer a push
  /// only replaces the value, which stays on the host.
  context update_device = context::cpu();
  /// troupe-node --recover: the checkpoint the shard actor restores (shard_core::restore) before
  /// it takes any request, then drops; a refusal ends the actor with the reason. Null: none.
  std::shared_ptr<const shard_snapshot> restore_from;
};

class shard_core {
public:
  using reply_function = troupe::reply_function;

  explicit shard_core(shard_options options);
  /// Waits for a checkpoint being written and, when the shard checkpoints periodically and a key
  /// changed since, writes a last one.
  ~shard_core();
  shard_core(const shard_core&) = delete;
  shard_core& operator=(const shard_core&) = delete;

  /// Handles one request; replies (now or when a round completes) go through `reply`, each with
  /// the request's connection id. Never throws.
  void handle(envelope request, reply_function reply) noexcept;
  /// Takes a new membership table: a worker listed with role worker and alive == false (lost)
  /// or left == true is no longer live, so bounded staleness stops waiting for it; before any
  /// table every one of the job's first workers is live. A worker listed for the first time (it
  /// joined the running job, below max_workers) becomes a member: every dist_sync key counts it
  /// from the first round no push has reached yet (sync_round::admit), and bounded staleness from
  /// the slowest worker's pushes; its pulls of a key wait for the rounds before its first. A worker
  /// that left is retired from every dist_sync key's rounds (sync_round::retire: from the round
  /// after its last push on, they close without it), and so are the keys initialised later;
  /// rounds that waited only for it close. Answers the pulls that no longer wait.
  void on_membership(const wire::membership& table) noexcept;
  /// Drops the waiting pulls whose request has expired by now (options.clock), without a reply;
  /// returns how many.
  std::size_t expire_pulls() noexcept;
  /// Drops the inits under way that have had no chunk for options.stalled_init by now, as if
  /// never begun; returns how many. The actor's sweep calls it.
  std::size_t drop_stalled_inits() noexcept;
  /// Connection `connection` (envelope::connection, never 0) closed: the inits it began that
  /// still miss bytes are dropped as if never begun, and for every worker whose last push chunk
  /// came by it, what its unfinished pushes hold: its push under way (dist_async, and dist_sync
  /// with a quorum below N, where it is staged apart from the sum), its pushes for later rounds
  /// that miss bytes, and its idle staging buffers. Whole pushes waiting for their round stay;
  /// with a quorum of N a push under way is already in the round's sum, and the round waits for
  /// its worker as it would anyway. Returns how many inits were dropped.
  std::size_t on_connection_closed(std::uint64_t connection) noexcept;
  /// Writes a checkpoint when options.checkpoint.every has passed since the last one and a key
  /// has changed since; a failure is logged, and tried again at the next call. The actor's sweep
  /// calls it.
  void checkpoint_if_due() noexcept;

  /// This shard's place in the job.
  shard_layout layout() const noexcept;
  /// The server's rank, once the scheduler has given it (options.server_rank until then).
  void set_server_rank(std::uint32_t rank) noexcept { options_.server_rank = rank; }
  /// The shard as a file holds it (actors/logic/shard_checkpoint.hpp): every initialised key's
  /// dtype, shape and counts, its value in a checkpoint, and the optimizer's state (with the
  /// optimizer itself when dump_optimizer).
  shard_snapshot snapshot(snapshot_kind kind, bool dump_optimizer) const;
  /// Writes snapshot(checkpoint) to checkpoint_file(options.checkpoint.dir, layout()) now, and
  /// waits until it is on disk. (Periodic checkpoints are written on a thread of their own, one at
  /// a time, while the shard goes on.)
  status write_checkpoint();
  /// Waits for the periodic checkpoint being written, if any; its outcome (counted in stats()).
  status finish_checkpoint();
  /// Takes the state of a checkpoint of the same layout into a shard that holds no key yet: the
  /// policy, every key with its value and counts (pushes go on from the round after the saved
  /// ones), and the optimizer with its state. Refuses, changing nothing, a snapshot of another
  /// kind or layout (naming what differs), keys beyond the key budget, or states of another shape.
  status restore(const shard_snapshot& saved);

  /// Elastic servers (job.max_servers): the keys of key ranges `ranges` (of options.num_ranges)
  /// leave this shard now, for another server: each with its value and the rounds completed (or
  /// pushes applied), the workers that joined or left with their rounds, per-worker sequence
  /// numbers, and the optimizer's states for them with the optimizer. What the shard holds of a
  /// round not completed (pushes of the round being collected, deferred pushes, a push under way)
  /// and its waiting pulls go unapplied and unanswered: the workers keep a copy of every push
  /// until its round is complete (Ack.durable, PullReply.durable: the rounds completed, when the
  /// shard writes no checkpoints) and send them again, with their pulls, to the range's new
  /// server. From then on a request for a key of the ranges is refused with error moved, until a
  /// take_over brings the range back. Refused, changing nothing, for no range or a range that is
  /// not one of the job's.
  result<shard_snapshot> hand_over(std::vector<std::uint32_t> ranges);
  /// Takes the keys of another server's hand_over (the shard of the same index) into this live
  /// shard: values, rounds (pushes go on from the round after those completed there), the
  /// workers that joined or left with their rounds, per-worker sequence numbers, and the
  /// optimizer's states (its optimizer too when this shard has none yet); a shard that holds no
  /// key takes the hand-over's sync policy. Refuses, changing nothing, a hand-over of another
  /// placement, a key it holds or of another range, another policy or optimizer, or keys beyond
  /// the key budget.
  status take_over(const shard_snapshot& moved);

  /// The shard's counters, with every initialised key's traffic.
  shard_stats stats() const;
  const sync_policy& policy() const noexcept { return policy_; }
  /// Rounds completed (dist_sync) or pushes applied (dist_async) for `ps_key`; 0 for an unknown
  /// key.
  std::uint64_t completed_rounds(std::uint64_t ps_key) const;
  /// Late pushes dropped for `ps_key`.
  std::uint64_t dropped_pushes(std::uint64_t ps_key) const;
  /// Pulls of `ps_key` waiting.
  std::size_t waiting_pulls(std::uint64_t ps_key) const;
  /// The stored value of `ps_key` (while its init is under way: the buffer it is received into,
  /// bytes missing), or the none handle.
  ndarray value(std::uint64_t ps_key) const;
  /// The bytes of value(ps_key); 0 for an unknown key.
  std::uint64_t value_bytes(std::uint64_t ps_key) const noexcept;

private:
  /// What a push chunk's request needs to be answered.
  struct push_request {
    std::uint64_t request_id = 0;
    std::uint64_t key = 0;
    std::uint32_t sender = 0;
    std::uint64_t round = 0;
    bool then_pull = false;
    std::uint32_t timeout_ms = 0;
    shard_clock::time_point arrival;
    /// Push.resent: sent again after the server restarted from a checkpoint.
    bool resent = false;
    /// PushPull.replyCompression: the rule the pull half's reply may be packed by, or none.
    gradient_compression reply_packing = {compression_type::none};
  };
  struct key_entry {
    ndarray stored;
    /// The value on options_.update_device when that is a gpu and an update has run; none before.
    ndarray on_device;
    /// Receives init's chunks until the value is whole; empty afterwards.
    std::optional<wire::reassembler> init_assembly;
    /// While init_assembly is set: the connection that began the init, and when its last chunk
    /// came.
    std::uint64_t init_connection = 0;
    shard_clock::time_point init_progress;
    /// Exactly one of the three once initialised: by the policy's mode, and for a row_sparse
    /// key (Init.rowSparse) in dist_sync its sparse_round.
    std::optional<sync_round> sync;
    std::optional<async_pushes> async;
    std::optional<sparse_round> sparse;
    /// Declared row_sparse: it takes row-sparse pushes and pulls only.
    bool row_sparse = false;
    pending_pulls pulls;
    /// completed() in the last checkpoint written to disk, and in the one being written.
    std::uint64_t durable = 0;
    std::uint64_t writing = 0;
    /// dist_async: each worker's next sequence number in the last checkpoint written to disk,
    /// and in the one being written.
    std::vector<std::uint64_t> durable_pushes;
    std::vector<std::uint64_t> writing_pushes;
    /// Counted for stats() (its key field unused here).
    key_traffic traffic;
    /// The job trace (job_trace.hpp): when each worker's push under way began, for its merge
    /// span; empty while tracing is off.
    std::vector<std::int64_t> merge_started_us;
    /// Compressed pulls, per worker: what the packed replies have not carried yet (one float per
    /// element, taken from the key budget at its first packed reply), and the round last sent.
    struct pull_residual_state {
      std::vector<float> values;
      std::uint64_t round = 0;
    };
    std::vector<pull_residual_state> pull_residuals;

    bool initialized() const noexcept { return !init_assembly.has_value(); }
    /// dist_sync: `use` applied to the key's rounds, its sparse_round or its sync_round (they
    /// answer the same calls).
    template <class Use>
    decltype(auto) with_rounds(Use&& use) {
      return sparse ? use(*sparse) : use(*sync);
    }
    template <class Use>
    decltype(auto) with_rounds(Use&& use) const {
      return sparse ? use(*sparse) : use(*sync);
    }
    /// dist_sync: pushes of the round being collected have arrived (a save waits for it).
    bool collecting() const noexcept {
      return (sync && sync->collecting()) || (sparse && sparse->collecting());
    }
    /// Rounds completed (sync) or pushes applied (async).
    std::uint64_t completed() const noexcept;
    /// What `worker` may forget of its pushes of the key (Ack.durable, PullReply.durable): the
    /// rounds completed in the last checkpoint on disk (sync), or the sequence number of its
    /// next push there (async).
    std::uint64_t durable_for(std::uint32_t worker) const noexcept;
  };

  void dispatch(envelope& request, const reply_route& reply);
  /// The key's range has left this shard: why (error moved), else nothing.
  std::optional<std::string> moved_away(std::uint64_t key) const;
  /// What `worker` may forget of its pushes of the key (Ack.durable, PullReply.durable): with a
  /// checkpoint directory what the last checkpoint on disk holds (key_entry::durable_for), else
  /// what the shard has applied, which a hand-over of the key carries (elastic servers).
  std::uint64_t durable_for(const key_entry& entry, std::uint32_t worker) const;
  /// The key at `entry` leaves the shard: what a hand-over carries of it.
  key_snapshot take_out(std::map<std::uint64_t, key_entry>::iterator entry);
  std::uint32_t num_ranges() const noexcept {
    return options_.num_ranges == 0 ? options_.num_servers : options_.num_ranges;
  }
  void refuse(const reply_route& reply, std::uint64_t request_id, std::optional<std::uint64_t> key,
              wire::error_code code, std::string message);
  void on_init(const wire::init& msg, const reply_route& reply);
  /// The key's rounds by the policy (sync_round, sparse_round or async_pushes), `completed`
  /// rounds done, with the joins and leaves `known` (a key taken over: those fixed on its old
  /// server) and those this shard has heard of.
  void open_rounds(key_entry& entry, std::uint64_t key, std::uint64_t completed,
                   const round_membership* known = nullptr);
  /// `worker` left the job: retired from every key's rounds, closing those it held up.
  void retire_worker(std::uint32_t worker);
  /// `worker` joined the running job: a member of every key's rounds from now on.
  void admit_worker(std::uint32_t worker);
  /// Ranks that may be members: max_workers, at least num_workers.
  std::uint32_t capacity() const noexcept {
    return std::max(options_.num_workers, options_.max_workers);
  }
  /// Why `sender` may not push or pull `what`, when it is no member of the job.
  std::optional<std::string> not_a_member(std::uint32_t sender) const;
  /// The entry of a new key for init's first chunk, its value allocated for the declared tensor
  /// (reserved in the key budget by the caller).
  key_entry begin_init(const wire::tensor_chunk& first, std::uint64_t connection);
  /// Forgets an init under way: its memory and its part of the key budget go back.
  void forget_init(std::map<std::uint64_t, key_entry>::iterator entry) noexcept;
  /// forget_init, logged with `why` and counted in stats().inits_dropped.
  void drop_init(std::map<std::uint64_t, key_entry>::iterator entry, const char* why) noexcept;
  void on_push(const push_request& push, const wire::tensor_chunk& tensor,
               const reply_route& reply);
  /// A row-sparse push (checked against the key by on_push), whole.
  void on_sparse_push(key_entry& entry, const push_request& push, const wire::tensor_chunk& tensor,
                      const reply_route& reply);
  /// dist_sync: answers a push (chunk) by what its round made of it (`last_chunk`: the push has
  /// every byte now), closing the round when it reached its quorum.
  void on_round_outcome(key_entry& entry, const push_request& push, chunk_outcome outcome,
                        bool last_chunk, const reply_route& reply);
  /// dist_async: a push with every byte in is applied by `update` (which returns the failure's
  /// text, if any), counted and answered.
  template <class Update>
  void apply_async_push(key_entry& entry, const push_request& push, const reply_route& reply,
                        Update&& update);
  /// Applies a row_sparse gradient: the optimizer's update of its rows (update_rows), or, with
  /// none, the key becomes it (zero where it holds no row). The failure's text, if any.
  std::optional<std::string> apply_rows(std::uint64_t key, key_entry& entry,
                                        const row_sparse_array& grad);
  /// The entry a push or pull may use, or nullptr after refusing the request.
  /// Takes `bytes` of the server's key budget; why not, when it would go over.
  std::optional<std::string> reserve_store(std::uint64_t bytes);
  void release_store(std::uint64_t bytes) noexcept;
  key_entry* find_key(std::uint64_t key) const noexcept;
  /// The optimizer keeps float32 master copies of float16 values (optimizer::multi_precision).
  bool multi_precision() const noexcept;
  void sum_in_optimizer_precision() noexcept;
  key_entry* usable_key(std::uint64_t key, std::uint64_t request_id, const char* what,
                        const reply_route& reply);
  void on_sync_push(key_entry& entry, const push_request& push, const push_chunk& chunk,
                    const reply_route& reply);
  void on_async_push(key_entry& entry, const push_request& push, const push_chunk& chunk,
                     const reply_route& reply);
  /// Applies the sum of the round that has its quorum, closes it and answers the pulls it
  /// releases; returns why the update failed, if it did (the round is closed all the same).
  std::optional<std::string> close_round(key_entry& entry, std::uint64_t key);
  /// Lets the deferred pushes of the rounds that open in, closing each round they complete.
  void admit_deferred(key_entry& entry, std::uint64_t key);
  /// Answers a push that has all its bytes in its round or was applied (ack, or the pull half of
  /// a pushpull), one that was dropped as late, or one whose round's update failed.
  void answer_push(key_entry& entry, const push_request& push, const push_outcome& how,
                   const reply_route& reply);
  /// Multiplies `received` by `scale` (unless 1) and runs the update with it, or swaps it into
  /// the value when there is no optimizer; an exception is caught and returned as its text.
  std::optional<std::string> apply(std::uint64_t key, key_entry& entry, ndarray& received,
                                   double scale);
  void on_pull(const wire::pull_request& msg, const reply_route& reply);
  bool pull_ready(const key_entry& entry, std::uint64_t round) const noexcept;
  /// Bounded staleness: a pull for `round` may have the value once the slowest live worker has
  /// pushed round - max_staleness.
  bool within_staleness(std::uint64_t round, std::uint64_t slowest) const noexcept;
  void answer_pulls(std::uint64_t key, key_entry& entry);
  /// A pull reply to worker `sender`.
  /// `traced_since_us`: when the pull arrived, for its span in the job trace (0: not traced).
  /// `rows`: a row-sparse pull's rows (null: the whole value).
  void send_value(std::uint64_t key, key_entry& entry, std::uint64_t request_id,
                  std::uint32_t sender, const reply_route& reply, std::uint64_t round,
                  std::int64_t traced_since_us, const std::vector<std::int64_t>* rows = nullptr,
                  const gradient_compression& packing = {compression_type::none});
  /// Compressed pulls: `sender`'s residual of the key, when a reply packed by `packing` means
  /// something (a dist_sync round's sum that no optimizer updates, float32 or float16, a round
  /// not yet sent packed to this sender) and the key budget has room for it; else null (the
  /// reply goes dense).
  std::vector<float>* pull_residual(key_entry& entry, std::uint32_t sender,
                                    const gradient_compression& packing);
  /// The job trace: a push's first chunk is in (offset 0), or its last one merged.
  void trace_push_begins(key_entry& entry, std::uint32_t sender);
  void trace_push_merged(key_entry& entry, const push_request& push);
  /// The waiting pulls one worker may have on one key when it sends another.
  std::size_t pull_limit() const noexcept { return policy_.max_rounds_ahead + std::size_t{1}; }
  shard_clock::time_point now() const {
    return options_.clock ? options_.clock() : shard_clock::now();
  }
  shard_clock::time_point expiry(shard_clock::time_point arrival, std::uint32_t timeout_ms) const;
  void on_set_optimizer(const wire::set_optimizer& msg, const reply_route& reply);
  void on_sync_settings(const wire::sync_settings& msg, const reply_route& reply);
  void on_set_gradient_compression(const wire::set_gradient_compression& msg,
                                   const reply_route& reply);
  void set_policy(const sync_policy& wanted, std::uint64_t request_id, const reply_route& reply);
  void on_command(const wire::command& msg, const reply_route& reply);
  /// A chunk of another server's hand-over (troupe.capnp RangeData): gathered per connection,
  /// then decoded and taken over (take_over), and acked; a chunk out of order, too large a
  /// hand-over or one take_over refuses gets an error naming why, and nothing changes.
  void on_range_data(const wire::range_data& msg, const reply_route& reply);
  /// save_optimizer_states / load_optimizer_states on this shard's file.
  void on_states_command(const wire::command& msg, const reply_route& reply);
  /// After a round closed or a push was applied: a checkpoint when every key has come another
  /// checkpoint.every_rounds further, and the saves that waited for the open rounds.
  void after_update();
  /// The fewest rounds completed (or pushes applied) over the initialised keys.
  std::uint64_t slowest_key() const noexcept;
  bool any_round_collecting() const noexcept;
  /// Takes a checkpoint's copy now and writes it on another thread; false (nothing taken) while
  /// the previous one is still being written.
  bool start_checkpoint();
  /// A checkpoint when every key has come checkpoint.every_rounds further since the last.
  void checkpoint_by_rounds();

  shard_options options_;
  sync_policy policy_;
  std::map<std::uint64_t, key_entry> keys_;
  /// keys_ by hash, for the lookups of every request: with 10,000 keys, the map's walk down
  /// was a tenth of a small push's time (docs/data-path.md, "Per-key work"). keys_ keeps the
  /// order that checkpoints and statistics list keys in.
  std::unordered_map<std::uint64_t, key_entry*> index_;
  /// The key found last: a request's key is looked up to route it (value_bytes), then to handle
  /// it. Null when none (an erased key clears it).
  mutable key_entry* last_found_ = nullptr;
  mutable std::uint64_t last_found_key_ = 0;
  std::unique_ptr<updater> updater_;
  /// The dense values of the compressed push chunk being taken (a push's data is read only while
  /// it is taken), grown to the largest chunk and kept.
  std::vector<std::byte> unpacked_;
  /// live_[w]: worker w counts for bounded staleness.
  std::vector<bool> live_;
  /// member_[w]: worker w is in the job (one of its first workers, or joined since).
  std::vector<bool> member_;
  /// left_[w]: worker w left the job (the membership table said so).
  std::vector<bool> left_;
  /// sender_connection_[w]: the connection worker w's last push chunk came by (0: in-process).
  std::vector<std::uint64_t> sender_connection_;
  /// The keys whose init is under way.
  std::set<std::uint64_t> unfinished_inits_;
  shard_stats stats_;
  /// slowest_key() when the last periodic checkpoint was written.
  std::uint64_t checkpointed_progress_ = 0;
  shard_clock::time_point last_checkpoint_;
  /// A key changed since the last checkpoint.
  bool changed_since_checkpoint_ = false;
  /// The periodic checkpoint being written, and what it holds for the log.
  std::future<status> checkpoint_in_flight_;
  std::string checkpoint_description_;
  shard_clock::time_point checkpoint_started_;
  /// save_optimizer_states commands waiting for the rounds being collected to close (dist_sync),
  /// so that a save right after a push holds that push's round. At most max_waiting_saves.
  struct waiting_save {
    wire::command msg;
    reply_route reply;
  };
  std::vector<waiting_save> waiting_saves_;
  static constexpr std::size_t max_waiting_saves = 16;
  /// Hand-overs arriving from other servers (on_range_data), one per connection.
  struct incoming_hand_over {
    std::uint64_t request_id = 0;
    std::uint64_t total = 0;
    std::vector<std::byte> bytes;
  };
  std::unordered_map<std::uint64_t, incoming_hand_over> incoming_;
  /// moved_ranges_[r]: key range r left this shard and has not come back.
  std::vector<bool> moved_ranges_;
  /// How many of moved_ranges_ are set: requests are checked against them only when some are.
  std::uint32_t ranges_away_ = 0;
  /// answer_pulls' list of the pulls it answers, kept for its capacity.
  std::vector<waiting_pull> ready_pulls_;
};

} // namespace troupe

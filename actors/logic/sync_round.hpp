#pragma once
// One key's dist_sync rounds on a server shard: which workers have contributed to the round being
// collected, the sum of their contributions, the pushes that came early for later rounds and the
// pushes that came too late for a round that closed without them. A plain object (no actors, no
// network) that a server shard drives (actors/logic/shard_core.hpp): the shard feeds it each push
// chunk, applies the update when the round reaches its quorum and answers the workers.
//
// Why an object inside the shard and not a barrier actor per key: a push chunk of dist_sync goes
// from the link straight to the shard that holds the key, and the round is summed there, so the
// data path has no extra actor hop per chunk (the 4 KiB push+pull round trip is dominated by hops,
// docs/data-path.md); the merge buffer stays next to the value it updates, with no message
// carrying tensors between two actors; and the round rules are tested here without an actor
// system. The job's barriers (start, KVStore::barrier(), end), which hold no tensor, are barrier
// actors of the scheduler.
//
// Rules, with N workers, quorum K (1 <= K <= N), max_rounds_ahead M and c rounds completed (the
// round being collected is round c):
//  - A chunk of round c joins the round (chunks of a push come in order,
//  actors/logic/push_chunk.hpp).
//  - The round closes as soon as K distinct workers have pushed every byte of it; the sum is
//    then exactly the sum of those K pushes.
//      K == N: chunks are summed into the merge buffer as they arrive (the first bytes to reach a
//      place are copied, later ones added: no zero-fill pass, no staging copy).
//      K <  N: a push whose one chunk is the whole tensor is summed at once; a push of several
//      chunks is staged per worker and summed when its last chunk arrives, so the bytes of a
//      worker that does not finish before the round closes never reach the sum.
//  - A chunk of a round in (c, c + M] is copied out of its frame into a pooled buffer at once
//    (frame buffers are released promptly: the links' receive credit depends on it), one buffer
//    per (worker, round); those pushes enter their round when it opens, in arrival order. A chunk
//    of a round beyond c + M is refused, naming the rounds.
//  - A chunk of a round below c: with K < N it is late, dropped unapplied and counted once its
//    push is whole (never applied to a later round); with K == N it cannot be honest and is
//    refused as stale_round.
//  - A worker that left the job (retire) counts up to its last push and not after
//    (round_membership): a later round closes with the workers still in, its quorum K less the
//    workers that left before it (at least 1); a chunk of the leaver for such a round is refused,
//    naming the leave.
//
// Memory per key, bounded by N and M whatever the workers send: the merge buffer (twice the key's
// size for a float16 key summed in float32, merge_in_float32), at most one staging buffer per
// worker (K < N) and at most M deferred buffers per worker, each the key's size; counters per
// worker.

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "actors/logic/push_chunk.hpp"
#include "engine/ndarray.hpp"
#include "schema/messages.hpp"

namespace troupe {

struct sync_round_options {
  /// The key, for the messages of refused chunks.
  std::uint64_t key = 0;
  /// The job's first workers (ranks 0..num_workers-1), members from round 0.
  std::uint32_t num_workers = 1;
  /// Workers whose whole push closes a round: 1..num_workers.
  std::uint32_t quorum = 1;
  /// Rounds beyond the one being collected whose pushes are kept (>= 1).
  std::uint32_t max_rounds_ahead = 2;
  /// Ranks below this may push once they joined (admit); 0: num_workers (no worker joins).
  std::uint32_t max_workers = 0;
};

/// Which workers a key's rounds wait for, round by round. The job's first workers (ranks below
/// num_workers) count from round 0; a worker that joins the running job (admit) counts from its
/// first round on; a worker that leaves (retire) no longer counts from its end round on. A round's
/// quorum is its members less the losses the job tolerates (num_workers - quorum, at least 1
/// whole push): a job that tolerated the loss of N - K workers still tolerates as many, and with
/// K == N every worker in the round must push (MXNet's closed form with the round's own N).
/// Memory: one entry per worker that joined and per worker that left.
class round_membership {
public:
  round_membership(std::uint32_t num_workers, std::uint32_t quorum)
      : num_workers_(num_workers), quorum_(quorum) {}

  /// `worker` joined the job: it counts from round `first` on. A worker that is a member already
  /// (one of the first num_workers, or admitted before) is left as it is.
  void admit(std::uint32_t worker, std::uint64_t first);
  /// The first round `worker` counts in: 0 for the job's first workers, its join round for a
  /// worker that joined, nothing for a worker that is not (yet) a member.
  std::optional<std::uint64_t> first_of(std::uint32_t worker) const noexcept;
  /// `worker` counts in the rounds before `end` only. A second call changes nothing.
  void retire(std::uint32_t worker, std::uint64_t end);
  /// The round from which `worker` no longer counts, once it left.
  std::optional<std::uint64_t> end_of(std::uint32_t worker) const noexcept;
  /// `worker` counts in `round`.
  bool counts(std::uint32_t worker, std::uint64_t round) const noexcept;
  /// Why `worker` does not count in `round` (precondition: !counts(worker, round)).
  std::string why_not(std::uint32_t worker, std::uint64_t round) const;
  /// The workers `round` waits for.
  std::uint32_t members(std::uint64_t round) const noexcept;
  /// Whole pushes that close `round`; 0 when no worker counts in it (it never closes).
  std::uint32_t quorum(std::uint64_t round) const noexcept;
  /// The job's quorum K and its first number of workers N.
  std::uint32_t job_quorum() const noexcept { return quorum_; }
  std::uint32_t job_workers() const noexcept { return num_workers_; }

  struct departure {
    std::uint32_t worker = 0;
    std::uint64_t end = 0;
  };
  struct arrival {
    std::uint32_t worker = 0;
    std::uint64_t first = 0;
  };
  /// The workers that joined and those that left, in the order they did (a key's hand-over to
  /// another server carries them).
  const std::vector<arrival>& arrivals() const noexcept { return joined_; }
  const std::vector<departure>& departures() const noexcept { return left_; }

private:
  std::uint32_t num_workers_;
  std::uint32_t quorum_;
  std::vector<arrival> joined_;
  std::vector<departure> left_;
};

/// The refusal of a chunk whose sender no longer counts in its round: it left the job.
std::string left_the_job(std::uint32_t worker, std::uint64_t end);

/// The first round after `sender`'s pushes: `current` (the round being collected, one more when
/// `sender` has pushed into it), or one past the latest of its `deferred` pushes.
template <class Deferred>
std::uint64_t after_last_push(std::uint64_t current, const Deferred& deferred,
                              std::uint32_t sender) {
  for (const auto& push : deferred)
    if (push.sender == sender && push.round + 1 > current)
      current = push.round + 1;
  return current;
}

/// How a push ended in its round.
struct push_outcome {
  /// Its round closed without it; it was not applied.
  bool dropped = false;
  /// It completed its round's quorum and the update with the round's sum failed: why.
  std::optional<std::string> failure;
};

/// How to answer a deferred push: called by the shard once the push's round has taken every byte
/// of it, or has closed without it.
using deferred_answer = std::function<void(const push_outcome&)>;

/// A deferred push that entered its round whole, or was dropped, and how to answer it.
struct admitted_push {
  deferred_answer answer;
  bool dropped = false;
};

class sync_round {
public:
  /// `like`: the key's value (its shape and dtype; the round allocates buffers like it).
  sync_round(const ndarray& like, sync_round_options options);

  /// Rounds closed so far; the round being collected is this one.
  std::uint64_t completed() const noexcept { return completed_; }
  /// Late pushes dropped so far.
  std::uint64_t dropped() const noexcept { return dropped_; }
  /// Deferred pushes waiting for their round.
  std::size_t deferred() const noexcept { return deferred_.size(); }
  /// Bytes of the round being collected have arrived from some worker.
  bool collecting() const noexcept;
  /// Continues a key restored from a checkpoint: `rounds` are complete, the next one opens.
  /// Only before any chunk was added.
  void resume_after(std::uint64_t rounds) noexcept {
    completed_ = rounds;
    round_quorum_ = membership_.quorum(completed_);
  }
  const sync_round_options& options() const noexcept { return options_; }

  /// Takes a chunk of the round being collected or of an earlier one (chunk.round <= completed();
  /// a later round goes to defer()).
  chunk_outcome add(const push_chunk& chunk);
  /// Keeps a chunk of a later round (chunk.round > completed()) until that round opens. `answer`
  /// is kept with the first chunk of the push and dropped for the others.
  chunk_outcome defer(const push_chunk& chunk, deferred_answer answer);

  /// The round's quorum of workers have pushed every byte: the shard must apply sum() and call
  /// close() before anything else.
  bool quorum_reached() const noexcept { return round_quorum_ > 0 && done_ >= round_quorum_; }
  /// The workers the round being collected waits for, and how many of them close it.
  std::uint32_t round_members() const noexcept { return membership_.members(completed_); }
  std::uint32_t round_quorum() const noexcept { return round_quorum_; }
  /// `sender` left the job after its last request was answered: the rounds after the last one it
  /// pushed (or has under way) close without it, from the round being collected on when it has
  /// not pushed that one. Returns that first round without it. The shard then checks
  /// quorum_reached(), as after a push.
  std::uint64_t retire(std::uint32_t sender);
  /// `sender` joined the job: it counts from the first round no push has reached yet (the round
  /// being collected when nothing of it has arrived, else the round after the latest pushed or
  /// deferred one), which this returns. A member already keeps its rounds. Precondition:
  /// sender < max_workers.
  std::uint64_t admit(std::uint32_t sender);
  const round_membership& membership() const noexcept { return membership_; }
  /// Takes the membership of the same key on the server it came from (a hand-over), before any
  /// chunk was added: its joins and leaves were fixed there.
  void take_membership(round_membership facts) noexcept {
    membership_ = std::move(facts);
    round_quorum_ = membership_.quorum(completed_);
  }
  /// float16 pushes are summed into a float32 buffer from the next round that opens (the servers'
  /// rule under multi_precision, as MXNet's server sums them: sum() is then float32); off, in the
  /// key's dtype. No effect on other dtypes.
  void merge_in_float32(bool on) noexcept { widen_ = on && wire_type_ == wire::dtype::float16; }
  /// The sum of the round's K pushes (precondition: quorum_reached()). The shard may scale it,
  /// update with it, or swap it into the key's value (the round then reuses the old value's
  /// buffer unless something still reads it).
  ndarray& sum() noexcept { return merge_; }
  /// Ends the round: one more completed, the next round opens empty. Pushes still missing bytes
  /// become late.
  void close();
  /// Lets the deferred pushes of the round now open enter it, in arrival order, until it reaches
  /// its quorum; deferred pushes of a round that has closed meanwhile are dropped. Returns, in
  /// order, how to answer those that entered whole or were dropped (a push that entered with
  /// bytes missing is answered by its last chunk, like any other).
  std::vector<admitted_push> admit_deferred();
  /// Drops what `sender`'s unfinished pushes hold (its connection closed): with a quorum below N
  /// its push under way, staged apart from the sum (the worker has then not pushed the round),
  /// and the late push it was draining; its pushes for later rounds that miss bytes; its idle
  /// staging buffer. With a quorum of N a push under way is in the sum already and stays, and
  /// whole pushes waiting for their round stay.
  void forget_unfinished(std::uint32_t sender) noexcept;

private:
  struct worker_state {
    /// Bytes of this round's push received (in the merge buffer when K == N, else in staging).
    std::uint64_t bytes = 0;
    bool done = false;
    /// K < N: the push being received, when it has several chunks.
    ndarray staging;
    /// A late push being received and dropped (K < N): its round and bytes so far.
    bool draining = false;
    std::uint64_t late_round = 0;
    std::uint64_t late_bytes = 0;
  };
  struct deferred_push {
    std::uint32_t sender = 0;
    std::uint64_t round = 0;
    std::uint64_t request_id = 0;
    ndarray buffer;
    std::uint64_t bytes = 0;
    deferred_answer answer;
  };

  bool streaming() const noexcept { return options_.quorum == options_.num_workers; }
  chunk_outcome refuse(wire::error_code code, const push_chunk& chunk,
                       const std::string& why) const {
    return refuse_chunk(options_.key, code, chunk, why);
  }
  chunk_outcome check(const push_chunk& chunk, std::uint64_t received) const {
    return check_order(options_.key, chunk, received, layout_.bytes);
  }
  chunk_outcome add_current(const push_chunk& chunk);
  chunk_outcome add_late(const push_chunk& chunk);
  /// K == N: sums bytes [offset, offset + data.size()) into the merge buffer.
  void stream(std::uint64_t offset, std::span<const std::byte> data);
  /// K < N: adds a whole push to the sum.
  void contribute(std::span<const std::byte> whole);
  /// K < N: adds worker's staged push to the sum.
  void contribute_staged(worker_state& worker);
  void finish_push(worker_state& worker);
  /// The buffer for writing the sum into, allocated (or reused) when the round's first bytes come.
  void open_merge();

  /// The merge of this round is float32 over float16 pushes.
  bool widened() const noexcept { return merge_open_ && merge_.dtype() != layout_.type; }
  /// Adds (or, `first`, copies) the float16 values of `data` into the float32 merge buffer from
  /// the element at byte `offset` of the pushed tensor.
  void widen_into(std::uint64_t offset, std::span<const std::byte> data, bool first);
  /// Copies (`first`) or adds the pushed bytes `data` at byte `offset` of the pushed tensor into
  /// the merge buffer, in its dtype.
  void merge_bytes(std::uint64_t offset, std::span<const std::byte> data, bool first);

  sync_round_options options_;
  round_membership membership_;
  /// membership_.quorum(completed_), kept for the check after every chunk.
  std::uint32_t round_quorum_;
  value_layout layout_;
  /// layout_ in float32: the merge buffer's when widen_.
  value_layout wide_layout_;
  wire::dtype wire_type_;
  bool widen_ = false;
  std::uint64_t completed_ = 0;
  std::uint64_t dropped_ = 0;
  ndarray merge_;
  /// K == N: bytes [0, merge_filled_) of merge_ hold a contribution (every worker's push is a
  /// prefix that grows in order, so what has been written is a prefix too).
  std::uint64_t merge_filled_ = 0;
  bool merge_open_ = false;
  /// Workers whose whole push is in the sum.
  std::uint32_t done_ = 0;
  std::vector<worker_state> workers_;
  /// In arrival order of their first chunk.
  std::deque<deferred_push> deferred_;
};

/// dst[i] += src[i] over `bytes` bytes of `type` (float16: each sum taken in float32 and rounded).
void accumulate(std::byte* dst, const std::byte* src, std::size_t bytes, wire::dtype type);
/// The `n` float16 values `src` widened into the float32 `dst`: copied (`first`) or added.
void accumulate_widened(float* dst, const std::byte* src, std::size_t n, bool first);

} // namespace troupe

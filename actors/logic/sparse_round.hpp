#pragma once
// One row_sparse key's dist_sync rounds on a server shard (the rows-only counterpart of
// sync_round, whose rules it keeps): a push carries some rows of the key and their ids
// (troupe.capnp Tensor.rowSparse), the round sums the rows its pushes hold, and the shard updates
// only those rows (updater::update_rows, MXNet's lazy_update) or, with no optimizer, makes the key
// that sum, every other row zero (MXNet's server copies the merged row_sparse array into the dense
// value).
//
// A row-sparse push always arrives whole in one frame (its sender never splits it), so there is
// no push under way to stage or forget. Rules, with N workers, quorum K, max_rounds_ahead M and
// c rounds completed:
//  - A push of round c joins the round; the round closes as soon as K distinct workers have
//    pushed. A worker's second push of a round is refused.
//  - A push of a round in (c, c + M] is copied out of its frame and enters its round when that
//    opens, in arrival order; beyond c + M it is refused.
//  - A push of a round below c: with K < N it is late, dropped and counted; with K == N it is
//    refused as stale_round.
//
// A round keeps the pushes it took, copied out of their frames (at most one a worker, each at
// most the key's rows and their ids), and sums them when it closes: a merge of their sorted rows,
// adding where they share a row in the order the pushes entered (float32 under merge_in_float32,
// as in sync_round). So the work and the memory of a round follow the rows pushed, not the size
// of the key; the buffers of a closed round serve the next ones. Besides those: at most M
// deferred pushes per worker.

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "actors/logic/push_chunk.hpp"
#include "actors/logic/sync_round.hpp"
#include "engine/ndarray.hpp"
#include "engine/row_sparse.hpp"

namespace troupe {

/// A whole row-sparse push as the shard hands it over.
struct sparse_push {
  std::uint64_t request_id = 0;
  /// < num_workers (the shard checks it before).
  std::uint32_t sender = 0;
  std::uint64_t round = 0;
  /// The rows' ids, int64 little-endian, strictly increasing and below the key's rows
  /// (check_row_ids passed).
  std::span<const std::byte> row_ids;
  /// Their values, row after row, in the key's dtype.
  std::span<const std::byte> values;
};

/// Why `row_ids` (int64 little-endian) are not strictly increasing ids below `rows`, naming the
/// first that is wrong; nothing when they are.
std::optional<std::string> check_row_ids(std::span<const std::byte> row_ids, std::int64_t rows);

/// Row `index` of `row_ids` (int64 little-endian).
std::int64_t row_id_at(std::span<const std::byte> row_ids, std::size_t index) noexcept;

class sparse_round {
public:
  /// `like`: the key's value (at least one axis).
  sparse_round(const ndarray& like, sync_round_options options);

  std::uint64_t completed() const noexcept { return completed_; }
  std::uint64_t dropped() const noexcept { return dropped_; }
  std::size_t deferred() const noexcept { return deferred_.size(); }
  /// A push of the round being collected has been summed.
  bool collecting() const noexcept { return done_ > 0; }
  void resume_after(std::uint64_t rounds) noexcept {
    completed_ = rounds;
    round_quorum_ = membership_.quorum(completed_);
  }
  const sync_round_options& options() const noexcept { return options_; }
  /// As sync_round::merge_in_float32.
  void merge_in_float32(bool on) noexcept;

  /// Takes a whole push: completed (summed into the round being collected), deferred (kept for
  /// its round, and answered through `answer` when it enters it or is dropped), dropped (late) or
  /// refused (nothing changed).
  chunk_outcome add(const sparse_push& push, deferred_answer answer);
  bool quorum_reached() const noexcept { return round_quorum_ > 0 && done_ >= round_quorum_; }
  /// As sync_round's.
  std::uint32_t round_members() const noexcept { return membership_.members(completed_); }
  std::uint32_t round_quorum() const noexcept { return round_quorum_; }
  std::uint64_t retire(std::uint32_t sender);
  /// `sender` joined the job: as sync_round::admit.
  std::uint64_t admit(std::uint32_t sender);
  const round_membership& membership() const noexcept { return membership_; }
  /// As sync_round::take_membership.
  void take_membership(round_membership facts) noexcept {
    membership_ = std::move(facts);
    round_quorum_ = membership_.quorum(completed_);
  }
  /// The round's sum (precondition: quorum_reached()), scaled by `scale`: the rows its pushes
  /// held, in the merge dtype (float32 under merge_in_float32, else the key's).
  row_sparse_array sum(double scale);
  /// Ends the round: one more completed, the next opens empty.
  void close();
  /// As sync_round::admit_deferred.
  std::vector<admitted_push> admit_deferred();

private:
  /// A push's rows and their values, copied out of its frame.
  struct staged_rows {
    std::vector<std::byte> ids;
    std::vector<std::byte> values;
  };
  struct deferred_row_push {
    std::uint32_t sender = 0;
    std::uint64_t round = 0;
    staged_rows rows;
    deferred_answer answer;
  };

  chunk_outcome refuse(wire::error_code code, const sparse_push& push,
                       const std::string& why) const;
  /// `push` copied, into a spare buffer when there is one.
  staged_rows copied(const sparse_push& push);
  /// A whole push of worker `sender` joins the round being collected.
  void enter(std::uint32_t sender, staged_rows rows);

  sync_round_options options_;
  round_membership membership_;
  std::uint32_t round_quorum_;
  shape_vector shape_;
  troupe::dtype type_;
  std::size_t row_elements_ = 0;
  bool widen_ = false;
  /// The merge dtype of the round being collected (fixed when its first push comes).
  troupe::dtype merge_type_;
  std::uint64_t completed_ = 0;
  std::uint64_t dropped_ = 0;
  /// The round's pushes, in the order they entered, and buffers of closed rounds for reuse.
  std::vector<staged_rows> round_;
  std::vector<staged_rows> spare_;
  std::vector<std::uint8_t> pushed_;
  std::uint32_t done_ = 0;
  std::deque<deferred_row_push> deferred_;
};

} // namespace troupe

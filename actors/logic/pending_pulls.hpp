#pragma once
// The pulls of one key waiting at a server shard for their round (dist_sync) or for the slowest
// live worker (bounded staleness). Each records when its request expires: the shard drops it then
// without a reply, since the requester has given up. The shard bounds how many one worker may
// have waiting (shard_core.hpp), so a peer cannot grow this list without bound.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "actors/logic/envelope.hpp"
#include "engine/gradient_compression.hpp"

namespace troupe {

using shard_clock = std::chrono::steady_clock;

/// Sends one reply to the requester of a request.
using reply_function = std::function<void(envelope)>;

/// A request's way back: its requester's reply function, stamping every reply with the
/// connection the request came in on. One value, so that a waiting pull or a deferred push keeps
/// one function and not a function wrapping another.
struct reply_route {
  reply_function send;
  std::uint64_t connection = 0;

  void operator()(envelope out) const {
    out.connection = connection;
    send(std::move(out));
  }
};

struct waiting_pull {
  std::uint64_t request_id = 0;
  std::uint32_t sender = 0;
  /// The round it waits for (pull_request.round; a pushpull's push round + 1).
  std::uint64_t round = 0;
  shard_clock::time_point expiry;
  reply_route reply;
  /// When it arrived on the job trace's clock (job_trace.hpp); 0: not traced.
  std::int64_t traced_since_us = 0;
  /// A row-sparse pull: the rows asked for.
  bool row_sparse = false;
  std::vector<std::int64_t> rows = {};
  /// The rule the reply may be packed by (compressed pulls), or none.
  gradient_compression reply_packing = {compression_type::none};
};

class pending_pulls {
public:
  bool empty() const noexcept { return pulls_.empty(); }
  std::size_t size() const noexcept { return pulls_.size(); }
  std::size_t count_from(std::uint32_t sender) const noexcept {
    return static_cast<std::size_t>(std::count_if(
        pulls_.begin(), pulls_.end(), [&](const waiting_pull& p) { return p.sender == sender; }));
  }

  void add(waiting_pull pull) { pulls_.push_back(std::move(pull)); }

  /// Removes the pulls for which ready(pull) holds and returns them in arrival order.
  template <class Ready>
  std::vector<waiting_pull> take(Ready&& ready) {
    std::vector<waiting_pull> taken;
    take_into(std::forward<Ready>(ready), taken);
    return taken;
  }

  /// As take, appending to `taken`: a caller that keeps one vector for it allocates nothing once
  /// the vector has grown to the most pulls a round answers.
  template <class Ready>
  void take_into(Ready&& ready, std::vector<waiting_pull>& taken) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < pulls_.size(); ++i) {
      if (ready(std::as_const(pulls_[i]))) {
        taken.push_back(std::move(pulls_[i]));
      } else {
        if (kept != i)
          pulls_[kept] = std::move(pulls_[i]);
        ++kept;
      }
    }
    pulls_.erase(pulls_.begin() + static_cast<std::ptrdiff_t>(kept), pulls_.end());
  }

  /// Drops the pulls whose expiry has passed at `now`; returns how many.
  std::size_t expire(shard_clock::time_point now) {
    return take([now](const waiting_pull& pull) { return pull.expiry <= now; }).size();
  }

private:
  std::vector<waiting_pull> pulls_;
};

} // namespace troupe

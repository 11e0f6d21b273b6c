#include "actors/range_mover.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include <caf/blocking_actor.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include "actors/logic/completion.hpp"
#include "schema/chunking.hpp"

namespace troupe {
namespace {

using clock = std::chrono::steady_clock;

/// What the receiving server answered, per request id, and whether the link went down.
struct answers {
  std::mutex lock;
  std::map<std::uint64_t, completion<status>> waiting;
  std::optional<std::string> link_down;
};

caf::behavior receive_answers(caf::event_based_actor*, std::shared_ptr<answers> told) {
  return {
      [told](envelope& reply) {
        std::lock_guard hold{told->lock};
        auto take = [&](const wire::message& answer) {
          auto found = told->waiting.find(wire::request_id_of(answer));
          if (found == told->waiting.end())
            return;
          if (const auto* refusal = std::get_if<wire::error_reply>(&answer))
            found->second.deliver(error{errc::invalid_argument, refusal->message});
          else if (std::holds_alternative<wire::ack>(answer))
            found->second.deliver(ok());
        };
        // A server answers requests that arrive together in one batch frame.
        if (auto* fused = std::get_if<wire::batch>(&reply.msg))
          for (auto& one : fused->messages)
            take(wire::unbatched(std::move(one)));
        else
          take(reply.msg);
      },
      [told](link_down_atom, std::uint64_t, std::string& why) {
        std::lock_guard hold{told->lock};
        told->link_down = why;
        for (auto& [id, answer] : told->waiting)
          answer.deliver(error{errc::peer_lost, why});
      },
  };
}

status run_move(caf::actor_system& system, const range_move& move) {
  const auto deadline = clock::now() + move.timeout;
  const auto where = move.host + ":" + std::to_string(move.port);
  // Every shard's part.
  std::vector<completion<result<std::shared_ptr<const encoded_hand_over>>>> parts(
      move.shards.size());
  for (std::size_t i = 0; i < move.shards.size(); ++i)
    caf::anon_send(move.shards[i], hand_over_atom::value, shard_hand_over{move.ranges, parts[i]});
  std::vector<std::shared_ptr<const encoded_hand_over>> encoded;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    auto got = parts[i].wait_or_cancel(deadline);
    if (!got)
      return error{errc::timeout, "shard " + std::to_string(i) +
                                      " did not hand its part over within " +
                                      std::to_string(move.timeout.count()) + " ms"};
    if (!*got)
      return error{got->error().code(),
                   "shard " + std::to_string(i) + ": " + got->error().message()};
    total += (**got)->words.size();
    encoded.push_back(std::move(**got));
  }
  auto told = std::make_shared<answers>();
  auto receiver = system.spawn(receive_answers, told);
  auto link = connect_data_link(system, move.host, move.port, receiver, move.link);
  if (!link) {
    caf::anon_send_exit(receiver, caf::exit_reason::user_shutdown);
    return error{link.error().code(),
                 "the receiving server at " + where + ": " + link.error().message()};
  }
  std::vector<completion<status>> acks(encoded.size());
  {
    std::lock_guard hold{told->lock};
    for (std::size_t i = 0; i < encoded.size(); ++i)
      told->waiting.emplace(i + 1, acks[i]);
  }
  const auto started = clock::now();
  for (std::size_t i = 0; i < encoded.size(); ++i) {
    wire::chunker chunks{range_data_of(i + 1, static_cast<std::uint32_t>(i), *encoded[i]),
                         move.chunk_bytes};
    for (std::size_t c = 0; c < chunks.chunk_count(); ++c)
      caf::anon_send(*link, envelope{chunks.chunk(c), encoded[i], 0});
  }
  status outcome = ok();
  for (std::size_t i = 0; i < acks.size() && outcome; ++i) {
    auto got = acks[i].wait_or_cancel(deadline);
    if (!got)
      outcome = error{errc::timeout, "the receiving server at " + where + " took shard " +
                                         std::to_string(i) + "'s part not within " +
                                         std::to_string(move.timeout.count()) + " ms"};
    else if (!*got)
      outcome =
          error{got->error().code(), "the receiving server at " + where + " did not take shard " +
                                         std::to_string(i) + "'s part: " + got->error().message()};
  }
  if (outcome) {
    const auto seconds = std::chrono::duration<double>(clock::now() - started).count();
    move.log.info("handed " + std::to_string(total) + " bytes of key ranges over to " + where +
                  " in " + std::to_string(seconds) + " s");
  }
  caf::anon_send(*link, stop_atom::value);
  caf::anon_send_exit(receiver, caf::exit_reason::user_shutdown);
  return outcome;
}

} // namespace

void move_key_ranges(caf::actor_system& system, range_move move, std::function<void(status)> done) {
  // It takes an unused argument: CAF 0.17.6's init_fun_factory dereferences a null argument tuple
  // for a function without one (UBSan reports it).
  system.spawn<caf::detached>(
      [&system, move = std::move(move), done = std::move(done)](caf::blocking_actor*, int) {
        status outcome = ok();
        try {
          outcome = run_move(system, move);
        } catch (const std::exception& e) {
          outcome = error{errc::internal, std::string{"hand-over of key ranges: "} + e.what()};
        }
        if (!outcome)
          move.log.error("hand-over of key ranges to " + move.host + ":" +
                         std::to_string(move.port) + " failed: " + outcome.error().message());
        done(std::move(outcome));
      },
      0);
}

} // namespace troupe

// A shard's files: periodic checkpoints that restore a shard exactly (values, rounds, optimizer
// state), files that a torn write or a changed byte cannot get loaded, optimizer states written
// only inside the server's checkpoint directory and loaded only into the layout that wrote them,
// and a save that waits for the round a push it follows belongs to.

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/logic/shard_checkpoint.hpp"
#include "engine/serialize.hpp"
#include "tests/actors/logic/shard_driver.hpp"
#include "tests/temp_dir.hpp"

using namespace troupe;
using troupe::testing::shard_driver;
using troupe::testing::temp_dir;

namespace {

shard_options in_directory(const std::filesystem::path& directory, std::uint64_t every_rounds = 0) {
  shard_options options;
  options.checkpoint.dir = directory;
  options.checkpoint.every_rounds = every_rounds;
  return options;
}

/// Worker w's gradient of key `key` in round `round`: distinct for every triple.
ndarray gradient(std::uint64_t key, std::uint32_t worker, std::uint64_t round, std::int64_t n) {
  std::vector<float> values(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = 0.01f * static_cast<float>((key + 3 * worker + 7 * round + i) % 11) - 0.05f;
  auto out = ndarray::zeros({n});
  std::memcpy(out.raw_data(), values.data(), values.size() * sizeof(float));
  return out;
}

/// Every worker pushes keys 5 (4 floats) and 9 (3 floats) in `round`; true when all were acked.
bool push_round(shard_driver& job, std::uint32_t workers, std::uint64_t round) {
  bool acked = true;
  for (std::uint64_t key : {5u, 9u})
    for (std::uint32_t w = 0; w < workers; ++w) {
      auto g = gradient(key, w, round, key == 5 ? 4 : 3);
      auto id = job.push(key, w, round, g);
      acked = acked && job.ack(id) != nullptr;
    }
  return acked;
}

void start_job(shard_driver& job) {
  job.send(wire::set_optimizer{1, "sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}}});
  BOOST_TEST_REQUIRE(job.ack(1) != nullptr);
  BOOST_TEST_REQUIRE(job.init(5, ndarray::ones({4})));
  BOOST_TEST_REQUIRE(job.init(9, ndarray::full({3}, 2.0)));
}

shard_snapshot read_snapshot(const std::filesystem::path& file) {
  auto bytes = read_file(file.string());
  BOOST_TEST_REQUIRE(bytes.has_value(), file.string());
  auto decoded = decode_snapshot(*bytes, file.string());
  if (!decoded)
    BOOST_FAIL(decoded.error().message());
  return std::move(*decoded);
}

const wire::error_reply* command(shard_driver& job, std::uint64_t id, wire::command_kind kind,
                                 std::string name, bool dump_optimizer = false) {
  job.send(wire::command{id, kind, std::move(name), dump_optimizer});
  return job.error(id);
}

bool says(const wire::error_reply* error, const std::string& part) {
  return error != nullptr && error->message.find(part) != std::string::npos;
}

} // namespace

BOOST_AUTO_TEST_SUITE(shard_checkpoints)

BOOST_AUTO_TEST_CASE(a_checkpoint_restores_a_shard_exactly_and_its_pushes_go_on_from_there) {
  temp_dir dir;
  shard_driver original(2, {}, in_directory(dir.path(), 2));
  start_job(original);
  for (std::uint64_t round = 0; round < 4; ++round) {
    BOOST_TEST_REQUIRE(push_round(original, 2, round));
    BOOST_TEST_REQUIRE(original.shard->finish_checkpoint().has_value());
  }
  // Rounds 2 and 4 crossed a multiple of every_rounds = 2.
  BOOST_TEST(original.shard->stats().checkpoints_written == 2u);
  const auto file = checkpoint_file(dir.path(), original.shard->layout());
  auto saved = read_snapshot(file);
  BOOST_TEST(saved.keys.size() == 2u);
  BOOST_TEST(saved.keys[0].completed == 4u);

  // The run without a fault: two more rounds.
  for (std::uint64_t round = 4; round < 6; ++round)
    BOOST_TEST_REQUIRE(push_round(original, 2, round));

  // A fresh shard takes the checkpoint and runs the same two rounds: the same bits.
  shard_driver restored(2, {}, in_directory(dir.path()));
  auto taken = restored.shard->restore(saved);
  if (!taken)
    BOOST_FAIL(taken.error().message());
  BOOST_TEST(restored.shard->completed_rounds(5) == 4u);
  // A round the checkpoint holds is from the past.
  auto stale = restored.push(5, 0, 3, gradient(5, 0, 3, 4));
  BOOST_TEST_REQUIRE(restored.error(stale) != nullptr);
  BOOST_TEST((restored.error(stale)->code == wire::error_code::stale_round));
  for (std::uint64_t round = 4; round < 6; ++round)
    BOOST_TEST_REQUIRE(push_round(restored, 2, round));
  BOOST_TEST(restored.stored(5) == original.stored(5));
  BOOST_TEST(restored.stored(9) == original.stored(9));

  // The restored shard holds keys now: a second restore changes nothing.
  auto again = restored.shard->restore(saved);
  BOOST_TEST_REQUIRE(!again.has_value());
  BOOST_TEST(again.error().message().find("already holds keys") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(dist_async_checkpoints_keep_each_workers_applied_pushes) {
  temp_dir dir;
  sync_policy async;
  async.mode = consistency::async;
  shard_driver original(3, async, in_directory(dir.path()));
  BOOST_TEST_REQUIRE(original.init(5, ndarray::ones({4})));
  for (std::uint32_t w = 0; w < 3; ++w)
    for (std::uint64_t n = 0; n <= w; ++n)
      BOOST_TEST_REQUIRE(original.ack(original.push(5, w, n, gradient(5, w, n, 4))) != nullptr);
  BOOST_TEST_REQUIRE(original.shard->write_checkpoint().has_value());
  auto saved = read_snapshot(checkpoint_file(dir.path(), original.shard->layout()));
  BOOST_TEST_REQUIRE(saved.keys.size() == 1u);
  BOOST_TEST((saved.keys[0].applied_per_worker == std::vector<std::uint64_t>{1, 2, 3}));

  shard_driver restored(3, {}, in_directory(dir.path()));
  BOOST_TEST_REQUIRE(restored.shard->restore(saved).has_value());
  BOOST_TEST((restored.shard->policy().mode == consistency::async));
  BOOST_TEST(restored.shard->completed_rounds(5) == 6u);
  BOOST_TEST(restored.stored(5) == original.stored(5));
}

/// Worker `sender`'s push `sequence` of `key`, sent again after a server restart (Push.resent),
/// in chunks of `chunk_bytes`; returns the request id.
std::uint64_t resend(shard_driver& job, std::uint64_t key, std::uint32_t sender,
                     std::uint64_t sequence, const ndarray& value, std::size_t chunk_bytes) {
  const auto id = job.next_id++;
  wire::chunker chunks{wire::push{id, key, sender, sequence, troupe::testing::whole(value), true},
                       chunk_bytes};
  for (std::size_t i = 0; i < chunks.chunk_count(); ++i)
    job.send(chunks.chunk(i), value.keepalive());
  return id;
}

BOOST_AUTO_TEST_CASE(dist_async_after_a_restart_every_acked_push_is_applied_exactly_once) {
  temp_dir dir;
  sync_policy async;
  async.mode = consistency::async;
  shard_driver original(2, async, in_directory(dir.path()));
  original.send(wire::set_optimizer{1, "test", {{"rescale_grad", 1.0}}});
  BOOST_TEST_REQUIRE(original.ack(1) != nullptr);
  BOOST_TEST_REQUIRE(original.init(5, ndarray::ones({4})));
  std::vector<ndarray> pushes[2];
  for (std::uint32_t w = 0; w < 2; ++w)
    for (std::uint64_t n = 0; n < 6; ++n)
      pushes[w].push_back(gradient(5, w, n, 4));
  // Worker 0's pushes 0 and 1 and worker 1's push 0 reach the checkpoint; 0:2 and 1:1 do not.
  for (auto [w, n] : {std::pair{0u, 0u}, {0u, 1u}, {1u, 0u}})
    BOOST_TEST_REQUIRE(original.ack(original.push(5, w, n, pushes[w][n])) != nullptr);
  BOOST_TEST_REQUIRE(original.shard->write_checkpoint().has_value());
  // What each worker may forget: the sequence number of its next push in the file.
  const auto* late = original.ack(original.push(5, 0, 2, pushes[0][2]));
  BOOST_TEST_REQUIRE(late != nullptr);
  BOOST_TEST(late->durable == 2u);
  late = original.ack(original.push(5, 1, 1, pushes[1][1]));
  BOOST_TEST_REQUIRE(late != nullptr);
  BOOST_TEST(late->durable == 1u);
  BOOST_TEST(original.value_reply(original.pull(5, 1, 0))->durable == 1u);

  // The server restarts from its checkpoint. Worker 0 sends again everything from push 1 (say
  // it had not heard that push 1 was durable), worker 1 its push 1, in chunks.
  shard_driver restored(2, {}, in_directory(dir.path()));
  auto taken =
      restored.shard->restore(read_snapshot(checkpoint_file(dir.path(), original.shard->layout())));
  if (!taken)
    BOOST_FAIL(taken.error().message());
  auto had = resend(restored, 5, 0, 1, pushes[0][1], 8);
  BOOST_TEST(restored.ack(had) != nullptr);
  BOOST_TEST(restored.replies_to(had) == 1u);
  BOOST_TEST(restored.shard->completed_rounds(5) == 3u); // acked, not applied again
  BOOST_TEST(restored.ack(resend(restored, 5, 0, 2, pushes[0][2], 8)) != nullptr);
  BOOST_TEST(restored.ack(resend(restored, 5, 1, 1, pushes[1][1], 8)) != nullptr);
  BOOST_TEST(restored.shard->completed_rounds(5) == 5u);
  BOOST_TEST(restored.stored(5) == original.stored(5)); // each push once, in the same order

  // A push the key had, not marked as sent again, is a replay: refused, nothing changes.
  auto replay = restored.push(5, 0, 2, pushes[0][2]);
  BOOST_TEST_REQUIRE(restored.error(replay) != nullptr);
  BOOST_TEST((restored.error(replay)->code == wire::error_code::stale_round));
  BOOST_TEST(restored.error(replay)->message.find("push 2 of the key was had already") !=
                 std::string::npos,
             restored.error(replay)->message);
  BOOST_TEST(restored.stored(5) == original.stored(5));
  // A push numbered beyond the next is taken (those between were refused before the key); then
  // the numbers below it are replays.
  BOOST_TEST(restored.ack(restored.push(5, 1, 4, pushes[1][4])) != nullptr);
  BOOST_TEST(restored.error(restored.push(5, 1, 3, pushes[1][3])) != nullptr);
  BOOST_TEST(restored.shard->completed_rounds(5) == 6u);
}

BOOST_AUTO_TEST_CASE(a_torn_altered_or_foreign_file_is_never_loaded) {
  temp_dir dir;
  shard_driver job(2, {}, in_directory(dir.path()));
  start_job(job);
  BOOST_TEST_REQUIRE(push_round(job, 2, 0));
  auto bytes = encode_snapshot(job.shard->snapshot(snapshot_kind::checkpoint, true));

  // Every truncation, and one changed byte anywhere, fails the checksum (or the length check).
  for (std::size_t keep = 0; keep < bytes.size(); keep += 7) {
    auto torn = decode_snapshot(std::span{bytes}.first(keep), "torn");
    BOOST_TEST_REQUIRE(!torn.has_value(), "a torn file of " << keep << " bytes was read");
    BOOST_TEST((torn.error().code() == errc::corrupt_data));
  }
  for (std::size_t at = 0; at < bytes.size(); at += 13) {
    auto altered = bytes;
    altered[at] ^= std::byte{0x20};
    auto read = decode_snapshot(altered, "altered");
    BOOST_TEST_REQUIRE(!read.has_value(), "a change at byte " << at << " went unnoticed");
  }
  BOOST_TEST(decode_snapshot(bytes, "whole").has_value());

  // A checkpoint of another layout names every field that differs, and loads nothing.
  shard_options other = in_directory(dir.path());
  other.num_servers = 2;
  other.shards_per_server = 4;
  shard_driver elsewhere(2, {}, other);
  auto refused = elsewhere.shard->restore(*decode_snapshot(bytes, "whole"));
  BOOST_TEST_REQUIRE(!refused.has_value());
  BOOST_TEST(refused.error().message().find("num_servers 1 (here 2)") != std::string::npos);
  BOOST_TEST(refused.error().message().find("shards_per_server 1 (here 4)") != std::string::npos);
  BOOST_TEST(refused.error().message().find("key ranges (job.max_servers) 1 (here 2)") !=
             std::string::npos);
  BOOST_TEST(elsewhere.shard->value(5).is_none());
  // The same server in a job whose keys are placed over more ranges holds other ps-keys.
  shard_options more_ranges = in_directory(dir.path());
  more_ranges.num_ranges = 3;
  shard_driver wider(2, {}, more_ranges);
  refused = wider.shard->restore(*decode_snapshot(bytes, "whole"));
  BOOST_TEST_REQUIRE(!refused.has_value());
  BOOST_TEST(refused.error().message().find("key ranges (job.max_servers) 1 (here 3)") !=
                 std::string::npos,
             refused.error().message());
}

BOOST_AUTO_TEST_CASE(optimizer_states_are_written_only_inside_the_checkpoint_directory) {
  temp_dir dir;
  shard_driver job(2, {}, in_directory(dir.path() / "ckpt"));
  std::filesystem::create_directory(dir.path() / "ckpt");
  start_job(job);
  using wire::command_kind;
  BOOST_TEST(says(command(job, 10, command_kind::save_checkpoint, "/tmp/elsewhere"),
                  "not an absolute path"));
  BOOST_TEST(says(command(job, 11, command_kind::save_checkpoint, "../escape"), "'..'"));
  BOOST_TEST(says(command(job, 12, command_kind::save_checkpoint, "a/../../escape"), "'..'"));
  BOOST_TEST(
      says(command(job, 13, command_kind::load_checkpoint, "/etc/passwd"), "not an absolute path"));
  BOOST_TEST(!std::filesystem::exists(dir.path() / "escape.server0.shard0"));
  BOOST_TEST(command(job, 14, command_kind::save_checkpoint, "epoch-1") == nullptr);
  BOOST_TEST(job.ack(14) != nullptr);
  BOOST_TEST(std::filesystem::exists(dir.path() / "ckpt" / "epoch-1.server0.shard0"));
  BOOST_TEST(command(job, 15, command_kind::load_checkpoint, "epoch-1") == nullptr);

  // A server without a checkpoint directory writes no file at all.
  shard_driver nowhere(2);
  start_job(nowhere);
  BOOST_TEST(says(command(nowhere, 16, command_kind::save_checkpoint, "epoch-1"),
                  "no checkpoint directory (checkpoint.dir"));
}

BOOST_AUTO_TEST_CASE(states_of_another_layout_are_refused_naming_what_differs) {
  temp_dir dir;
  // Saved by shard 0 of a server with two shards; read by the only shard of a server with one:
  // the same file name, another key placement.
  shard_options two_shards = in_directory(dir.path());
  two_shards.shards_per_server = 2;
  shard_driver saver(2, {}, two_shards);
  start_job(saver);
  BOOST_TEST_REQUIRE(push_round(saver, 2, 0));
  BOOST_TEST_REQUIRE(command(saver, 20, wire::command_kind::save_checkpoint, "s") == nullptr);

  shard_driver loader(2, {}, in_directory(dir.path()));
  start_job(loader);
  auto refused = command(loader, 21, wire::command_kind::load_checkpoint, "s");
  BOOST_TEST_REQUIRE(refused != nullptr);
  BOOST_TEST(says(refused, "shards_per_server 2 (here 1)"), refused->message);
  // Nothing was loaded: the next round's update starts from fresh momentum, as in a shard that
  // never saw the file.
  shard_driver fresh(2, {}, in_directory(dir.path()));
  start_job(fresh);
  BOOST_TEST_REQUIRE(push_round(loader, 2, 0));
  BOOST_TEST_REQUIRE(push_round(fresh, 2, 0));
  BOOST_TEST(loader.stored(5) == fresh.stored(5));
}

BOOST_AUTO_TEST_CASE(dump_optimizer_decides_whether_a_load_brings_the_optimizer) {
  temp_dir dir;
  shard_driver saver(2, {}, in_directory(dir.path()));
  start_job(saver);
  BOOST_TEST_REQUIRE(push_round(saver, 2, 0));
  BOOST_TEST_REQUIRE(command(saver, 30, wire::command_kind::save_checkpoint, "bare", false) ==
                     nullptr);
  BOOST_TEST_REQUIRE(command(saver, 31, wire::command_kind::save_checkpoint, "dumped", true) ==
                     nullptr);
  BOOST_TEST(!read_snapshot(dir / "bare.server0.shard0").keys.empty());

  // A shard running another optimizer: the bare states are refused, the dumped ones bring sgd.
  shard_driver loader(2, {}, in_directory(dir.path()));
  loader.send(wire::set_optimizer{1, "adam", {}});
  BOOST_TEST_REQUIRE(loader.init(5, ndarray::ones({4})));
  BOOST_TEST_REQUIRE(loader.init(9, ndarray::full({3}, 2.0)));
  BOOST_TEST(says(command(loader, 32, wire::command_kind::load_checkpoint, "bare"), "'sgd'"));
  BOOST_TEST(command(loader, 33, wire::command_kind::load_checkpoint, "dumped") == nullptr);
  BOOST_TEST(loader.ack(33) != nullptr);
}

BOOST_AUTO_TEST_CASE(a_save_right_after_a_push_holds_the_round_of_that_push) {
  temp_dir dir;
  shard_driver job(2, {}, in_directory(dir.path()));
  start_job(job);
  BOOST_TEST_REQUIRE(push_round(job, 2, 0));
  // Worker 0 has pushed round 1 of both keys (acked), worker 1 not yet: the save waits.
  for (std::uint64_t key : {5u, 9u})
    BOOST_TEST_REQUIRE(job.ack(job.push(key, 0, 1, gradient(key, 0, 1, key == 5 ? 4 : 3))));
  job.send(wire::command{40, wire::command_kind::save_checkpoint, "after-push", true});
  BOOST_TEST(job.replies_to(40) == 0u);
  for (std::uint64_t key : {5u, 9u})
    BOOST_TEST_REQUIRE(job.ack(job.push(key, 1, 1, gradient(key, 1, 1, key == 5 ? 4 : 3))));
  BOOST_TEST_REQUIRE(job.ack(40) != nullptr);
  auto saved = read_snapshot(dir / "after-push.server0.shard0");
  for (const auto& key : saved.keys)
    BOOST_TEST(key.completed == 2u, "key " << key.ps_key);
}

BOOST_AUTO_TEST_CASE(a_timed_checkpoint_is_written_when_due_and_only_after_a_change) {
  temp_dir dir;
  shard_options options = in_directory(dir.path());
  options.checkpoint.every = std::chrono::seconds{10};
  shard_driver job(2, {}, options);
  start_job(job);
  job.now += std::chrono::seconds{11};
  job.shard->checkpoint_if_due();
  BOOST_TEST_REQUIRE(job.shard->finish_checkpoint().has_value());
  BOOST_TEST(job.shard->stats().checkpoints_written == 0u); // nothing was updated yet
  BOOST_TEST_REQUIRE(push_round(job, 2, 0));
  job.shard->checkpoint_if_due();
  BOOST_TEST_REQUIRE(job.shard->finish_checkpoint().has_value());
  BOOST_TEST(job.shard->stats().checkpoints_written == 1u);
  job.now += std::chrono::seconds{20};
  job.shard->checkpoint_if_due();
  BOOST_TEST_REQUIRE(job.shard->finish_checkpoint().has_value());
  BOOST_TEST(job.shard->stats().checkpoints_written == 1u); // no change since
  BOOST_TEST_REQUIRE(push_round(job, 2, 1));
  job.shard->checkpoint_if_due();
  BOOST_TEST_REQUIRE(job.shard->finish_checkpoint().has_value());
  BOOST_TEST(job.shard->stats().checkpoints_written == 2u);
  BOOST_TEST(read_snapshot(checkpoint_file(dir.path(), job.shard->layout())).keys[0].completed ==
             2u);
}

BOOST_AUTO_TEST_CASE(a_shard_that_stops_leaves_its_last_state_on_disk) {
  temp_dir dir;
  shard_layout layout;
  {
    shard_driver job(2, {}, in_directory(dir.path(), 5));
    start_job(job);
    for (std::uint64_t round = 0; round < 2; ++round)
      BOOST_TEST_REQUIRE(push_round(job, 2, round));
    BOOST_TEST(job.shard->stats().checkpoints_written == 0u); // 2 rounds of every 5
    layout = job.shard->layout();
  }
  auto saved = read_snapshot(checkpoint_file(dir.path(), layout));
  for (const auto& key : saved.keys)
    BOOST_TEST(key.completed == 2u);
}

BOOST_AUTO_TEST_SUITE_END()

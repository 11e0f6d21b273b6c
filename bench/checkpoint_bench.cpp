// How long a server shard takes to write a checkpoint and to come back from one: a shard of
// --megabytes of float32 values in keys of --key-megabytes, with SGD momentum on the server (the
// file then holds each value and its momentum), written with shard_core::write_checkpoint
// (encode, write, fsync, rename, fsync of the directory; "pause": the encoding alone, which is
// all a periodic checkpoint holds the shard up for) and restored into a fresh shard (read,
// checksum, decode, restore). The baseline in the same run: memcpy of the file's bytes. Medians of
// --repeat runs; one JSON line per operation (engine/json_line.hpp):
//
//   {"bench":"checkpoint","op":"restore","value_mb":100,"file_mb":200.0,"median_ms":...,
//    "median_gbps":...,"memcpy_gbps":...}
//
//   build/bench/checkpoint_bench --megabytes 100 --dir /tmp --repeat 5

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "actors/logic/shard_core.hpp"
#include "engine/json_line.hpp"
#include "engine/serialize.hpp"

using namespace troupe;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

void ask(shard_core& shard, wire::message msg) {
  bool answered = false;
  shard.handle(envelope{std::move(msg), nullptr, 0}, [&](envelope out) {
    answered = true;
    if (auto* refused = std::get_if<wire::error_reply>(&out.msg)) {
      std::fprintf(stderr, "checkpoint_bench: %s\n", refused->message.c_str());
      std::exit(1);
    }
  });
  if (!answered) {
    std::fprintf(stderr, "checkpoint_bench: a request went unanswered\n");
    std::exit(1);
  }
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"Server shard checkpoint write and restore times"};
  std::int64_t megabytes = 100, key_megabytes = 4;
  int repeat = 5;
  std::string directory = std::filesystem::temp_directory_path().string();
  app.add_option("--megabytes", megabytes, "Values held by the shard (MB)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--key-megabytes", key_megabytes, "Size of each key (MB)")
      ->check(CLI::Range(1, 1 << 12));
  app.add_option("--repeat", repeat, "Runs per operation")->check(CLI::Range(1, 1000));
  app.add_option("--dir", directory, "Where the checkpoint directory is made");
  CLI11_PARSE(app, argc, argv);

  auto dir =
      std::filesystem::path{directory} / ("troupe-checkpoint-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  shard_options options;
  options.num_workers = 1;
  options.checkpoint.dir = dir;
  shard_core shard{options};
  ask(shard, wire::set_optimizer{1, "sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}}});
  const std::int64_t elements = key_megabytes * 1'000'000 / 4;
  const std::int64_t keys = std::max<std::int64_t>(1, megabytes / key_megabytes);
  auto value = ndarray::ones({elements});
  auto grad = ndarray::full({elements}, 0.5);
  auto chunk_of = [](const ndarray& array) {
    wire::tensor_chunk tensor;
    tensor.type = wire::dtype::float32;
    tensor.shape = {array.shape()[0]};
    tensor.total_bytes = array.nbytes();
    tensor.data = {static_cast<const std::byte*>(array.raw_data()), array.nbytes()};
    return tensor;
  };
  std::uint64_t id = 2;
  for (std::int64_t key = 0; key < keys; ++key) {
    ask(shard, wire::init{id++, static_cast<std::uint64_t>(key), chunk_of(value)});
    ask(shard, wire::push{id++, static_cast<std::uint64_t>(key), 0, 0, chunk_of(grad)});
  }

  std::vector<double> pauses, writes, restores, copies;
  const auto file = checkpoint_file(dir, shard.layout());
  std::uintmax_t file_bytes = 0;
  for (int run = 0; run < repeat; ++run) {
    // What a periodic checkpoint holds the shard up for: the copy; the disk is written on a
    // thread of its own.
    auto start = clock_type::now();
    auto copy = encode_snapshot(shard.snapshot(snapshot_kind::checkpoint, true));
    pauses.push_back(seconds_since(start));
    copy = {};

    start = clock_type::now();
    if (auto written = shard.write_checkpoint(); !written) {
      std::fprintf(stderr, "checkpoint_bench: %s\n", written.error().message().c_str());
      return 1;
    }
    writes.push_back(seconds_since(start));
    file_bytes = std::filesystem::file_size(file);

    start = clock_type::now();
    auto bytes = read_file(file.string());
    auto saved =
        bytes ? decode_snapshot(*bytes, file.string()) : result<shard_snapshot>{bytes.error()};
    shard_core fresh{options};
    auto restored = saved ? fresh.restore(*saved) : status{saved.error()};
    if (!restored) {
      std::fprintf(stderr, "checkpoint_bench: %s\n", restored.error().message().c_str());
      return 1;
    }
    restores.push_back(seconds_since(start));

    std::vector<std::byte> source(file_bytes, std::byte{1}), target(file_bytes);
    start = clock_type::now();
    std::memcpy(target.data(), source.data(), file_bytes);
    copies.push_back(seconds_since(start));
  }
  std::filesystem::remove_all(dir);

  const double memcpy_gbps = static_cast<double>(file_bytes) / median(copies) / 1e9;
  for (auto [op, times] : {std::pair{"pause", &pauses}, std::pair{"write", &writes},
                           std::pair{"restore", &restores}}) {
    json_line::object line;
    line["bench"] = "checkpoint";
    line["op"] = op;
    line["value_mb"] = keys * key_megabytes;
    line["keys"] = keys;
    line["file_mb"] = json_line::fixed(static_cast<double>(file_bytes) / 1e6, 1);
    line["repeat"] = repeat;
    line["median_ms"] = json_line::fixed(median(*times) * 1e3, 1);
    line["min_ms"] = json_line::fixed(*std::min_element(times->begin(), times->end()) * 1e3, 1);
    line["median_gbps"] =
        json_line::fixed(static_cast<double>(file_bytes) / median(*times) / 1e9, 3);
    line["memcpy_gbps"] = json_line::fixed(memcpy_gbps, 3);
    json_line::print(line);
  }
  return 0;
}

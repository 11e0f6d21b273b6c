// kvbench: push, pull and pushpull through the distributed KVStore, as a worker of a real job.
//
//   troupe-launch -n W -s S -- build/bench/kvbench [--sizes 4096,16777216,...] [--keys 1,100]
//                 [--repeats 9] [--type dist_sync] [--ops push,pull,pushpull]
//                 [--key-elements 3211264,4096,16777216,4096,40960,10]
//
// For each (total size, key count) every worker initialises `keys` float32 keys that together
// hold `size` bytes, then times R repetitions of each of `--ops`: push of every key (all in
// flight at once), pull of every key, and pushpull (push then pull of the round's value). Worker
// rank 0 prints one JSON line per operation (engine/json_line.hpp): the median and spread of the
// per-repetition time, `gbps` = payload bytes the worker moved (push and pull: size each; pushpull:
// 2 x size) / median time, `median_us`, the median in microseconds (for small sizes, the round
// trip), and `machine_cpu_s`, the CPU-seconds the whole machine was busy over the repetitions
// (meaningful when the job is alone on the machine: bench/machine_cpu.hpp). Between phases the
// workers meet at a barrier so that every worker measures the same thing.
//
// --key-elements measures one set of keys of the given element counts instead of --sizes and
// --keys (a model's parameters, e.g. mlp-wide's above), issued as gluon's Trainer issues a step's
// reduction: one asynchronous request per key, the last key first (backward writes the last
// layers' gradients first), priority -index, then a wait for all of them. Its JSON lines carry
// "key_elements", the list.
//
// --gradient-compression 2bit|1bit [--compression-threshold T] compresses the pushes, and with
// --compress-pulls the replies of pulls and pushpulls too (no optimizer runs on the servers
// outside --row-sparse, so the replies are the rounds' sums, which the servers pack). Each line
// then names the rule, and every line carries `wire_bytes_per_op`, what the network interfaces of
// the namespace transmitted per repetition (/proc/net/dev: headers and both directions included;
// meaningful for a job alone in its namespace, with data.shm_arena_bytes = 0 so that same-host
// transfers cross a socket).
//
// --row-sparse ROWS,WIDTH [--row-fraction F] measures a row_sparse table instead (MXNet users
// found row_sparse push+pull 60x slower than dense, apache/mxnet#11299): a float32 key of ROWS x
// WIDTH, once dense and once row_sparse. Each repetition of "dense push+pull" pushes and pulls the
// whole table; each of "row_sparse push+pull" pushes F * ROWS rows (a fresh random set per
// repetition, drawn before the timing) and row_sparse_pulls the same rows, the servers running
// SGD on both keys (only the pushed rows move on the row_sparse one). A third line,
// "row_sparse_speedup", gives the ratio of the two medians of the same run.
//
// It starts with serve_if_node_role, so under a tracker that runs one program for every role
// (DMLC_ROLE) it is the scheduler or a server too; the cluster flags (--quorum, --timeout, ...)
// go to its store. A bad or missing value of the configuration the store reads exits 2 with one
// line, before anything connects.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/config/config.hpp"
#include "actors/dist_job.hpp"
#include "actors/kvstore/kvstore.hpp"
#include "engine/gradient_compression.hpp"
#include "engine/json_line.hpp"
#include "engine/log.hpp"
#include "engine/random.hpp"
#include "engine/row_sparse.hpp"
#include "machine_cpu.hpp"

using namespace troupe;
using clock_type = std::chrono::steady_clock;

namespace {

struct stats {
  double median = 0, fastest = 0, slowest = 0;
};

stats summarize(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  return {seconds[seconds.size() / 2], seconds.front(), seconds.back()};
}

/// What one JSON line measured.
struct subject {
  std::string type; ///< the KVStore type
  std::string op;   ///< push, pull or pushpull
  std::size_t bytes;
  std::size_t keys;
  int workers;
  std::vector<std::int64_t> key_elements; ///< --key-elements' list; empty otherwise
  std::string compression;                ///< --gradient-compression's rule; empty: none
};

/// The JSON line of one operation: `seconds` of each repetition, `moved` payload bytes each,
/// `busy_seconds` the machine's CPU time over them and `sent_bytes` what the namespace's
/// interfaces transmitted over them (negative: unknown).
void print_result(const subject& what, std::vector<double> seconds, double moved,
                  double busy_seconds, double sent_bytes) {
  const auto repeats = seconds.size();
  const stats s = summarize(std::move(seconds));
  json_line::object line;
  line["bench"] = "kvbench";
  line["type"] = what.type;
  line["op"] = what.op;
  line["bytes"] = what.bytes;
  line["keys"] = what.keys;
  line["workers"] = what.workers;
  if (!what.key_elements.empty())
    line["key_elements"] = what.key_elements;
  line["repeats"] = repeats;
  line["median_ms"] = json_line::fixed(s.median * 1e3, 3);
  line["min_ms"] = json_line::fixed(s.fastest * 1e3, 3);
  line["max_ms"] = json_line::fixed(s.slowest * 1e3, 3);
  line["gbps"] = json_line::fixed(moved / s.median / 1e9, 3);
  line["median_us"] = json_line::fixed(s.median * 1e6, 1);
  if (busy_seconds >= 0)
    line["machine_cpu_s"] = json_line::fixed(busy_seconds, 3);
  if (sent_bytes >= 0)
    line["wire_bytes_per_op"] = json_line::fixed(sent_bytes / static_cast<double>(repeats), 0);
  if (!what.compression.empty())
    line["gradient_compression"] = what.compression;
  json_line::print(line);
}

int fail(const std::string& what, const error& err) {
  logger{"kvbench", 0}.error(what + ": " + err.to_string());
  return 1;
}

/// --row-sparse: dense push+pull of a rows x width table against row_sparse push + row_sparse_pull
/// of `fraction` of its rows, `repeats` times each.
int row_sparse_bench(kvstore& kv, const std::string& type, std::int64_t rows, std::int64_t width,
                     double fraction, int repeats) {
  const kv_key dense_key = std::int64_t{1'000'000}, sparse_key = std::int64_t{1'000'001};
  // The servers run SGD, as in a training job (update_on_kvstore): on the row_sparse key only the
  // pushed rows move (lazy_update), on the dense one every row.
  if (auto set = kv.set_optimizer("sgd", {{"learning_rate", 0.01}}); !set)
    return fail("set_optimizer", set.error());
  auto table = ndarray::ones({rows, width});
  if (auto init = kv.init(dense_key, table); !init)
    return fail("init", init.error());
  if (auto init = kv.init(sparse_key, row_sparse_array::from_dense(table).value()); !init)
    return fail("init", init.error());
  auto out = ndarray::zeros({rows, width});
  const auto touched = std::max<std::int64_t>(1, static_cast<std::int64_t>(fraction * rows));
  // Each repetition's rows, drawn before the timing (sorted, distinct), and their values (one
  // array for all).
  const auto values = ndarray::ones({touched, width});
  std::mt19937_64 draw(1234 + static_cast<std::uint64_t>(kv.rank()));
  std::vector<row_sparse_array> pushes;
  std::vector<ndarray> asked;
  for (int r = 0; r <= repeats; ++r) {
    std::vector<std::int64_t> ids;
    std::uniform_int_distribution<std::int64_t> row(0, rows - 1);
    while (static_cast<std::int64_t>(ids.size()) < touched) {
      ids.push_back(row(draw));
      if (static_cast<std::int64_t>(ids.size()) == touched) {
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      }
    }
    std::vector<float> as_floats(ids.begin(), ids.end());
    asked.push_back(ndarray::from_values(as_floats, {touched}));
    pushes.push_back(row_sparse_array::from_rows(values, ids, {rows, width}).value());
  }
  auto time = [&](auto&& body) -> std::optional<std::vector<double>> {
    if (auto met = kv.barrier(); !met) {
      fail("barrier", met.error());
      return std::nullopt;
    }
    std::vector<double> seconds;
    for (int r = 0; r <= repeats; ++r) {
      auto start = clock_type::now();
      if (auto done = body(r); !done) {
        fail("row_sparse bench", done.error());
        return std::nullopt;
      }
      if (r > 0) // the first is a warm-up
        seconds.push_back(std::chrono::duration<double>(clock_type::now() - start).count());
    }
    return seconds;
  };
  auto dense = time([&](int) -> status {
    if (auto pushed = kv.push(dense_key, table); !pushed)
      return pushed;
    return kv.pull(dense_key, out);
  });
  if (!dense)
    return 1;
  row_sparse_array pulled;
  auto sparse = time([&](int r) -> status {
    const auto i = static_cast<std::size_t>(r);
    if (auto pushed = kv.push(sparse_key, pushes[i]); !pushed)
      return pushed;
    return kv.row_sparse_pull(sparse_key, pulled, asked[i]);
  });
  if (!sparse)
    return 1;
  if (kv.rank() != 0)
    return 0;
  const double table_bytes = static_cast<double>(rows * width) * sizeof(float);
  const double rows_bytes = static_cast<double>(touched * width) * sizeof(float);
  auto table_line = [&](const char* op) {
    json_line::object line;
    line["bench"] = "kvbench";
    line["type"] = type;
    line["op"] = op;
    line["rows"] = rows;
    line["width"] = width;
    line["rows_touched"] = touched;
    line["workers"] = kv.num_workers();
    return line;
  };
  auto line_of = [&](const char* op, const std::vector<double>& seconds, double moved) {
    const stats s = summarize(seconds);
    auto line = table_line(op);
    line["repeats"] = seconds.size();
    line["median_ms"] = json_line::fixed(s.median * 1e3, 3);
    line["min_ms"] = json_line::fixed(s.fastest * 1e3, 3);
    line["max_ms"] = json_line::fixed(s.slowest * 1e3, 3);
    line["gbps"] = json_line::fixed(moved / s.median / 1e9, 3);
    json_line::print(line);
    return s.median;
  };
  const double dense_median = line_of("dense push+pull", *dense, 2 * table_bytes);
  const double sparse_median = line_of("row_sparse push+pull", *sparse, 2 * rows_bytes);
  auto ratio = table_line("row_sparse_speedup");
  ratio["speedup"] = json_line::fixed(dense_median / sparse_median, 1);
  json_line::print(ratio);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (auto served = serve_if_node_role(argc, argv))
    return *served;
  CLI::App app{"troupe KVStore benchmark (run under troupe-launch)"};
  std::vector<std::size_t> sizes{4096, 1u << 20, 16u << 20, 128u << 20};
  std::vector<std::size_t> key_counts{1};
  int repeats = 9;
  std::string type = "dist_sync";
  std::vector<std::string> ops{"push", "pull", "pushpull"};
  std::vector<std::int64_t> key_elements;
  app.add_option("--sizes", sizes, "total bytes per measurement")->delimiter(',');
  app.add_option("--ops", ops, "operations to time, in this order (push, pull, pushpull)")
      ->delimiter(',')
      ->check(CLI::IsMember({"push", "pull", "pushpull"}));
  app.add_option("--keys", key_counts, "number of keys the bytes are spread over")->delimiter(',');
  app.add_option("--repeats", repeats)->check(CLI::Range(1, 100000));
  app.add_option("--key-elements", key_elements,
                 "element counts of a set of keys issued one request per key, as the Trainer "
                 "does (replaces --sizes and --keys)")
      ->delimiter(',')
      ->check(CLI::Range(std::int64_t{1}, std::numeric_limits<std::int64_t>::max()));
  app.add_option("--type", type);
  std::string compression_name = "none";
  std::optional<double> compression_threshold;
  app.add_option("--gradient-compression", compression_name,
                 "compress pushes (kvstore::set_gradient_compression)")
      ->check(CLI::IsMember({"none", "2bit", "1bit"}));
  app.add_option("--compression-threshold", compression_threshold, "its threshold (0.5)");
  bool compress_pulls = false;
  app.add_flag("--compress-pulls", compress_pulls,
               "pull replies packed too (troupe's extension; the servers run no optimizer here)");
  std::vector<std::int64_t> row_sparse_table;
  double row_fraction = 0.01;
  app.add_option("--row-sparse", row_sparse_table,
                 "ROWS,WIDTH: time a row_sparse table against the same table dense")
      ->delimiter(',')
      ->expected(2);
  app.add_option("--row-fraction", row_fraction, "fraction of the rows each push touches (0.01)")
      ->check(CLI::Range(1e-9, 1.0));
  config_overrides cluster_flags;
  add_config_flags(app, cluster_flags);
  if (auto done = parse_command_line(app, "kvbench", argc, argv))
    return *done;
  // A bad or missing value of the configuration the store will read is a usage error.
  if (type.starts_with("dist"))
    if (auto config = load_worker_config(process_environment(), cluster_flags); !config) {
      std::cerr << "kvbench: " << config.error().message() << "\n";
      return 2;
    }

  auto created = kvstore::create(type, cluster_flags);
  if (!created)
    return fail("create", created.error());
  auto& kv = **created;
  auto compression = gradient_compression::make(compression_name, compression_threshold);
  if (!compression) {
    std::cerr << "kvbench: " << compression.error().message() << "\n";
    return 2;
  }
  compression->pulls = compress_pulls && compression->enabled();
  if (compression->enabled())
    if (auto set = kv.set_gradient_compression(*compression); !set)
      return fail("set_gradient_compression", set.error());
  if (!row_sparse_table.empty()) {
    if (row_sparse_table[0] < 1 || row_sparse_table[1] < 1) {
      std::cerr << "kvbench: --row-sparse needs ROWS,WIDTH of at least 1 each\n";
      return 2;
    }
    return row_sparse_bench(kv, type, row_sparse_table[0], row_sparse_table[1], row_fraction,
                            repeats);
  }
  std::int64_t next_key = 0;

  // Each measurement is a set of keys: the element count of each, and whether they go as the
  // Trainer issues them (one request per key) rather than as one batch call.
  std::vector<std::vector<std::int64_t>> key_sets;
  if (!key_elements.empty())
    key_sets.push_back(key_elements);
  else
    for (auto keys : key_counts)
      for (auto size : sizes)
        if (auto elements = static_cast<std::int64_t>(size / sizeof(float) / keys); elements > 0)
          key_sets.emplace_back(keys, elements);
  const bool per_key = !key_elements.empty();

  for (const auto& key_set : key_sets) {
    const std::size_t keys = key_set.size();
    std::vector<kv_key> names;
    std::vector<ndarray> values, outputs;
    double bytes = 0;
    for (auto elements : key_set) {
      names.push_back(next_key++);
      values.push_back(ndarray::ones({elements}));
      outputs.push_back(ndarray::zeros({elements}));
      bytes += static_cast<double>(elements) * sizeof(float);
    }
    if (auto init = kv.init(names, values); !init)
      return fail("init", init.error());
    // Small payloads repeat more, so that their medians rest on enough samples.
    int rounds = bytes <= 64.0 * 1024 ? std::max(repeats, 500) : repeats;
    // One request per key, the last key first with priority -index, then a wait for all.
    auto each_key = [&](auto&& start) -> status {
      std::vector<kv_request> requests;
      for (std::size_t i = keys; i-- > 0;)
        requests.push_back(start(i, -static_cast<int>(i)));
      status outcome;
      for (auto& request : requests)
        if (auto done = request.wait(); !done && outcome)
          outcome = done;
      return outcome;
    };

    auto measure = [&](const std::string& op, auto&& body) -> int {
      if (auto met = kv.barrier(); !met)
        return fail("barrier", met.error());
      if (auto warm = body(); !warm)
        return fail(op, warm.error());
      std::vector<double> seconds;
      const double busy_at_start = bench::machine_busy_seconds();
      const double sent_at_start = bench::network_transmitted_bytes();
      for (int r = 0; r < rounds; ++r) {
        auto start = clock_type::now();
        if (auto done = body(); !done)
          return fail(op, done.error());
        seconds.push_back(std::chrono::duration<double>(clock_type::now() - start).count());
      }
      const double busy_at_end = bench::machine_busy_seconds();
      const double sent_at_end = bench::network_transmitted_bytes();
      if (kv.rank() == 0)
        print_result({type, op, static_cast<std::size_t>(bytes), keys, kv.num_workers(),
                      per_key ? key_set : std::vector<std::int64_t>{},
                      compression->enabled() ? compression->describe() : std::string{}},
                     seconds, op == "pushpull" ? 2 * bytes : bytes,
                     busy_at_start < 0 || busy_at_end < 0 ? -1.0 : busy_at_end - busy_at_start,
                     sent_at_start < 0 || sent_at_end < 0 ? -1.0 : sent_at_end - sent_at_start);
      return 0;
    };
    for (const auto& op : ops) {
      int rc = 0;
      auto one = [](auto& list, std::size_t i) { return std::span{&list[i], 1}; };
      if (op == "push")
        rc = measure(op, [&] {
          return per_key ? each_key([&](std::size_t i, int priority) {
            return kv.push_async(one(names, i), one(values, i), priority);
          })
                         : kv.push(names, values);
        });
      else if (op == "pull")
        rc = measure(op, [&] {
          return per_key ? each_key([&](std::size_t i, int priority) {
            return kv.pull_async(one(names, i), one(outputs, i), priority);
          })
                         : kv.pull(names, outputs);
        });
      else
        rc = measure(op, [&] {
          return per_key ? each_key([&](std::size_t i, int priority) {
            return kv.pushpull_async(one(names, i), one(values, i), one(outputs, i), priority);
          })
                         : kv.pushpull(names, values, outputs);
        });
      if (rc != 0)
        return rc;
    }
  }
  return 0;
}

#include "actors/kvstore/dist_kvstore.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <numeric>
#include <thread>

#include <caf/send.hpp>

#include "actors/kv_worker.hpp"
#include "actors/logic/hop_probe.hpp"
#include "actors/logic/key_placement.hpp"
#include "schema/chunking.hpp"

namespace troupe {
namespace {

bool known_type(const std::string& type) {
  return type == "dist_sync" || type == "dist_async" || type == "dist_device_sync" ||
         type == "dist_device_async" || type == "dist_sync_device" || type == "dist_async_device";
}

/// How long wait() waits at most: the worker fails a request itself once it has gone unanswered
/// for the timeout since it was sent, so this only catches a worker that stopped answering.
std::chrono::steady_clock::time_point backstop(std::chrono::milliseconds timeout) {
  return std::chrono::steady_clock::now() + 2 * timeout + std::chrono::seconds{1};
}

/// What the worker needs to know of a declared key; the caller adds values and outputs.
kv_key_work work_for(const key_declaration& declared) {
  kv_key_work work;
  work.index = declared.index;
  work.name = to_string(declared.key);
  work.shape = declared.shape;
  work.type = declared.type;
  return work;
}

/// Keys a distributed store takes: MXNet's C ints, from 0 (key_placement.hpp, max_sliced_key).
status check_key_numbers(std::span<const kv_key> keys) {
  for (const auto& key : keys)
    if (auto number = std::get_if<std::int64_t>(&key);
        number && (*number < 0 || static_cast<std::uint64_t>(*number) >= max_sliced_key))
      return error{errc::invalid_argument,
                   "init of key " + to_string(key) + ": distributed stores take keys from 0 to " +
                       std::to_string(max_sliced_key - 1) + " (MXNet's keys are C ints)"};
  return ok();
}

} // namespace

namespace {

/// The distributed stores alive in this process (lanes_may_wait_for_requests).
std::atomic<std::size_t> live_dist_stores{0};

} // namespace

dist_kvstore::dist_kvstore(worker_setup setup)
    : owned_resources_(setup.owned_resources), setup_(std::move(setup)) {
  live_dist_stores.fetch_add(1, std::memory_order_relaxed);
  setup_.owned_resources.reset();
  if (setup_.type.find("device") != std::string::npos)
    comm_ = std::make_unique<comm_device>();
  else
    comm_ = std::make_unique<comm_host>();
}

result<std::unique_ptr<dist_kvstore>> dist_kvstore::create(worker_setup setup) {
  auto invalid = [](std::string text) { return error{errc::invalid_argument, std::move(text)}; };
  if (!known_type(setup.type))
    return invalid("unknown distributed kvstore type '" + setup.type +
                   "' (dist_sync, dist_async, dist_device_sync, dist_device_async)");
  // A worker that joined the running job has a fresh rank, beyond the first workers' ranks.
  if (setup.num_servers == 0 || setup.num_workers == 0 ||
      (setup.rank >= setup.num_workers && !setup.joined))
    return invalid("a distributed kvstore needs at least one server and one worker and a rank "
                   "below the number of workers (rank " +
                   std::to_string(setup.rank) + " of " + std::to_string(setup.num_workers) +
                   " workers, " + std::to_string(setup.num_servers) + " servers)");
  if (!setup.range_owner.empty()) {
    if (setup.range_owner.size() < setup.num_servers)
      return invalid(std::to_string(setup.range_owner.size()) + " key ranges for " +
                     std::to_string(setup.num_servers) + " servers");
    for (std::size_t range = 0; range < setup.range_owner.size(); ++range)
      if (setup.range_owner[range] >= setup.num_servers)
        return invalid("key range " + std::to_string(range) + " is held by server " +
                       std::to_string(setup.range_owner[range]) + " of a job of " +
                       std::to_string(setup.num_servers) + " servers");
  }
  if (!wire::valid_chunk_bytes(setup.chunk_bytes))
    return invalid("chunk size " + std::to_string(setup.chunk_bytes) +
                   " is not a multiple of 8 bytes from 8 to " +
                   std::to_string(wire::max_chunk_bytes));
  if (setup.quorum > setup.num_workers && !setup.joined)
    return invalid("quorum " + std::to_string(setup.quorum) + " exceeds the job's " +
                   std::to_string(setup.num_workers) + " workers");
  if (setup.max_rounds_ahead == 0)
    return invalid("max_rounds_ahead must be at least 1");
  const bool async = setup.type.find("async") != std::string::npos;
  if (setup.max_staleness >= 0 && !async)
    return invalid("max_staleness " + std::to_string(setup.max_staleness) + " bounds dist_async; " +
                   setup.type + " already waits for every round (staleness 0)");
  if (!setup.system || !setup.connect_servers || !setup.barrier)
    return invalid("a distributed kvstore needs an actor system, server links and a barrier");

  std::unique_ptr<dist_kvstore> store{new dist_kvstore(std::move(setup))};
  auto& s = store->setup_;
  auto& system = *s.system;
  kv_worker_options options;
  options.rank = s.rank;
  options.num_servers = s.num_servers;
  options.range_owner = s.range_owner;
  options.num_workers = s.num_workers;
  options.sync = store->sync_mode();
  options.joined = s.joined;
  options.bigarray_bound = s.bigarray_bound;
  options.chunk_bytes = s.chunk_bytes;
  options.max_frame_bytes = s.max_frame_bytes;
  options.slice_bytes = s.slice_bytes;
  options.send_window_bytes = s.send_window_bytes;
  options.slice_credit = s.slice_credit;
  options.fuse_item_bytes = s.fuse_item_bytes;
  options.fuse_frame_bytes = s.fuse_frame_bytes;
  options.request_timeout = s.timeout;
  options.max_rounds_ahead = s.max_rounds_ahead;
  options.server_rejoin = s.server_rejoin;
  options.reconnect = s.reconnect_server;
  options.log = s.log;
  options.summary_log = s.summary_log;
  options.lane = store->lane_;
  store->worker_ = spawn_kv_worker(system, options);
  auto links = s.connect_servers(caf::actor_cast<caf::actor>(store->worker_));
  if (!links) {
    store->abandon();
    return links.error();
  }
  if (links->links.size() != s.num_servers) {
    for (auto& link : links->links)
      caf::anon_send_exit(link, caf::exit_reason::user_shutdown);
    store->abandon();
    return error{errc::internal, "got " + std::to_string(links->links.size()) +
                                     " server links for " + std::to_string(s.num_servers) +
                                     " servers"};
  }
  store->links_ = links->links;
  caf::anon_send(store->worker_, std::move(*links));
  if (s.on_started)
    s.on_started(store->worker_);
  if (s.rank == 0) {
    // Servers learn the job's consistency from rank 0, before any init of it reaches them; the
    // scheduler learns how many lost workers the job survives.
    const auto settings = store->settings();
    auto told = store->to_every_server(
        [settings](std::uint64_t id, std::uint32_t) -> wire::message {
          auto message = settings;
          message.request_id = id;
          return message;
        },
        "sync settings");
    // A store that failed to start was never part of the job's work: it must not report done.
    if (!told) {
      store->abandon();
      return told.error();
    }
    if (s.announce_settings)
      if (auto announced = s.announce_settings(settings); !announced) {
        store->abandon();
        return announced.error();
      }
  }
  return store;
}

dist_kvstore::~dist_kvstore() {
  (void)finalize();
  live_dist_stores.fetch_sub(1, std::memory_order_relaxed);
}

bool dist_kvstore::lanes_may_wait_for_requests() const noexcept {
  return live_dist_stores.load(std::memory_order_relaxed) == 1;
}

bool dist_kvstore::sync_mode() const noexcept {
  return setup_.type.find("async") == std::string::npos;
}

wire::sync_settings dist_kvstore::settings() const {
  wire::sync_settings settings;
  settings.mode = sync_mode() ? wire::consistency_mode::sync : wire::consistency_mode::async;
  settings.quorum = setup_.quorum == 0 ? setup_.num_workers : setup_.quorum;
  settings.rescale_quorum = setup_.rescale_quorum;
  settings.max_staleness = setup_.max_staleness;
  settings.max_rounds_ahead = setup_.max_rounds_ahead;
  return settings;
}

kv_request dist_kvstore::start(kv_operation op) {
  if (auto open = still_in_job(op.what); !open)
    return kv_request::done(open.error());
  completion<status> done;
  op.done = done;
  std::string what = op.what;
  TROUPE_HOP(caller_send);
  lane_->call(std::move(op));
  return kv_request{std::move(done), std::move(what), backstop(setup_.timeout)};
}

result<kv_operation> dist_kvstore::make_operation(kv_call call, std::span<const kv_key> keys,
                                                  std::span<const ndarray> values,
                                                  std::span<ndarray> outputs, const char* what) {
  kv_operation op;
  op.call = call;
  op.what = what;
  const bool pushes = call == kv_call::push || call == kv_call::pushpull;
  const bool pulls = call == kv_call::pull || call == kv_call::pushpull;
  auto groups = pushes ? keys_.group(keys, values, what, "pushed value")
                       : keys_.group(keys, outputs, what, "output");
  if (!groups)
    return groups.error();
  std::optional<std::vector<key_group>> output_groups;
  if (pushes && pulls) {
    auto grouped = keys_.group(keys, outputs, what, "output");
    if (!grouped)
      return grouped.error();
    output_groups = std::move(*grouped);
  }
  auto built = status_of([&]() -> status {
    op.keys.reserve(groups->size());
    for (std::size_t g = 0; g < groups->size(); ++g) {
      const auto& group = (*groups)[g];
      const auto& declared = *group.declaration;
      auto work = work_for(declared);
      if (pushes) {
        // One host value goes out as it is (the caller leaves it alone until the request
        // completes, as kv_request says); a list is summed first, on the host or the devices.
        const auto& first = values[group.positions.front()];
        ndarray merged;
        if (group.positions.size() == 1 && first.ctx().is_cpu()) {
          merged = first;
        } else {
          std::vector<ndarray> list;
          for (auto position : group.positions)
            list.push_back(values[position]);
          merged = comm_->reduce(declared.index, list);
        }
        work.value = merged.ctx().is_cpu() ? std::move(merged) : merged.copy_to(context::cpu());
        // The worker actor reads the bytes on its own thread, which must not wait for queued
        // work (engine/dispatch.hpp): the wait is here, on the caller's.
        work.value.wait_to_read();
      }
      if (pulls) {
        const auto& positions = output_groups ? (*output_groups)[g].positions : group.positions;
        for (auto position : positions) {
          outputs[position].wait_to_write(); // nothing queued may still use what the reply writes
          work.outputs.push_back(outputs[position]);
        }
      }
      op.keys.push_back(std::move(work));
    }
    return ok();
  });
  if (!built)
    return built.error();
  return op;
}

status dist_kvstore::init(std::span<const kv_key> keys, std::span<const ndarray> values) {
  if (auto checked = keys_.check_new(keys, values); !checked)
    return checked;
  return declare_and_send(keys, values, false);
}

status dist_kvstore::init(std::span<const kv_key> keys, std::span<const row_sparse_array> values) {
  // A row_sparse key is stored dense on its servers (as MXNet's servers store it), so its value
  // travels dense, split by rows.
  auto dense = keys_.check_new(keys, values);
  if (!dense)
    return dense.error();
  return declare_and_send(keys, *dense, true);
}

status dist_kvstore::declare_and_send(std::span<const kv_key> keys, std::span<const ndarray> values,
                                      bool row_sparse) {
  if (auto checked = check_key_numbers(keys); !checked)
    return checked;
  if (auto open = still_in_job("init"); !open)
    return open;
  keys_.declare(keys, values, row_sparse);
  if (setup_.joined)
    return pull_to_join(keys, values, row_sparse);
  if (setup_.rank == 0) {
    kv_operation op;
    op.call = kv_call::init;
    op.what = "init";
    auto built = status_of([&]() -> status {
      for (std::size_t i = 0; i < keys.size(); ++i) {
        auto work = work_for(*keys_.find(keys[i], "init").value());
        work.row_sparse = row_sparse;
        work.value = values[i].ctx().is_cpu() ? values[i] : values[i].copy_to(context::cpu());
        work.value.wait_to_read();
        op.keys.push_back(std::move(work));
      }
      return ok();
    });
    if (!built)
      return built;
    if (auto done = start(std::move(op)).wait(); !done)
      return done;
  }
  return start_barrier();
}

status dist_kvstore::pull_to_join(std::span<const kv_key> keys, std::span<const ndarray> values,
                                  bool row_sparse) {
  // The keys are on the servers, with the job's current values: the first pull of each is what
  // the servers answer once the round this worker counts from can start (the worker's rounds of
  // the key start from that reply). The values themselves are the caller's to pull.
  std::vector<ndarray> scratch;
  std::vector<row_sparse_array> sparse_scratch;
  std::vector<ndarray> every_row;
  for (const auto& value : values) {
    if (!row_sparse) {
      scratch.push_back(ndarray::empty(value.shape(), context::cpu(), value.dtype()));
      continue;
    }
    const auto rows = value.shape().empty() ? std::int64_t{0} : value.shape()[0];
    auto ids = ndarray::empty({rows}, context::cpu(), dtype::int64);
    auto* id = static_cast<std::int64_t*>(ids.raw_data());
    for (std::int64_t row = 0; row < rows; ++row)
      id[row] = row;
    every_row.push_back(std::move(ids));
    sparse_scratch.push_back(row_sparse_array::zeros(value.shape(), value.dtype()));
  }
  auto first_pulls = [&] {
    return row_sparse ? row_sparse_pull(keys, sparse_scratch, every_row) : pull(keys, scratch);
  };
  // A worker that joined as the job began may come before worker rank 0 has initialised a key:
  // it waits for the key, within the request timeout.
  const auto deadline = std::chrono::steady_clock::now() + setup_.timeout;
  for (auto pause = std::chrono::milliseconds{1};;
       pause = std::min(pause * 2, max_init_wait_step)) {
    auto pulled = first_pulls();
    if (pulled || pulled.error().code() != errc::unknown_key ||
        std::chrono::steady_clock::now() + pause > deadline)
      return pulled;
    std::this_thread::sleep_for(pause);
  }
}

status dist_kvstore::start_barrier() {
  // The first workers' setup (init, set_optimizer) is done: a worker that joined has nobody to
  // meet there.
  if (setup_.joined)
    return ok();
  return setup_.start_barrier ? setup_.start_barrier() : setup_.barrier();
}

int dist_kvstore::num_workers() const noexcept {
  if (setup_.workers_now)
    if (const auto now = setup_.workers_now(); now > 0)
      return static_cast<int>(now);
  return static_cast<int>(setup_.num_workers);
}

std::vector<int> dist_kvstore::worker_ranks() const {
  if (setup_.ranks_in)
    if (auto ranks = setup_.ranks_in(); !ranks.empty())
      return ranks;
  std::vector<int> ranks(static_cast<std::size_t>(num_workers()));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

/// Worker r's values at index r, as gather_at_barrier lays them out.
static std::vector<std::vector<double>> by_worker_rank(std::vector<wire::gathered_values> gathered,
                                                       std::uint32_t num_workers) {
  std::uint32_t ranks = num_workers;
  for (const auto& member : gathered)
    if (member.member_role == wire::role::worker)
      ranks = std::max(ranks, member.rank + 1);
  std::vector<std::vector<double>> by_rank(ranks);
  for (auto& member : gathered)
    if (member.member_role == wire::role::worker && member.rank < by_rank.size())
      by_rank[member.rank] = std::move(member.values);
  return by_rank;
}

std::optional<std::vector<std::vector<double>>> dist_kvstore::gathered_at_join() const {
  if (!setup_.gathered_at_join)
    return std::nullopt;
  return by_worker_rank(*setup_.gathered_at_join, setup_.num_workers);
}

status dist_kvstore::push(std::span<const kv_key> keys, std::span<const row_sparse_array> values,
                          int priority) {
  // Every pair is checked before anything leaves; a key named twice sums its values here.
  auto groups = keys_.group_rows(keys, values, "push", compression_.enabled());
  if (!groups)
    return groups.error();
  kv_operation op;
  op.call = kv_call::push;
  op.what = "push";
  op.priority = priority;
  auto built = status_of([&]() -> status {
    for (const auto& group : *groups) {
      auto merged = group.values.size() == 1 ? *group.values.front() : sum_rows(group.values);
      auto work = work_for(*group.declaration);
      work.row_sparse = true;
      work.rows = merged.indices();
      work.value =
          merged.data().ctx().is_cpu() ? merged.data() : merged.data().copy_to(context::cpu());
      work.value.wait_to_read();
      op.keys.push_back(std::move(work));
    }
    return ok();
  });
  if (!built)
    return built;
  return start(std::move(op)).wait();
}

status dist_kvstore::row_sparse_pull(std::span<const kv_key> keys,
                                     std::span<row_sparse_array> outputs,
                                     std::span<const ndarray> row_ids, int priority) {
  auto requests = keys_.rows_to_pull(keys, outputs.size(), row_ids);
  if (!requests)
    return requests.error();
  kv_operation op;
  op.call = kv_call::pull;
  op.what = "row_sparse_pull";
  op.priority = priority;
  // Each key's rows land in one host array, whose parts the servers fill (place_rows).
  std::vector<ndarray> data;
  auto built = status_of([&]() -> status {
    for (const auto& request : *requests) {
      auto shape = request.declaration->shape;
      shape[0] = static_cast<std::int64_t>(request.rows.size());
      data.push_back(ndarray::empty(shape, context::cpu(), request.declaration->type));
      auto work = work_for(*request.declaration);
      work.row_sparse = true;
      work.rows = request.rows;
      work.outputs.push_back(data.back());
      op.keys.push_back(std::move(work));
    }
    return ok();
  });
  if (!built)
    return built;
  if (auto done = start(std::move(op)).wait(); !done)
    return done;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto& request = (*requests)[i];
    auto made = row_sparse_array::from_rows(data[i], request.rows, request.declaration->shape);
    if (!made)
      return made.error();
    outputs[i] = std::move(*made);
  }
  return ok();
}

kv_request dist_kvstore::push_async(std::span<const kv_key> keys, std::span<const ndarray> values,
                                    int priority) {
  auto op = make_operation(kv_call::push, keys, values, {}, "push");
  if (!op)
    return kv_request::done(op.error());
  op->priority = priority;
  op->compression = compression_;
  return start(std::move(*op));
}

kv_request dist_kvstore::pull_async(std::span<const kv_key> keys, std::span<ndarray> outputs,
                                    int priority) {
  auto op = make_operation(kv_call::pull, keys, {}, outputs, "pull");
  if (!op)
    return kv_request::done(op.error());
  op->priority = priority;
  op->compression = compression_;
  return start(std::move(*op));
}

kv_request dist_kvstore::pushpull_async(std::span<const kv_key> keys,
                                        std::span<const ndarray> values, std::span<ndarray> outputs,
                                        int priority) {
  auto op = make_operation(kv_call::pushpull, keys, values, outputs, "pushpull");
  if (!op)
    return kv_request::done(op.error());
  op->priority = priority;
  op->compression = compression_;
  return start(std::move(*op));
}

status dist_kvstore::push(std::span<const kv_key> keys, std::span<const ndarray> values,
                          int priority) {
  auto done = push_async(keys, values, priority).wait();
  TROUPE_HOP(caller_woken);
  return done;
}

status dist_kvstore::pull(std::span<const kv_key> keys, std::span<ndarray> outputs, int priority) {
  return pull_async(keys, outputs, priority).wait();
}

status dist_kvstore::pushpull(std::span<const kv_key> keys, std::span<const ndarray> values,
                              std::span<ndarray> outputs, int priority) {
  auto done = pushpull_async(keys, values, outputs, priority).wait();
  TROUPE_HOP(caller_woken);
  return done;
}

status dist_kvstore::barrier() {
  if (auto open = still_in_job("barrier"); !open)
    return open;
  return setup_.barrier();
}

result<std::vector<std::vector<double>>>
dist_kvstore::gather_at_barrier(std::span<const double> mine) {
  if (mine.size() > max_gathered_values)
    return error{errc::invalid_argument, "gather_at_barrier: " + std::to_string(mine.size()) +
                                             " values; at most " +
                                             std::to_string(max_gathered_values)};
  if (!setup_.gather)
    return error{errc::not_supported,
                 "gather_at_barrier: this store's job has no gathering barrier"};
  if (auto open = still_in_job("gather_at_barrier"); !open)
    return open.error();
  auto gathered = setup_.gather(mine);
  if (!gathered)
    return gathered.error();
  return by_worker_rank(std::move(*gathered), setup_.num_workers);
}

status dist_kvstore::to_every_server(
    std::function<wire::message(std::uint64_t request_id, std::uint32_t server)> make,
    std::string what) const {
  kv_operation op;
  op.call = kv_call::every_server;
  op.message_for = std::move(make);
  op.what = std::move(what);
  return const_cast<dist_kvstore*>(this)->start(std::move(op)).wait();
}

status dist_kvstore::set_optimizer(std::unique_ptr<optimizer> opt) {
  if (!opt)
    return error{errc::invalid_argument, "set_optimizer with no optimizer"};
  if (setup_.rank == 0) {
    std::vector<wire::optimizer_param> params;
    for (const auto& [name, value] : opt->params())
      params.push_back({name, value});
    auto sent = to_every_server(
        [name = opt->name(), params](std::uint64_t id, std::uint32_t) -> wire::message {
          return wire::set_optimizer{id, name, params};
        },
        "set_optimizer " + opt->name());
    if (!sent)
      return sent;
  }
  return start_barrier();
}

status dist_kvstore::set_gradient_compression(const gradient_compression& rule) {
  if (setup_.rank == 0) {
    auto sent = to_every_server(
        [type = std::string{rule.type_name()}, threshold = static_cast<double>(rule.threshold)](
            std::uint64_t id, std::uint32_t) -> wire::message {
          return wire::set_gradient_compression{id, type, threshold};
        },
        "set_gradient_compression " + rule.describe());
    if (!sent)
      return sent;
  }
  compression_ = rule;
  return ok();
}

status dist_kvstore::set_updater(updater_function) {
  return error{errc::not_supported,
               "set_updater: a distributed kvstore runs updates on its servers; use "
               "set_optimizer, or pull the summed gradients and update on the worker"};
}

bool dist_kvstore::is_capable(std::string_view capability) const noexcept {
  return capability == "optimizer";
}

status dist_kvstore::rank_zero_only(const std::string& what) const {
  if (setup_.rank == 0)
    return ok();
  return error{errc::invalid_argument,
               what +
                   ": only worker rank 0 sends commands to the servers, and this is worker rank " +
                   std::to_string(setup_.rank) +
                   " (call it on rank 0 while the other workers wait at a barrier)"};
}

status dist_kvstore::save_optimizer_states(const std::string& path, bool dump_optimizer) const {
  if (auto allowed = rank_zero_only("save_optimizer_states to " + path); !allowed)
    return allowed;
  // Each server writes its shards' files under its own checkpoint directory: `path` is a name
  // there (actors/logic/shard_checkpoint.hpp, states_file).
  return to_every_server(
      [path, dump_optimizer](std::uint64_t id, std::uint32_t) -> wire::message {
        return wire::command{id, wire::command_kind::save_checkpoint, path, dump_optimizer};
      },
      "save_optimizer_states to " + path);
}

status dist_kvstore::load_optimizer_states(const std::string& path) {
  if (auto allowed = rank_zero_only("load_optimizer_states from " + path); !allowed)
    return allowed;
  return to_every_server(
      [path](std::uint64_t id, std::uint32_t) -> wire::message {
        return wire::command{id, wire::command_kind::load_checkpoint, path};
      },
      "load_optimizer_states from " + path);
}

void dist_kvstore::abandon() {
  finalized_ = true;
  caf::anon_send_exit(worker_, caf::exit_reason::user_shutdown);
  for (auto& link : links_)
    caf::anon_send_exit(link, caf::exit_reason::user_shutdown);
}

status dist_kvstore::finalize() {
  if (finalized_)
    return ok();
  finalized_ = true;
  completion<result<std::uint64_t>> drained;
  caf::anon_send(worker_, finalize_atom::value, drained);
  status outcome = ok();
  std::uint64_t rounds = 0;
  if (auto got = drained.wait_or_cancel(backstop(setup_.timeout))) {
    if (*got)
      rounds = **got;
    else
      outcome = got->error();
  } else {
    outcome = error{errc::timeout, "finalize: the KVStore worker did not answer"};
  }
  if (setup_.on_finalize)
    if (auto told = setup_.on_finalize(rounds); !told && outcome)
      outcome = error{told.error().code(), "leaving the job: " + told.error().message()};
  abandon();
  return outcome;
}

status dist_kvstore::leave() {
  return finalize();
}

status dist_kvstore::still_in_job(std::string_view what) const {
  if (!finalized_)
    return ok();
  return error{errc::invalid_argument, std::string{what} + ": worker " +
                                           std::to_string(setup_.rank) +
                                           " has left the job (leave() or close); its store takes "
                                           "no more calls"};
}

result<std::unique_ptr<kvstore>> connect_worker(const std::string& type,
                                                const cluster_config& config) {
  auto setup = join_worker(type, config);
  if (!setup)
    return setup.error();
  auto store = dist_kvstore::create(std::move(*setup));
  if (!store)
    return store.error();
  return std::unique_ptr<kvstore>{std::move(*store)};
}

result<std::unique_ptr<kvstore>> create_distributed(const std::string& type,
                                                    const config_overrides& flags) {
  auto config = load_config(std::nullopt, process_environment(), flags);
  if (!config)
    return config.error();
  const auto role = config->role.value_or(node_role::worker);
  if (role != node_role::worker)
    return error{
        errc::invalid_argument,
        "kvstore::create(\"" + type + "\"): this process's configuration names the role " +
            std::string(to_string(role)) +
            " (DMLC_ROLE, [job] role or --role), which serves the job instead of holding a "
            "store: call troupe::serve_if_node_role(argc, argv) first in main and return "
            "its exit code (actors/dist_job.hpp)"};
  return connect_worker(type, *config);
}

} // namespace troupe

#include "actors/dist_kvstore.hpp"

#include <condition_variable>
#include <cstring>

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include "actors/key_placement.hpp"
#include "actors/wire_conversions.hpp"
#include "schema/chunking.hpp"

namespace troupe {

/// Work shared by the parts of one key's pull: the outputs to fill from the staging buffer once
/// every slice has arrived.
struct pull_group {
  std::mutex mutex;
  std::size_t remaining = 0;
  std::function<status()> finish;
};

struct dist_kvstore::pending {
  kv_request request;
  std::string what;
  std::uint32_t server = 0;
  std::optional<wire::reassembler> assembly; // for parts answered with a pull_reply
  std::shared_ptr<const void> hold;          // keeps the assembly's destination alive
  std::shared_ptr<pull_group> group;
};

namespace {} // namespace

struct dist_kvstore::reply_table {
  std::mutex mutex;
  std::condition_variable drained;
  std::map<std::uint64_t, std::shared_ptr<pending>> parts;
  std::optional<error> failure;

  void add(std::uint64_t id, std::shared_ptr<pending> part) {
    std::lock_guard lock{mutex};
    parts.emplace(id, std::move(part));
  }

  std::shared_ptr<pending> find(std::uint64_t id) {
    std::lock_guard lock{mutex};
    auto found = parts.find(id);
    return found == parts.end() ? nullptr : found->second;
  }

  /// Ends a part: runs its pull group's finish when it is the group's last, then tells the
  /// request.
  void finish(std::uint64_t id, const std::shared_ptr<pending>& part, status outcome) {
    {
      std::lock_guard lock{mutex};
      if (parts.erase(id) == 0)
        return; // already ended (a failure raced a reply)
      if (parts.empty())
        drained.notify_all();
    }
    if (outcome && part->group) {
      std::unique_lock lock{part->group->mutex};
      if (--part->group->remaining == 0 && part->group->finish)
        outcome = part->group->finish();
    }
    part->request.complete_part(std::move(outcome));
  }

  void on_reply(envelope& reply) {
    auto id = wire::request_id_of(reply.msg);
    auto part = find(id);
    if (!part)
      return; // a late reply to a request that already failed
    if (std::holds_alternative<wire::ack>(reply.msg)) {
      finish(id, part, ok());
    } else if (auto* failure = std::get_if<wire::error_reply>(&reply.msg)) {
      finish(id, part, error{from_wire(failure->code), part->what + ": " + failure->message});
    } else if (auto* value = std::get_if<wire::pull_reply>(&reply.msg)) {
      if (!part->assembly) {
        finish(id, part, error{errc::internal, part->what + ": unexpected pull reply"});
        return;
      }
      auto added = part->assembly->add(value->tensor);
      if (!added)
        finish(id, part, error{errc::malformed_message, part->what + ": " + added.error().message});
      else if (*added)
        finish(id, part, ok());
    } else {
      finish(
          id, part,
          error{errc::malformed_message,
                part->what + ": unexpected " + std::string{wire::kind_name(reply.msg)} + " reply"});
    }
  }

  void fail_all(const error& why) {
    std::map<std::uint64_t, std::shared_ptr<pending>> failed;
    {
      std::lock_guard lock{mutex};
      if (!failure)
        failure = why;
      failed.swap(parts);
      drained.notify_all();
    }
    for (auto& [id, part] : failed)
      part->request.complete_part(error{why.code(), part->what + ": " + why.message()});
  }

  bool wait_drained(std::chrono::milliseconds timeout) {
    std::unique_lock lock{mutex};
    return drained.wait_for(lock, timeout, [&] { return parts.empty(); });
  }
};

namespace {

caf::behavior reply_actor(caf::event_based_actor* self,
                          std::shared_ptr<dist_kvstore::reply_table> table) {
  return {
      [table](envelope& reply) { table->on_reply(reply); },
      // A server's connection closes when the scheduler ends the job after losing a node; its
      // notice naming the node (failure_reporter) usually comes first, and a moment's grace lets
      // it win the race before the bare "connection lost" is reported.
      [self](link_down_atom, std::uint64_t, std::string& reason) {
        self->delayed_send(self, std::chrono::milliseconds{250}, link_down_atom::value,
                           std::move(reason), true);
      },
      [table](link_down_atom, const std::string& reason, bool) {
        table->fail_all(error{errc::peer_lost, "the connection to a server was lost: " + reason});
      },
  };
}

bool known_type(const std::string& type) {
  return type == "dist_sync" || type == "dist_async" || type == "dist_device_sync" ||
         type == "dist_device_async" || type == "dist_sync_device" || type == "dist_async_device";
}

/// The flattened bytes [begin, end) elements of `array` (host memory).
std::span<const std::byte> element_bytes(const ndarray& array, std::int64_t begin,
                                         std::int64_t end) {
  auto size = size_of(array.dtype());
  return {static_cast<const std::byte*>(array.raw_data()) + begin * size,
          static_cast<std::size_t>(end - begin) * size};
}

wire::tensor_chunk slice_tensor(const ndarray& array, const key_slice& slice, bool whole) {
  wire::tensor_chunk tensor;
  tensor.type = to_wire(array.dtype());
  if (whole)
    tensor.shape.assign(array.shape().begin(), array.shape().end());
  else
    tensor.shape = {slice.size()};
  tensor.data = element_bytes(array, slice.begin, slice.end);
  tensor.total_bytes = tensor.data.size();
  tensor.offset = 0;
  return tensor;
}

/// Where the replies of one key's pull land: the one host output itself, or a staging buffer
/// copied to every output once the last of the key's slices has arrived.
struct pull_destination {
  ndarray target;
  std::shared_ptr<pull_group> group;
};

pull_destination destination_for(const key_declaration& declared, std::vector<ndarray> outputs,
                                 std::size_t slices) {
  pull_destination destination;
  destination.group = std::make_shared<pull_group>();
  destination.group->remaining = slices;
  bool direct = outputs.size() == 1 && outputs[0].ctx().is_cpu();
  destination.target =
      direct ? outputs[0] : ndarray::empty(declared.shape, context::cpu(), declared.type);
  if (!direct)
    destination.group->finish = [target = destination.target, outputs]() mutable {
      return status_of([&]() -> status {
        for (auto& out : outputs)
          target.copy_to(out);
        return ok();
      });
    };
  return destination;
}

} // namespace

/// Makes `part` reassemble its slice of the value into `destination`.
static void expect_value(dist_kvstore::pending& part, const pull_destination& destination,
                         const key_declaration& declared, const key_slice& slice, bool whole) {
  auto bytes = element_bytes(destination.target, slice.begin, slice.end);
  auto shape = whole ? std::vector<std::int64_t>(declared.shape.begin(), declared.shape.end())
                     : std::vector<std::int64_t>{slice.size()};
  part.assembly.emplace(std::span{const_cast<std::byte*>(bytes.data()), bytes.size()},
                        to_wire(declared.type), shape);
  part.hold = destination.target.keepalive();
  part.group = destination.group;
}

dist_kvstore::dist_kvstore(dist_kvstore_setup setup)
    : owned_resources_(setup.owned_resources), setup_(std::move(setup)),
      table_(std::make_shared<reply_table>()) {
  setup_.owned_resources.reset();
  if (setup_.type.find("device") != std::string::npos)
    comm_ = std::make_unique<comm_device>();
  else
    comm_ = std::make_unique<comm_host>();
}

result<std::unique_ptr<dist_kvstore>> dist_kvstore::create(caf::actor_system& system,
                                                           dist_kvstore_setup setup) {
  if (!known_type(setup.type))
    return error{errc::invalid_argument,
                 "unknown distributed kvstore type '" + setup.type +
                     "' (dist_sync, dist_async, dist_device_sync, dist_device_async)"};
  if (setup.num_servers == 0 || setup.num_workers == 0 || setup.rank >= setup.num_workers)
    return error{errc::invalid_argument,
                 "a distributed kvstore needs at least one server and one worker and a rank below "
                 "the number of workers (rank " +
                     std::to_string(setup.rank) + " of " + std::to_string(setup.num_workers) +
                     " workers, " + std::to_string(setup.num_servers) + " servers)"};
  if (setup.chunk_bytes < 8 || setup.chunk_bytes % 8 != 0)
    return error{errc::invalid_argument, "chunk size " + std::to_string(setup.chunk_bytes) +
                                             " is not a positive multiple of 8 bytes"};
  if (!setup.connect_servers || !setup.barrier)
    return error{errc::invalid_argument, "a distributed kvstore needs server links and a barrier"};
  std::unique_ptr<dist_kvstore> store{new dist_kvstore(std::move(setup))};
  store->system_ = &system;
  store->replies_ = system.spawn(reply_actor, store->table_);
  auto links = store->setup_.connect_servers(store->replies_);
  if (!links) {
    caf::anon_send_exit(store->replies_, caf::exit_reason::user_shutdown);
    store->finalized_ = true;
    return links.error();
  }
  if (links->size() != store->setup_.num_servers) {
    caf::anon_send_exit(store->replies_, caf::exit_reason::user_shutdown);
    store->finalized_ = true;
    return error{errc::invalid_argument,
                 "got " + std::to_string(links->size()) + " server links for " +
                     std::to_string(store->setup_.num_servers) + " servers"};
  }
  store->links_ = std::move(*links);
  if (store->setup_.rank == 0) {
    // Servers learn the job's consistency from rank 0, before any init of it reaches them.
    auto kind = store->sync_mode() ? wire::command_kind::sync_mode : wire::command_kind::async_mode;
    auto told = store->to_every_server(
        [&](std::uint64_t id, std::uint32_t) -> wire::message {
          return wire::command{id, kind, ""};
        },
        store->sync_mode() ? "set sync mode" : "set async mode");
    if (!told)
      return told.error();
  }
  return store;
}

dist_kvstore::~dist_kvstore() {
  (void)finalize();
}

bool dist_kvstore::sync_mode() const noexcept {
  return setup_.type.find("async") == std::string::npos;
}

std::optional<error> dist_kvstore::sticky_failure() const {
  std::lock_guard lock{table_->mutex};
  return table_->failure;
}

void dist_kvstore::fail(error why) {
  table_->fail_all(why);
}

std::function<void(error)> dist_kvstore::failure_reporter() const {
  return [table = table_](error why) { table->fail_all(why); };
}

void dist_kvstore::send(std::uint32_t server, envelope request, std::shared_ptr<pending> part) {
  table_->add(wire::request_id_of(request.msg), std::move(part));
  caf::anon_send(links_[server], std::move(request));
}

status dist_kvstore::init(std::span<const kv_key> keys, std::span<const ndarray> values) {
  if (auto checked = keys_.check_new(keys, values); !checked)
    return checked;
  for (const auto& key : keys)
    if (auto number = std::get_if<std::int64_t>(&key); number && *number < 0)
      return error{errc::invalid_argument,
                   "init of key " + to_string(key) + ": distributed stores take keys >= 0"};
  if (auto failed = sticky_failure())
    return *failed;
  keys_.declare(keys, values);
  if (setup_.rank == 0) {
    auto request = kv_request::start("init", 0, setup_.timeout);
    auto sent = status_of([&]() -> status {
      for (std::size_t i = 0; i < keys.size(); ++i) {
        auto index = keys_.find(keys[i], "init").value()->index;
        auto host_value = values[i].ctx().is_cpu() ? values[i] : values[i].copy_to(context::cpu());
        auto slices = place_key(static_cast<std::uint64_t>(index), host_value.size(),
                                setup_.num_servers, setup_.bigarray_bound);
        for (const auto& slice : slices) {
          auto id = next_request_id();
          wire::chunker chunks{
              wire::init{id, slice.ps_key, slice_tensor(host_value, slice, slices.size() == 1)},
              setup_.chunk_bytes};
          request.add_parts(1);
          auto part = std::make_shared<pending>();
          part->request = request;
          part->what =
              "init of key " + to_string(keys[i]) + " on server " + std::to_string(slice.server);
          part->server = slice.server;
          table_->add(id, part);
          for (std::size_t c = 0; c < chunks.chunk_count(); ++c)
            caf::anon_send(links_[slice.server],
                           envelope{chunks.chunk(c), host_value.keepalive(), 0});
        }
      }
      return ok();
    });
    if (!sent)
      return sent;
    if (auto done = request.wait(); !done)
      return done;
  }
  return setup_.barrier();
}

void dist_kvstore::start_push(const key_group& group, std::span<const ndarray> values,
                              bool then_pull, std::span<ndarray> outputs,
                              const kv_request& request) {
  const auto& declared = *group.declaration;
  std::vector<ndarray> list;
  for (auto position : group.positions)
    list.push_back(values[position]);
  // One host value goes out as it is (the caller leaves it alone until the request completes,
  // as kv_request says); a list is summed first, on the host or on the devices.
  ndarray merged =
      list.size() == 1 && list[0].ctx().is_cpu() ? list[0] : comm_->reduce(declared.index, list);
  if (!merged.ctx().is_cpu())
    merged = merged.copy_to(context::cpu());
  auto round = rounds_[declared.index]++;
  auto slices = place_key(static_cast<std::uint64_t>(declared.index), merged.size(),
                          setup_.num_servers, setup_.bigarray_bound);

  pull_destination destination;
  if (then_pull)
    destination = destination_for(declared, {outputs.begin(), outputs.end()}, slices.size());
  request.add_parts(slices.size());
  for (const auto& slice : slices) {
    auto id = next_request_id();
    auto tensor = slice_tensor(merged, slice, slices.size() == 1);
    wire::message whole;
    if (then_pull)
      whole = wire::pushpull{id, slice.ps_key, setup_.rank, round, tensor};
    else
      whole = wire::push{id, slice.ps_key, setup_.rank, round, tensor};
    auto part = std::make_shared<pending>();
    part->request = request;
    part->what = std::string{then_pull ? "pushpull" : "push"} + " of key " +
                 to_string(declared.key) + " to server " + std::to_string(slice.server);
    part->server = slice.server;
    if (then_pull)
      expect_value(*part, destination, declared, slice, slices.size() == 1);
    table_->add(id, part);
    wire::chunker chunks{std::move(whole), setup_.chunk_bytes};
    for (std::size_t c = 0; c < chunks.chunk_count(); ++c)
      caf::anon_send(links_[slice.server], envelope{chunks.chunk(c), merged.keepalive(), 0});
  }
}

void dist_kvstore::start_pull(const key_group& group, std::span<ndarray> outputs,
                              const kv_request& request) {
  const auto& declared = *group.declaration;
  std::vector<ndarray> outs;
  for (auto position : group.positions)
    outs.push_back(outputs[position]);
  auto slices = place_key(static_cast<std::uint64_t>(declared.index), element_count(declared.shape),
                          setup_.num_servers, setup_.bigarray_bound);
  auto destination = destination_for(declared, std::move(outs), slices.size());
  auto round = rounds_[declared.index];
  request.add_parts(slices.size());
  for (const auto& slice : slices) {
    auto id = next_request_id();
    auto part = std::make_shared<pending>();
    part->request = request;
    part->what =
        "pull of key " + to_string(declared.key) + " from server " + std::to_string(slice.server);
    part->server = slice.server;
    expect_value(*part, destination, declared, slice, slices.size() == 1);
    send(slice.server,
         envelope{wire::pull_request{id, slice.ps_key, setup_.rank, round}, nullptr, 0}, part);
  }
}

kv_request dist_kvstore::push_async(std::span<const kv_key> keys, std::span<const ndarray> values,
                                    int /*priority*/) {
  auto groups = keys_.group(keys, values, "push", "pushed value");
  if (!groups)
    return kv_request::done(groups.error());
  if (auto failed = sticky_failure())
    return kv_request::done(*failed);
  auto request = kv_request::start("push", 0, setup_.timeout);
  auto started = status_of([&]() -> status {
    for (const auto& group : *groups)
      start_push(group, values, false, {}, request);
    return ok();
  });
  return started ? request : kv_request::done(started);
}

kv_request dist_kvstore::pull_async(std::span<const kv_key> keys, std::span<ndarray> outputs,
                                    int /*priority*/) {
  auto groups = keys_.group(keys, outputs, "pull", "output");
  if (!groups)
    return kv_request::done(groups.error());
  if (auto failed = sticky_failure())
    return kv_request::done(*failed);
  auto request = kv_request::start("pull", 0, setup_.timeout);
  auto started = status_of([&]() -> status {
    for (const auto& group : *groups)
      start_pull(group, outputs, request);
    return ok();
  });
  return started ? request : kv_request::done(started);
}

kv_request dist_kvstore::pushpull_async(std::span<const kv_key> keys,
                                        std::span<const ndarray> values, std::span<ndarray> outputs,
                                        int /*priority*/) {
  auto groups = keys_.group(keys, values, "pushpull", "pushed value");
  if (!groups)
    return kv_request::done(groups.error());
  auto output_groups = keys_.group(keys, outputs, "pushpull", "output");
  if (!output_groups)
    return kv_request::done(output_groups.error());
  if (auto failed = sticky_failure())
    return kv_request::done(*failed);
  auto request = kv_request::start("pushpull", 0, setup_.timeout);
  auto started = status_of([&]() -> status {
    for (std::size_t g = 0; g < groups->size(); ++g) {
      std::vector<ndarray> outs;
      for (auto position : (*output_groups)[g].positions)
        outs.push_back(outputs[position]);
      start_push((*groups)[g], values, true, outs, request);
    }
    return ok();
  });
  return started ? request : kv_request::done(started);
}

status dist_kvstore::push(std::span<const kv_key> keys, std::span<const ndarray> values,
                          int priority) {
  return push_async(keys, values, priority).wait();
}

status dist_kvstore::pull(std::span<const kv_key> keys, std::span<ndarray> outputs, int priority) {
  return pull_async(keys, outputs, priority).wait();
}

status dist_kvstore::pushpull(std::span<const kv_key> keys, std::span<const ndarray> values,
                              std::span<ndarray> outputs, int priority) {
  return pushpull_async(keys, values, outputs, priority).wait();
}

status dist_kvstore::barrier() {
  if (auto failed = sticky_failure())
    return *failed;
  return setup_.barrier();
}

status dist_kvstore::to_every_server(
    const std::function<wire::message(std::uint64_t request_id, std::uint32_t server)>& make,
    const std::string& what) const {
  if (auto failed = sticky_failure())
    return *failed;
  auto request = kv_request::start(what, setup_.num_servers, setup_.timeout);
  auto* self = const_cast<dist_kvstore*>(this);
  for (std::uint32_t server = 0; server < setup_.num_servers; ++server) {
    auto id = self->next_request_id();
    auto part = std::make_shared<pending>();
    part->request = request;
    part->what = what + " on server " + std::to_string(server);
    part->server = server;
    self->send(server, envelope{make(id, server), nullptr, 0}, part);
  }
  return request.wait();
}

status dist_kvstore::set_optimizer(std::unique_ptr<optimizer> opt) {
  if (!opt)
    return error{errc::invalid_argument, "set_optimizer with no optimizer"};
  if (setup_.rank == 0) {
    std::vector<wire::optimizer_param> params;
    for (const auto& [name, value] : opt->params())
      params.push_back({name, value});
    auto sent = to_every_server(
        [&](std::uint64_t id, std::uint32_t) -> wire::message {
          return wire::set_optimizer{id, opt->name(), params};
        },
        "set_optimizer " + opt->name());
    if (!sent)
      return sent;
  }
  return setup_.barrier();
}

status dist_kvstore::set_updater(updater_function) {
  return error{errc::not_supported,
               "set_updater: a distributed kvstore runs updates on its servers; use "
               "set_optimizer, or pull the summed gradients and update on the worker"};
}

bool dist_kvstore::is_capable(std::string_view capability) const noexcept {
  return capability == "optimizer";
}

status dist_kvstore::save_optimizer_states(const std::string& path, bool) const {
  return to_every_server(
      [&](std::uint64_t id, std::uint32_t server) -> wire::message {
        return wire::command{id, wire::command_kind::save_checkpoint,
                             path + ".server" + std::to_string(server)};
      },
      "save_optimizer_states to " + path);
}

status dist_kvstore::load_optimizer_states(const std::string& path) {
  return to_every_server(
      [&](std::uint64_t id, std::uint32_t server) -> wire::message {
        return wire::command{id, wire::command_kind::load_checkpoint,
                             path + ".server" + std::to_string(server)};
      },
      "load_optimizer_states from " + path);
}

status dist_kvstore::finalize() {
  if (finalized_)
    return ok();
  finalized_ = true;
  status outcome;
  if (!table_->wait_drained(setup_.timeout))
    outcome = error{errc::timeout, "finalize: requests still under way after " +
                                       std::to_string(setup_.timeout.count()) + " ms"};
  if (setup_.on_finalize)
    setup_.on_finalize();
  for (auto& link : links_)
    caf::anon_send_exit(link, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(replies_, caf::exit_reason::user_shutdown);
  return outcome;
}

} // namespace troupe

#include "actors/kvstore/kvstore.hpp"

#include <array>

#include "actors/config/config.hpp"
#include "actors/kvstore/dist_kvstore.hpp"
#include "actors/kvstore/local_kvstore.hpp"
#include "engine/comm.hpp"

namespace troupe {

std::string to_string(const kv_key& key) {
  if (auto number = std::get_if<std::int64_t>(&key))
    return std::to_string(*number);
  return "'" + std::get<std::string>(key) + "'";
}

/// The caller's side of a request: dropping the last copy of an unfinished request cancels it.
struct kv_request::caller {
  caller(completion<status> o, std::string w, std::chrono::steady_clock::time_point d)
      : outcome(std::move(o)), what(std::move(w)), deadline(d) {}
  caller(const caller&) = delete;
  caller& operator=(const caller&) = delete;
  ~caller() { (void)outcome.cancel(); }

  completion<status> outcome;
  std::string what;
  std::chrono::steady_clock::time_point deadline;
};

kv_request kv_request::done(status outcome) {
  completion<status> finished;
  finished.deliver(std::move(outcome));
  return kv_request{std::make_shared<caller>(std::move(finished), std::string{},
                                             std::chrono::steady_clock::time_point{})};
}

kv_request::kv_request(completion<status> outcome, std::string what,
                       std::chrono::steady_clock::time_point deadline)
    : caller_(std::make_shared<caller>(std::move(outcome), std::move(what), deadline)) {}

status kv_request::wait() const {
  if (auto got = caller_->outcome.wait_or_cancel(caller_->deadline))
    return *got;
  return error{errc::timeout, caller_->what + " did not complete: the KVStore worker did not "
                                              "answer in time"};
}

bool kv_request::ready() const {
  return caller_->outcome.ready();
}

kv_request kvstore::push_async(std::span<const kv_key> keys, std::span<const ndarray> values,
                               int priority) {
  return kv_request::done(push(keys, values, priority));
}

kv_request kvstore::pull_async(std::span<const kv_key> keys, std::span<ndarray> outputs,
                               int priority) {
  return kv_request::done(pull(keys, outputs, priority));
}

kv_request kvstore::pushpull_async(std::span<const kv_key> keys, std::span<const ndarray> values,
                                   std::span<ndarray> outputs, int priority) {
  return kv_request::done(pushpull(keys, values, outputs, priority));
}

result<std::unique_ptr<kvstore>> kvstore::create(std::string_view type) {
  return create(type, config_overrides{});
}

result<std::unique_ptr<kvstore>> kvstore::create(std::string_view type,
                                                 const config_overrides& cluster_flags) {
  std::string name{type};
  // MXNet's aliases: local_update_cpu and local_allreduce_cpu reduce on the host,
  // local_allreduce_device on the devices.
  if (type == "local" || type == "local_update_cpu" || type == "local_allreduce_cpu")
    return std::unique_ptr<kvstore>{new local_kvstore(name, std::make_unique<comm_host>())};
  if (type == "device" || type == "local_allreduce_device")
    return std::unique_ptr<kvstore>{new local_kvstore(name, std::make_unique<comm_device>())};
  if (type.starts_with("dist"))
    return create_distributed(name, cluster_flags);
  return error{errc::invalid_argument,
               "unknown kvstore type '" + name +
                   "' (available: local, device, dist_sync, dist_async, dist_device_sync, "
                   "dist_device_async)"};
}

status kvstore::pushpull(std::span<const kv_key> keys, std::span<const ndarray> values,
                         std::span<ndarray> outputs, int priority) {
  if (auto pushed = push(keys, values, priority); !pushed)
    return pushed;
  return pull(keys, outputs, priority);
}

status kvstore::broadcast(std::span<const kv_key> keys, std::span<const ndarray> values,
                          std::span<ndarray> outputs, int priority) {
  if (auto initialised = init(keys, values); !initialised)
    return initialised;
  // One value per key initialises; the outputs name their keys by position like pull's.
  std::vector<kv_key> pulled_keys;
  if (outputs.size() == keys.size()) {
    pulled_keys.assign(keys.begin(), keys.end());
  } else if (keys.size() == 1) {
    pulled_keys.assign(outputs.size(), keys[0]);
  } else {
    return error{errc::invalid_argument, "broadcast of " + std::to_string(keys.size()) +
                                             " keys into " + std::to_string(outputs.size()) +
                                             " outputs"};
  }
  return pull(pulled_keys, outputs, priority);
}

result<std::vector<std::vector<double>>> kvstore::gather_at_barrier(std::span<const double> mine) {
  if (mine.size() > max_gathered_values)
    return error{errc::invalid_argument, "gather_at_barrier: " + std::to_string(mine.size()) +
                                             " values; at most " +
                                             std::to_string(max_gathered_values)};
  if (auto met = barrier(); !met)
    return met.error();
  return std::vector<std::vector<double>>{{mine.begin(), mine.end()}};
}

status kvstore::init(const kv_key& key, const ndarray& value) {
  return init(std::span{&key, 1}, std::span{&value, 1});
}

status kvstore::push(const kv_key& key, const ndarray& value, int priority) {
  return push(std::span{&key, 1}, std::span{&value, 1}, priority);
}

status kvstore::push(const kv_key& key, std::span<const ndarray> values, int priority) {
  if (values.empty())
    return error{errc::empty_list, "push of key " + to_string(key) + " with an empty list"};
  std::vector<kv_key> keys(values.size(), key);
  return push(keys, values, priority);
}

status kvstore::push(const kv_key& key, std::initializer_list<ndarray> values, int priority) {
  return push(key, std::span<const ndarray>{values.begin(), values.size()}, priority);
}

status kvstore::pull(const kv_key& key, ndarray& output, int priority) {
  return pull(std::span{&key, 1}, std::span{&output, 1}, priority);
}

status kvstore::pull(const kv_key& key, std::span<ndarray> outputs, int priority) {
  if (outputs.empty())
    return error{errc::empty_list, "pull of key " + to_string(key) + " into an empty list"};
  std::vector<kv_key> keys(outputs.size(), key);
  return pull(keys, outputs, priority);
}

status kvstore::pushpull(const kv_key& key, const ndarray& value, ndarray& output, int priority) {
  return pushpull(key, std::span{&value, 1}, std::span{&output, 1}, priority);
}

status kvstore::pushpull(const kv_key& key, std::span<const ndarray> values,
                         std::span<ndarray> outputs, int priority) {
  if (auto pushed = push(key, values, priority); !pushed)
    return pushed;
  return pull(key, outputs, priority);
}

status kvstore::broadcast(const kv_key& key, const ndarray& value, ndarray& output, int priority) {
  return broadcast(key, value, std::span{&output, 1}, priority);
}

status kvstore::broadcast(const kv_key& key, const ndarray& value, std::span<ndarray> outputs,
                          int priority) {
  if (outputs.empty())
    return error{errc::empty_list, "broadcast of key " + to_string(key) + " into an empty list"};
  return broadcast(std::span{&key, 1}, std::span{&value, 1}, outputs, priority);
}

namespace {

error no_row_sparse(const std::string& type, std::string_view call) {
  return error{errc::not_supported, std::string{call} + ": a kvstore of type " + type +
                                        " does not take row_sparse keys"};
}

} // namespace

status kvstore::init(std::span<const kv_key>, std::span<const row_sparse_array>) {
  return no_row_sparse(type(), "init of row_sparse values");
}

status kvstore::push(std::span<const kv_key>, std::span<const row_sparse_array>, int) {
  return no_row_sparse(type(), "push of row_sparse values");
}

status kvstore::row_sparse_pull(std::span<const kv_key>, std::span<row_sparse_array>,
                                std::span<const ndarray>, int) {
  return no_row_sparse(type(), "row_sparse_pull");
}

status kvstore::set_row_updater(row_updater_function) {
  return error{errc::not_supported,
               "set_row_updater: kvstore '" + type() + "' runs no custom updater"};
}

status kvstore::init(const kv_key& key, const row_sparse_array& value) {
  return init(std::span{&key, 1}, std::span{&value, 1});
}

status kvstore::push(const kv_key& key, const row_sparse_array& value, int priority) {
  return push(std::span{&key, 1}, std::span{&value, 1}, priority);
}

status kvstore::row_sparse_pull(const kv_key& key, row_sparse_array& output, const ndarray& row_ids,
                                int priority) {
  return row_sparse_pull(std::span{&key, 1}, std::span{&output, 1}, std::span{&row_ids, 1},
                         priority);
}

status kvstore::set_gradient_compression(const gradient_compression&) {
  return error{errc::not_supported,
               "set_gradient_compression: a kvstore of type " + type() +
                   " does not compress (MXNet refuses it too); use device or a dist_ type"};
}

status kvstore::set_gradient_compression(std::string_view type, std::optional<double> threshold,
                                         bool pulls) {
  auto rule = gradient_compression::make(type, threshold);
  if (!rule)
    return rule.error();
  rule->pulls = pulls && rule->enabled();
  return set_gradient_compression(*rule);
}

status kvstore::set_optimizer(std::string_view name, const optimizer_params& params) {
  auto created = optimizer::create(name, params);
  if (!created)
    return created.error();
  return set_optimizer(std::move(*created));
}

} // namespace troupe

#include "actors/kvstore/local_kvstore.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "engine/serialize.hpp"

namespace troupe {

local_kvstore::local_kvstore(std::string type, std::unique_ptr<comm> reduction)
    : type_(std::move(type)), comm_(std::move(reduction)) {}

status local_kvstore::init(std::span<const kv_key> keys, std::span<const ndarray> values) {
  // The whole batch is checked first, so that a bad pair initialises nothing.
  if (auto checked = keys_.check_new(keys, values); !checked)
    return checked;
  return status_of([&]() -> status {
    std::vector<ndarray> copies;
    for (const auto& value : values)
      copies.push_back(value.copy_to(context::cpu()));
    keys_.declare(keys, values);
    for (std::size_t i = 0; i < keys.size(); ++i)
      stored_[keys_.find(keys[i], "init").value()->index] = std::move(copies[i]);
    return ok();
  });
}

status local_kvstore::push(std::span<const kv_key> keys, std::span<const ndarray> values,
                           int /*priority: one thread, nothing to reorder*/) {
  auto groups = keys_.group(keys, values, "push", "pushed value");
  if (!groups)
    return groups.error();
  return status_of([&]() -> status {
    for (const auto& group : *groups) {
      std::vector<ndarray> list;
      for (auto position : group.positions)
        list.push_back(values[position]);
      auto index = group.declaration->index;
      auto& target = stored_.at(index);
      if (compression_.enabled() && compressible(target.dtype()))
        compress_values(index, list);
      const ndarray& merged = comm_->reduce(index, list);
      // The key moves to the context its sum is made on (MXNet moves it to the merge GPU): its
      // update then runs on that context's device actor, and keys merged on different contexts
      // update concurrently.
      if (merged.ctx() != target.ctx())
        target = target.copy_to(merged.ctx());
      if (updater_)
        (*updater_)(index, merged, target);
      else if (custom_updater_)
        custom_updater_(group.declaration->key, merged, target);
      else
        merged.copy_to(target);
    }
    return ok();
  });
}

status local_kvstore::pull(std::span<const kv_key> keys, std::span<ndarray> outputs,
                           int /*priority*/) {
  auto groups = keys_.group(keys, outputs, "pull", "output");
  if (!groups)
    return groups.error();
  return status_of([&]() -> status {
    for (const auto& group : *groups)
      for (auto position : group.positions)
        comm_->broadcast(stored_.at(group.declaration->index), outputs.subspan(position, 1));
    return ok();
  });
}

status local_kvstore::init(std::span<const kv_key> keys, std::span<const row_sparse_array> values) {
  auto checked_values = keys_.check_new(keys, values);
  if (!checked_values)
    return checked_values.error();
  auto& dense = *checked_values;
  return status_of([&]() -> status {
    keys_.declare(keys, dense, true);
    for (std::size_t i = 0; i < keys.size(); ++i)
      stored_[keys_.find(keys[i], "init").value()->index] = std::move(dense[i]);
    return ok();
  });
}

status local_kvstore::push(std::span<const kv_key> keys, std::span<const row_sparse_array> values,
                           int /*priority*/) {
  // Every pair is checked before any key changes; a key named twice sums its values.
  auto groups = keys_.group_rows(keys, values, "push", compression_.enabled());
  if (!groups)
    return groups.error();
  return status_of([&]() -> status {
    for (const auto& group : *groups) {
      const auto index = group.declaration->index;
      auto merged = sum_rows(group.values);
      auto& target = stored_.at(index);
      if (updater_)
        updater_->update_rows(index, merged, target);
      else if (custom_row_updater_)
        custom_row_updater_(group.declaration->key, merged, target);
      else if (custom_updater_)
        custom_updater_(group.declaration->key, merged.to_dense(), target);
      else
        target = merged.to_dense();
    }
    return ok();
  });
}

status local_kvstore::row_sparse_pull(std::span<const kv_key> keys,
                                      std::span<row_sparse_array> outputs,
                                      std::span<const ndarray> row_ids, int /*priority*/) {
  auto requests = keys_.rows_to_pull(keys, outputs.size(), row_ids);
  if (!requests)
    return requests.error();
  std::vector<row_sparse_array> pulled;
  for (const auto& request : *requests) {
    // Every row asked for, from the stored value (zero where nothing was stored).
    auto made =
        row_sparse_array::from_dense_rows(stored_.at(request.declaration->index), request.rows);
    if (!made)
      return made.error();
    pulled.push_back(std::move(*made));
  }
  for (std::size_t i = 0; i < keys.size(); ++i)
    outputs[i] = std::move(pulled[i]);
  return ok();
}

status local_kvstore::set_optimizer(std::unique_ptr<optimizer> opt) {
  if (!opt)
    return error{errc::invalid_argument, "set_optimizer with no optimizer"};
  updater_ = std::make_unique<troupe::updater>(std::move(opt));
  custom_updater_ = nullptr;
  custom_row_updater_ = nullptr;
  return ok();
}

status local_kvstore::set_updater(updater_function update) {
  if (!update)
    return error{errc::invalid_argument, "set_updater with an empty function"};
  custom_updater_ = std::move(update);
  custom_row_updater_ = nullptr; // a row updater set after this one goes with it
  updater_.reset();
  return ok();
}

status local_kvstore::set_row_updater(row_updater_function update) {
  if (!update)
    return error{errc::invalid_argument, "set_row_updater with an empty function"};
  custom_row_updater_ = std::move(update);
  updater_.reset();
  return ok();
}

bool local_kvstore::is_capable(std::string_view capability) const noexcept {
  return capability == "optimizer";
}

status local_kvstore::save_optimizer_states(const std::string& path, bool dump_optimizer) const {
  if (!updater_)
    return error{errc::invalid_argument,
                 "save_optimizer_states needs an optimizer set with set_optimizer"};
  return write_file(path, updater_->save_states(dump_optimizer));
}

status local_kvstore::load_optimizer_states(const std::string& path) {
  if (!updater_)
    return error{errc::invalid_argument,
                 "load_optimizer_states needs an optimizer set with set_optimizer"};
  auto bytes = read_file(path);
  if (!bytes)
    return bytes.error();
  auto shape_of = [this](std::int64_t index) -> std::optional<shape_vector> {
    auto found = stored_.find(index);
    if (found == stored_.end())
      return std::nullopt;
    return found->second.shape();
  };
  if (auto loaded = updater_->load_states(*bytes, shape_of); !loaded)
    return error{loaded.error().code(), path + ": " + loaded.error().message()};
  return ok();
}

status local_kvstore::set_gradient_compression(const gradient_compression& rule) {
  if (type_.find("device") == std::string::npos)
    return kvstore::set_gradient_compression(rule);
  if (rule.pulls)
    return error{errc::not_supported,
                 "set_gradient_compression: compressed pulls are for dist_ stores, whose servers "
                 "answer over a link; a " +
                     type_ + " store's pulls copy the merged value"};
  compression_ = rule;
  return ok();
}

void local_kvstore::compress_values(std::int64_t index, std::vector<ndarray>& list) {
  auto& residuals = residuals_[index];
  if (residuals.size() < list.size())
    residuals.resize(list.size());
  std::vector<std::byte> packed;
  for (std::size_t i = 0; i < list.size(); ++i) {
    // Quantized on the host: a value on a GPU is copied there and its dequantized value back.
    auto host = list[i].ctx().is_cpu() ? list[i] : list[i].copy_to(context::cpu());
    const auto elements = static_cast<std::size_t>(host.size());
    if (residuals[i].size() != elements)
      residuals[i].assign(elements, 0.0f);
    packed.resize(packed_bytes(compression_.type, elements));
    quantize(compression_, host.dtype(), host.raw_data(), residuals[i].data(), packed.data(),
             elements);
    auto sent = ndarray::empty(host.shape(), context::cpu(), host.dtype());
    dequantize(compression_, host.dtype(), packed.data(), sent.raw_data(), elements);
    list[i] = list[i].ctx().is_cpu() ? std::move(sent) : sent.copy_to(list[i].ctx());
  }
}

} // namespace troupe

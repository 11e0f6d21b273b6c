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

namespace {

/// The declaration of row_sparse key `key` for `operation`, with `value`'s shape and dtype.
result<const key_declaration*> row_sparse_key(const key_registry& keys, const kv_key& key,
                                              const row_sparse_array& value,
                                              std::string_view operation) {
  auto declared = keys.find(key, operation);
  if (!declared)
    return declared.error();
  const auto prefix = std::string{operation} + " of key " + to_string(key) + ": ";
  if (!(*declared)->row_sparse)
    return error{errc::invalid_argument,
                 prefix + "the key is dense (initialised with a dense value); push dense values "
                          "and pull it"};
  if (value.none())
    return error{errc::invalid_argument, prefix + "an empty row_sparse array"};
  if (value.shape() != (*declared)->shape)
    return error{errc::shape_mismatch, prefix + "row_sparse value of shape " +
                                           shape_to_string(value.shape()) + ", init declared " +
                                           shape_to_string((*declared)->shape)};
  if (value.dtype() != (*declared)->type)
    return error{errc::dtype_mismatch,
                 prefix + "row_sparse value of dtype " + std::string{to_string(value.dtype())} +
                     ", init declared " + std::string{to_string((*declared)->type)}};
  return *declared;
}

/// The sum of `values` (one shape and dtype) over the union of their rows, summed in float32 and
/// rounded once to their dtype.
row_sparse_array sum_rows(std::span<const row_sparse_array* const> values) {
  const auto& first = *values.front();
  std::vector<std::int64_t> rows;
  for (const auto* value : values)
    rows.insert(rows.end(), value->indices().begin(), value->indices().end());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  const auto width = static_cast<std::size_t>(first.row_elements());
  std::vector<float> sum(rows.size() * width, 0.0f);
  for (const auto* value : values) {
    if (value->stored_rows() == 0 || width == 0)
      continue;
    const auto data = value->data().as_type(dtype::float32).to_vector<float>();
    std::size_t at = 0;
    for (std::size_t i = 0; i < value->stored_rows(); ++i) {
      while (rows[at] < value->indices()[i])
        ++at;
      for (std::size_t e = 0; e < width; ++e)
        sum[at * width + e] += data[i * width + e];
    }
  }
  shape_vector data_shape = first.shape();
  data_shape[0] = static_cast<std::int64_t>(rows.size());
  auto data = ndarray::from_values(sum, data_shape).as_type(first.dtype());
  return row_sparse_array::from_rows(data, rows, first.shape()).value();
}

} // namespace

status local_kvstore::init(std::span<const kv_key> keys, std::span<const row_sparse_array> values) {
  std::vector<ndarray> dense;
  for (const auto& value : values) {
    if (value.none())
      return error{errc::invalid_argument, "init with an empty row_sparse array"};
    dense.push_back(value.to_dense());
  }
  if (auto checked = keys_.check_new(keys, dense); !checked)
    return checked;
  return status_of([&]() -> status {
    keys_.declare(keys, dense, true);
    for (std::size_t i = 0; i < keys.size(); ++i)
      stored_[keys_.find(keys[i], "init").value()->index] = std::move(dense[i]);
    return ok();
  });
}

status local_kvstore::push(std::span<const kv_key> keys, std::span<const row_sparse_array> values,
                           int /*priority*/) {
  if (keys.size() != values.size())
    return error{errc::invalid_argument, "push with " + std::to_string(keys.size()) + " keys and " +
                                             std::to_string(values.size()) + " row_sparse values"};
  if (keys.empty())
    return error{errc::empty_list, "push with an empty list"};
  // Every pair is checked before any key changes; a key named twice sums its values.
  std::map<std::int64_t, std::vector<const row_sparse_array*>> lists;
  std::vector<std::int64_t> order;
  std::map<std::int64_t, const key_declaration*> declared;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto found = row_sparse_key(keys_, keys[i], values[i], "push");
    if (!found)
      return found.error();
    if (compression_.enabled())
      return error{errc::not_supported,
                   "push of key " + to_string(keys[i]) +
                       ": row_sparse values are not compressed (MXNet refuses it too); "
                       "set_gradient_compression(\"none\") first"};
    auto index = (*found)->index;
    if (lists[index].empty())
      order.push_back(index);
    lists[index].push_back(&values[i]);
    declared[index] = *found;
  }
  return status_of([&]() -> status {
    for (auto index : order) {
      auto merged = sum_rows(lists[index]);
      auto& target = stored_.at(index);
      if (updater_)
        updater_->update_rows(index, merged, target);
      else if (custom_updater_)
        custom_updater_(declared[index]->key, merged.to_dense(), target);
      else
        target = merged.to_dense();
    }
    return ok();
  });
}

status local_kvstore::row_sparse_pull(std::span<const kv_key> keys,
                                      std::span<row_sparse_array> outputs,
                                      std::span<const ndarray> row_ids, int /*priority*/) {
  if (keys.size() != outputs.size() || keys.size() != row_ids.size())
    return error{errc::invalid_argument, "row_sparse_pull with " + std::to_string(keys.size()) +
                                             " keys, " + std::to_string(outputs.size()) +
                                             " outputs and " + std::to_string(row_ids.size()) +
                                             " row id arrays"};
  if (keys.empty())
    return error{errc::empty_list, "row_sparse_pull with an empty list"};
  std::vector<row_sparse_array> pulled;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto declared = keys_.find(keys[i], "row_sparse_pull");
    if (!declared)
      return declared.error();
    const auto what = "row_sparse_pull of key " + to_string(keys[i]);
    if (!(*declared)->row_sparse)
      return error{errc::invalid_argument,
                   what + ": the key is dense (initialised with a dense value); pull it"};
    auto ids = unique_row_ids(row_ids[i], (*declared)->shape[0], what + ": row_ids");
    if (!ids)
      return ids.error();
    // Every row asked for, from the stored value (zero where nothing was stored).
    auto made = row_sparse_array::from_dense_rows(stored_.at((*declared)->index), *ids);
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
  return ok();
}

status local_kvstore::set_updater(updater_function update) {
  if (!update)
    return error{errc::invalid_argument, "set_updater with an empty function"};
  custom_updater_ = std::move(update);
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

#include "actors/kvstore/key_registry.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace troupe {
namespace {

std::string_view kind_text(bool integer) {
  return integer ? "ints" : "strings";
}

} // namespace

status key_registry::check_new(std::span<const kv_key> keys,
                               std::span<const ndarray> values) const {
  if (keys.size() != values.size())
    return error{errc::invalid_argument, "init with " + std::to_string(keys.size()) + " keys and " +
                                             std::to_string(values.size()) + " values"};
  if (keys.empty())
    return error{errc::empty_list, "init with an empty list of keys"};
  auto kind = kind_;
  // A hash of the batch's keys, not a scan of those before: inits of 10,000 keys are common.
  std::unordered_set<kv_key> seen;
  seen.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto this_kind = kind_of(keys[i]);
    if (kind != key_kind::none && this_kind != kind)
      return error{errc::key_type_mix, "init of key " + to_string(keys[i]) +
                                           ": int and string keys cannot be mixed in one store"};
    kind = this_kind;
    if (find(keys[i], "init").has_value())
      return error{errc::already_initialized,
                   "init of key " + to_string(keys[i]) + ", which is already initialised"};
    if (!seen.insert(keys[i]).second)
      return error{errc::already_initialized,
                   "init lists key " + to_string(keys[i]) + " more than once"};
    if (values[i].is_none())
      return error{errc::invalid_argument,
                   "init of key " + to_string(keys[i]) + " with an empty handle"};
  }
  return ok();
}

void key_registry::declare(std::span<const kv_key> keys, std::span<const ndarray> values,
                           bool row_sparse) {
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::int64_t index;
    if (auto number = std::get_if<std::int64_t>(&keys[i])) {
      index = *number;
    } else {
      index = next_name_index_++;
      names_.emplace(std::get<std::string>(keys[i]), index);
    }
    kind_ = kind_of(keys[i]);
    by_index_[index] =
        key_declaration{keys[i], index, values[i].shape(), values[i].dtype(), row_sparse};
  }
}

result<const key_declaration*> key_registry::find(const kv_key& key,
                                                  std::string_view operation) const {
  auto kind = kind_of(key);
  if (kind_ != key_kind::none && kind != kind_)
    return error{errc::key_type_mix, std::string{operation} + " of key " + to_string(key) +
                                         ": this store's keys are " +
                                         std::string{kind_text(kind_ == key_kind::integer)} +
                                         "; int and string keys cannot be mixed in one store"};
  if (auto number = std::get_if<std::int64_t>(&key)) {
    if (auto found = by_index_.find(*number); found != by_index_.end())
      return &found->second;
  } else if (auto name = names_.find(std::get<std::string>(key)); name != names_.end()) {
    return &by_index_.at(name->second);
  }
  return error{errc::unknown_key, std::string{operation} + " of key " + to_string(key) +
                                      ", which was never initialised"};
}

status key_registry::check_like(const key_declaration& declared, const ndarray& given,
                                std::string_view operation, std::string_view role) {
  // Built only for an error: a call of 10,000 keys that pass costs no string.
  auto prefix = [&] {
    return std::string{operation} + " of key " + to_string(declared.key) + ": ";
  };
  if (given.is_none())
    return error{errc::invalid_argument,
                 prefix() + "the " + std::string{role} + " is an empty handle"};
  if (given.shape() != declared.shape)
    return error{errc::shape_mismatch, prefix() + std::string{role} + " has shape " +
                                           shape_to_string(given.shape()) + ", init declared " +
                                           shape_to_string(declared.shape)};
  if (given.dtype() != declared.type)
    return error{errc::dtype_mismatch, prefix() + std::string{role} + " has dtype " +
                                           std::string{to_string(given.dtype())} +
                                           ", init declared " +
                                           std::string{to_string(declared.type)}};
  return ok();
}

result<std::vector<key_group>> key_registry::group(std::span<const kv_key> keys,
                                                   std::span<const ndarray> arrays,
                                                   std::string_view operation,
                                                   std::string_view role) const {
  if (keys.size() != arrays.size())
    return error{errc::invalid_argument, std::string{operation} + " with " +
                                             std::to_string(keys.size()) + " keys and " +
                                             std::to_string(arrays.size()) + " arrays"};
  if (keys.empty())
    return error{errc::empty_list, std::string{operation} + " with an empty list"};
  std::vector<key_group> groups;
  groups.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto declared = find(keys[i], operation);
    if (!declared)
      return declared.error();
    if ((*declared)->row_sparse)
      return error{errc::invalid_argument,
                   std::string{operation} + " of key " + to_string(keys[i]) +
                       ": the key is row_sparse (initialised with a row_sparse value); push "
                       "row_sparse values and use row_sparse_pull (MXNet's rule)"};
    if (auto like = check_like(**declared, arrays[i], operation, role); !like)
      return like.error();
    groups.push_back({*declared, {i}});
  }
  if (groups.size() < 2)
    return groups;
  // Most calls name each key once: sorted pointers show it without a node per key, which a hash
  // of 10,000 keys allocated.
  std::vector<const key_declaration*> named;
  named.reserve(groups.size());
  for (const auto& group : groups)
    named.push_back(group.declaration);
  std::sort(named.begin(), named.end());
  if (std::adjacent_find(named.begin(), named.end()) == named.end())
    return groups;
  // A key named again joins its first group, in the order the call lists them.
  std::vector<key_group> merged;
  std::unordered_map<const key_declaration*, std::size_t> group_of;
  group_of.reserve(groups.size());
  for (auto& group : groups) {
    auto [slot, fresh] = group_of.try_emplace(group.declaration, merged.size());
    if (fresh)
      merged.push_back(std::move(group));
    else
      merged[slot->second].positions.push_back(group.positions.front());
  }
  return merged;
}

result<const key_declaration*> key_registry::find_row_sparse(const kv_key& key,
                                                             const row_sparse_array& value,
                                                             std::string_view operation) const {
  auto declared = find(key, operation);
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

result<std::vector<ndarray>>
key_registry::check_new(std::span<const kv_key> keys,
                        std::span<const row_sparse_array> values) const {
  std::vector<ndarray> dense;
  for (const auto& value : values) {
    if (value.none())
      return error{errc::invalid_argument, "init with an empty row_sparse array"};
    dense.push_back(value.to_dense());
  }
  if (auto checked = check_new(keys, dense); !checked)
    return checked.error();
  return dense;
}

result<std::vector<rows_request>>
key_registry::rows_to_pull(std::span<const kv_key> keys, std::size_t outputs,
                           std::span<const ndarray> row_ids) const {
  if (keys.size() != outputs || keys.size() != row_ids.size())
    return error{errc::invalid_argument, "row_sparse_pull with " + std::to_string(keys.size()) +
                                             " keys, " + std::to_string(outputs) + " outputs and " +
                                             std::to_string(row_ids.size()) + " row id arrays"};
  if (keys.empty())
    return error{errc::empty_list, "row_sparse_pull with an empty list"};
  std::vector<rows_request> requests;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto declared = find(keys[i], "row_sparse_pull");
    if (!declared)
      return declared.error();
    const auto what = "row_sparse_pull of key " + to_string(keys[i]);
    if (!(*declared)->row_sparse)
      return error{errc::invalid_argument,
                   what + ": the key is dense (initialised with a dense value); pull it"};
    auto ids = unique_row_ids(row_ids[i], (*declared)->shape[0], what + ": row_ids");
    if (!ids)
      return ids.error();
    requests.push_back({*declared, std::move(*ids)});
  }
  return requests;
}

result<std::vector<row_sparse_group>>
key_registry::group_rows(std::span<const kv_key> keys, std::span<const row_sparse_array> values,
                         std::string_view operation, bool compressed) const {
  if (keys.size() != values.size())
    return error{errc::invalid_argument, std::string{operation} + " with " +
                                             std::to_string(keys.size()) + " keys and " +
                                             std::to_string(values.size()) + " row_sparse values"};
  if (keys.empty())
    return error{errc::empty_list, std::string{operation} + " with an empty list"};
  std::vector<row_sparse_group> groups;
  std::map<std::int64_t, std::size_t> group_of;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto found = find_row_sparse(keys[i], values[i], operation);
    if (!found)
      return found.error();
    if (compressed)
      return error{errc::not_supported,
                   std::string{operation} + " of key " + to_string(keys[i]) +
                       ": row_sparse values are not compressed (MXNet refuses it too); "
                       "set_gradient_compression(\"none\") first"};
    auto [at, added] = group_of.try_emplace((*found)->index, groups.size());
    if (added)
      groups.push_back({*found, {}});
    groups[at->second].values.push_back(&values[i]);
  }
  return groups;
}

} // namespace troupe

#include "actors/local_kvstore.hpp"

#include <algorithm>
#include <utility>

#include "engine/serialize.hpp"

namespace troupe {
namespace {

/// Runs `body`, turning a troupe::exception from the engine into the status it carries, so that
/// no exception crosses the KVStore interface.
template <class Body>
status guarded(Body&& body) {
  try {
    return body();
  } catch (const exception& failure) {
    return failure.error();
  } catch (const std::exception& failure) {
    return error{errc::internal, failure.what()};
  }
}

status count_mismatch(std::string_view operation, std::size_t keys, std::size_t values,
                      std::string_view what) {
  return error{errc::invalid_argument, std::string{operation} + " with " + std::to_string(keys) +
                                           " keys and " + std::to_string(values) + " " +
                                           std::string{what}};
}

} // namespace

local_kvstore::local_kvstore(std::string type, std::unique_ptr<comm> reduction)
    : type_(std::move(type)), comm_(std::move(reduction)) {}

status local_kvstore::check_kind(const kv_key& key) const {
  auto kind = std::holds_alternative<std::int64_t>(key) ? key_kind::integer : key_kind::text;
  if (kind_ != key_kind::none && kind != kind_)
    return error{errc::key_type_mix, "key " + to_string(key) + " is " +
                                         (kind == key_kind::integer ? "an int" : "a string") +
                                         " but this store's keys are " +
                                         (kind_ == key_kind::integer ? "ints" : "strings") +
                                         "; int and string keys cannot be mixed in one store"};
  return ok();
}

result<std::int64_t> local_kvstore::find(const kv_key& key, std::string_view operation) const {
  if (auto kind = check_kind(key); !kind)
    return kind.error();
  if (auto number = std::get_if<std::int64_t>(&key)) {
    if (entries_.contains(*number))
      return *number;
  } else if (auto slot = names_.find(std::get<std::string>(key)); slot != names_.end()) {
    return slot->second;
  }
  return error{errc::unknown_key, std::string{operation} + " of key " + to_string(key) +
                                      ", which was never initialised"};
}

status local_kvstore::check_like(const entry& declared, const ndarray& given,
                                 std::string_view operation, std::string_view role) {
  if (given.is_none())
    return error{errc::invalid_argument, std::string{operation} + " of key " +
                                             to_string(declared.key) + ": the " +
                                             std::string{role} + " is an empty handle"};
  if (given.shape() != declared.stored.shape())
    return error{errc::shape_mismatch,
                 std::string{operation} + " of key " + to_string(declared.key) + ": " +
                     std::string{role} + " has shape " + shape_to_string(given.shape()) +
                     ", init declared " + shape_to_string(declared.stored.shape())};
  if (given.dtype() != declared.stored.dtype())
    return error{errc::dtype_mismatch,
                 std::string{operation} + " of key " + to_string(declared.key) + ": " +
                     std::string{role} + " has dtype " + std::string{to_string(given.dtype())} +
                     ", init declared " + std::string{to_string(declared.stored.dtype())}};
  return ok();
}

status local_kvstore::init(std::span<const kv_key> keys, std::span<const ndarray> values) {
  if (keys.size() != values.size())
    return count_mismatch("init", keys.size(), values.size(), "values");
  if (keys.empty())
    return error{errc::empty_list, "init with an empty list of keys"};
  // Check the whole batch first, so that a bad pair initialises nothing.
  auto kind = kind_;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto this_kind =
        std::holds_alternative<std::int64_t>(keys[i]) ? key_kind::integer : key_kind::text;
    if (kind != key_kind::none && this_kind != kind)
      return error{errc::key_type_mix, "init of key " + to_string(keys[i]) +
                                           ": int and string keys cannot be mixed in one store"};
    kind = this_kind;
    if (find(keys[i], "init").has_value())
      return error{errc::already_initialized,
                   "init of key " + to_string(keys[i]) + ", which is already initialised"};
    for (std::size_t j = 0; j < i; ++j)
      if (keys[j] == keys[i])
        return error{errc::already_initialized,
                     "init lists key " + to_string(keys[i]) + " more than once"};
    if (values[i].is_none())
      return error{errc::invalid_argument,
                   "init of key " + to_string(keys[i]) + " with an empty handle"};
  }
  return guarded([&]() -> status {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      std::int64_t index;
      if (auto number = std::get_if<std::int64_t>(&keys[i])) {
        index = *number;
      } else {
        index = next_name_index_++;
        names_[std::get<std::string>(keys[i])] = index;
      }
      entries_[index] = entry{keys[i], values[i].copy_to(context::cpu())};
    }
    kind_ = kind;
    return ok();
  });
}

status local_kvstore::push(std::span<const kv_key> keys, std::span<const ndarray> values,
                           int /*priority: one thread, nothing to reorder*/) {
  if (keys.size() != values.size())
    return count_mismatch("push", keys.size(), values.size(), "values");
  if (keys.empty())
    return error{errc::empty_list, "push with an empty list"};
  // Group the values by key, in first-appearance order, checking every one before any update.
  std::vector<std::pair<std::int64_t, std::vector<ndarray>>> groups;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto index = find(keys[i], "push");
    if (!index)
      return index.error();
    if (auto like = check_like(entries_.at(*index), values[i], "push", "pushed value"); !like)
      return like;
    auto group = std::find_if(groups.begin(), groups.end(),
                              [&](const auto& candidate) { return candidate.first == *index; });
    if (group == groups.end())
      groups.emplace_back(*index, std::vector<ndarray>{values[i]});
    else
      group->second.push_back(values[i]);
  }
  return guarded([&]() -> status {
    for (auto& [index, list] : groups) {
      auto& target = entries_.at(index);
      const ndarray& merged = comm_->reduce(index, list);
      if (updater_) {
        (*updater_)(index, merged, target.stored);
      } else if (custom_updater_) {
        custom_updater_(target.key, merged, target.stored);
      } else {
        merged.copy_to(target.stored);
      }
    }
    return ok();
  });
}

status local_kvstore::pull(std::span<const kv_key> keys, std::span<ndarray> outputs,
                           int /*priority*/) {
  if (keys.size() != outputs.size())
    return count_mismatch("pull", keys.size(), outputs.size(), "outputs");
  if (keys.empty())
    return error{errc::empty_list, "pull with an empty list"};
  std::vector<std::int64_t> indices;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto index = find(keys[i], "pull");
    if (!index)
      return index.error();
    if (auto like = check_like(entries_.at(*index), outputs[i], "pull", "output"); !like)
      return like;
    indices.push_back(*index);
  }
  return guarded([&]() -> status {
    for (std::size_t i = 0; i < keys.size(); ++i)
      comm_->broadcast(entries_.at(indices[i]).stored, outputs.subspan(i, 1));
    return ok();
  });
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
  if (auto loaded = updater_->load_states(*bytes); !loaded)
    return error{loaded.error().code(), path + ": " + loaded.error().message()};
  return ok();
}

} // namespace troupe

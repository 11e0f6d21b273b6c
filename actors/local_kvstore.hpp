#pragma once
// The single-process KVStore behind `local` and `device` (MXNet's KVStoreLocal): stored values
// live on cpu(0); the pushed lists are reduced by a comm strategy (engine/comm.hpp) and then
// either replace the stored value or are handed to the updater.

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "actors/kvstore.hpp"
#include "engine/comm.hpp"

namespace troupe {

class local_kvstore final : public kvstore {
public:
  /// `type` is the name reported by type(); `reduction` is comm_host or comm_device.
  local_kvstore(std::string type, std::unique_ptr<comm> reduction);

  using kvstore::broadcast;
  using kvstore::init;
  using kvstore::pull;
  using kvstore::push;
  using kvstore::pushpull;
  using kvstore::set_optimizer;

  const std::string& type() const noexcept override { return type_; }
  int rank() const noexcept override { return 0; }
  int num_workers() const noexcept override { return 1; }

  status init(std::span<const kv_key> keys, std::span<const ndarray> values) override;
  status push(std::span<const kv_key> keys, std::span<const ndarray> values,
              int priority = 0) override;
  status pull(std::span<const kv_key> keys, std::span<ndarray> outputs, int priority = 0) override;

  status set_optimizer(std::unique_ptr<optimizer> opt) override;
  status set_updater(updater_function update) override;
  bool is_capable(std::string_view capability) const noexcept override;

  status save_optimizer_states(const std::string& path, bool dump_optimizer = false) const override;
  status load_optimizer_states(const std::string& path) override;

private:
  struct entry {
    kv_key key;
    ndarray stored;
  };
  enum class key_kind { none, integer, text };

  /// The index of a declared key, or unknown_key naming it.
  result<std::int64_t> find(const kv_key& key, std::string_view operation) const;
  /// key_type_mix when `key` is of the other kind than the keys already declared.
  status check_kind(const kv_key& key) const;
  /// shape_mismatch / dtype_mismatch naming the key, what init declared and what was given.
  static status check_like(const entry& declared, const ndarray& given, std::string_view operation,
                           std::string_view role);

  std::string type_;
  std::unique_ptr<comm> comm_;
  std::map<std::int64_t, entry> entries_;     // by index
  std::map<std::string, std::int64_t> names_; // string key -> index
  key_kind kind_ = key_kind::none;
  std::int64_t next_name_index_ = 0;
  std::unique_ptr<troupe::updater> updater_; // set_optimizer
  updater_function custom_updater_;          // set_updater
};

} // namespace troupe

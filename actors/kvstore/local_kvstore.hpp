#pragma once
// The single-process KVStore behind `local` and `device` (MXNet's KVStoreLocal): stored values
// live on cpu(0); the pushed lists are reduced by a comm strategy (engine/comm.hpp) and then
// either replace the stored value or are handed to the updater.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/kvstore/key_registry.hpp"
#include "actors/kvstore/kvstore.hpp"
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
  using kvstore::row_sparse_pull;
  using kvstore::set_optimizer;

  const std::string& type() const noexcept override { return type_; }
  int rank() const noexcept override { return 0; }
  int num_workers() const noexcept override { return 1; }

  status init(std::span<const kv_key> keys, std::span<const ndarray> values) override;
  status push(std::span<const kv_key> keys, std::span<const ndarray> values,
              int priority = 0) override;
  status pull(std::span<const kv_key> keys, std::span<ndarray> outputs, int priority = 0) override;
  /// row_sparse keys: stored dense; a push sums its values' rows (their union) and hands the sum
  /// to the optimizer (updater::update_rows: MXNet's lazy_update) or, without one, makes the key
  /// the sum (rows it does not hold become 0, as MXNet's local store assigns the merged value).
  status init(std::span<const kv_key> keys, std::span<const row_sparse_array> values) override;
  status push(std::span<const kv_key> keys, std::span<const row_sparse_array> values,
              int priority = 0) override;
  status row_sparse_pull(std::span<const kv_key> keys, std::span<row_sparse_array> outputs,
                         std::span<const ndarray> row_ids, int priority = 0) override;

  using kvstore::set_gradient_compression;
  /// `device` types only (MXNet's rule).
  status set_gradient_compression(const gradient_compression& rule) override;
  status set_optimizer(std::unique_ptr<optimizer> opt) override;
  status set_updater(updater_function update) override;
  status set_row_updater(row_updater_function update) override;
  bool is_capable(std::string_view capability) const noexcept override;

  status save_optimizer_states(const std::string& path, bool dump_optimizer = false) const override;
  status load_optimizer_states(const std::string& path) override;

private:
  std::string type_;
  std::unique_ptr<comm> comm_;
  key_registry keys_;
  std::map<std::int64_t, ndarray> stored_;   // by key index
  std::unique_ptr<troupe::updater> updater_; // set_optimizer
  updater_function custom_updater_;          // set_updater
  row_updater_function custom_row_updater_;  // set_row_updater
  gradient_compression compression_;
  /// residuals_[key index][i]: the residual of the i-th value of the key's pushed lists.
  std::map<std::int64_t, std::vector<std::vector<float>>> residuals_;

  /// MXNet's CommDevice::ReduceCompressed before the sum: each value quantized with its own
  /// residual, replaced by what the packed bytes stand for (on its own context).
  void compress_values(std::int64_t index, std::vector<ndarray>& list);
};

} // namespace troupe

#pragma once
// The keys a KVStore client has declared with init, and the checks every call makes against them:
// int and string keys not mixed, a key declared once, values of the declared shape and dtype.
// Shared by the local and the distributed stores, so both say the same thing about the same
// mistake. String keys get indices 0, 1, 2... in the order of init (as MXNet maps them), so every
// worker of a job that initialises in the same order agrees on them.

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "actors/kvstore/kvstore.hpp"

namespace troupe {

struct key_declaration {
  kv_key key;
  std::int64_t index = 0; ///< the key itself for int keys, the order of init for strings
  shape_vector shape;
  troupe::dtype type = troupe::dtype::float32;
  /// Initialised with a row_sparse value: pushes are row_sparse, pulls are row_sparse_pull.
  bool row_sparse = false;
};

/// The values of a batch call grouped by key: positions into the call's lists, in order.
struct key_group {
  const key_declaration* declaration;
  /// Held inline: a key appears once in most calls, and a call may name 10,000 keys.
  boost::container::small_vector<std::size_t, 1> positions;
};

/// What row_sparse_pull asks of one key: its declaration and the rows, sorted and distinct.
struct rows_request {
  const key_declaration* declaration;
  std::vector<std::int64_t> rows;
};

/// The row_sparse values of a call for one key, in the call's order.
struct row_sparse_group {
  const key_declaration* declaration;
  std::vector<const row_sparse_array*> values;
};

class key_registry {
public:
  /// Checks a batch of inits without changing anything: matching list sizes, no empty batch,
  /// one kind of key, keys not declared before nor twice in the batch, values that are arrays.
  status check_new(std::span<const kv_key> keys, std::span<const ndarray> values) const;
  /// check_new for row_sparse initial values: their dense forms (a row_sparse key is stored
  /// dense), or the error; an empty row_sparse array is refused.
  result<std::vector<ndarray>> check_new(std::span<const kv_key> keys,
                                         std::span<const row_sparse_array> values) const;
  /// Declares a batch that passed check_new (`row_sparse`: the keys of row_sparse values, whose
  /// dense forms `values` are).
  void declare(std::span<const kv_key> keys, std::span<const ndarray> values,
               bool row_sparse = false);

  /// The declaration of `key`, or unknown_key / key_type_mix naming it and `operation`.
  result<const key_declaration*> find(const kv_key& key, std::string_view operation) const;
  /// The declaration of row_sparse key `key` for `operation`, checked against `value`'s shape and
  /// dtype: an error names a dense key, an empty value, another shape or dtype.
  result<const key_declaration*> find_row_sparse(const kv_key& key, const row_sparse_array& value,
                                                 std::string_view operation) const;
  /// Checks every (keys[i], values[i]) pair of a push of row_sparse values (find_row_sparse) and
  /// groups them by key in first-appearance order. `compressed`: the store compresses pushes,
  /// which row_sparse values refuse (as MXNet does).
  result<std::vector<row_sparse_group>> group_rows(std::span<const kv_key> keys,
                                                   std::span<const row_sparse_array> values,
                                                   std::string_view operation,
                                                   bool compressed) const;
  /// Checks a row_sparse_pull (as many outputs and row id arrays as keys, each key row_sparse)
  /// and normalises its row ids as MXNet does (unique_row_ids).
  result<std::vector<rows_request>> rows_to_pull(std::span<const kv_key> keys, std::size_t outputs,
                                                 std::span<const ndarray> row_ids) const;
  /// shape_mismatch / dtype_mismatch naming the key, the declared and the given values.
  static status check_like(const key_declaration& declared, const ndarray& given,
                           std::string_view operation, std::string_view role);
  /// Checks every (keys[i], arrays[i]) pair and groups them by key in first-appearance order.
  /// `role` names the arrays in errors ("pushed value", "output"). A row_sparse key is refused
  /// (its calls are push of row_sparse values and row_sparse_pull).
  result<std::vector<key_group>> group(std::span<const kv_key> keys,
                                       std::span<const ndarray> arrays, std::string_view operation,
                                       std::string_view role) const;

private:
  enum class key_kind { none, integer, text };
  static key_kind kind_of(const kv_key& key) {
    return std::holds_alternative<std::int64_t>(key) ? key_kind::integer : key_kind::text;
  }

  std::map<std::int64_t, key_declaration> by_index_;
  std::map<std::string, std::int64_t, std::less<>> names_;
  key_kind kind_ = key_kind::none;
  std::int64_t next_name_index_ = 0;
};

} // namespace troupe

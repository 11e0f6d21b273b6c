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

class key_registry {
public:
  /// Checks a batch of inits without changing anything: matching list sizes, no empty batch,
  /// one kind of key, keys not declared before nor twice in the batch, values that are arrays.
  status check_new(std::span<const kv_key> keys, std::span<const ndarray> values) const;
  /// Declares a batch that passed check_new (`row_sparse`: the keys of row_sparse values, whose
  /// dense forms `values` are).
  void declare(std::span<const kv_key> keys, std::span<const ndarray> values,
               bool row_sparse = false);

  /// The declaration of `key`, or unknown_key / key_type_mix naming it and `operation`.
  result<const key_declaration*> find(const kv_key& key, std::string_view operation) const;
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

#pragma once
// row_sparse arrays (MXNet's RowSparseNDArray): a tensor of shape (rows, d1, d2, ...) of which
// only some rows are stored, as the rows' values (`data`, shape (stored rows, d1, d2, ...)) and
// their row indices (`indices`, int64, strictly increasing). Every row not stored is zero. An
// embedding's gradient is one: a batch touches a few rows of a large table.
//
//   auto grad = row_sparse_array::from_rows(rows, {3, 17}, {1000, 64}).value();
//   auto dense = grad.to_dense();               // (1000, 64), zero but rows 3 and 17
//   auto back = row_sparse_array::from_dense(dense);
//
// Values live on the host (cpu); a value on a GPU is copied to the host by from_dense and
// from_rows.

#include <cstdint>
#include <ostream>
#include <span>
#include <string_view>
#include <vector>

#include "engine/error.hpp"
#include "engine/ndarray.hpp"

namespace troupe {

/// How an array is stored (MXNet's stype): every element, or only some rows.
enum class storage_type : std::uint8_t { dense, row_sparse };

/// MXNet's names: "default" and "row_sparse".
std::string_view to_string(storage_type type) noexcept;

inline std::ostream& operator<<(std::ostream& out, storage_type type) {
  return out << to_string(type);
}

class row_sparse_array {
public:
  /// The none array: no shape; none() is true.
  row_sparse_array() = default;

  /// MXNet's row_sparse_array((data, indices), shape): `indices` strictly increasing, each in
  /// [0, shape[0]); `data` of shape (indices.size(), shape[1], ...). An error names what does not
  /// fit (an index out of range or out of order, with its position; data of another shape).
  static result<row_sparse_array>
  from_rows(const ndarray& data, std::span<const std::int64_t> indices, shape_vector shape);
  /// The rows of `dense` that hold a non-zero element (MXNet's tostype('row_sparse')); a scalar
  /// is an error.
  static result<row_sparse_array> from_dense(const ndarray& dense);
  /// Rows `rows` (strictly increasing, each in [0, dense.shape()[0])) of `dense`, stored whatever
  /// their values: a row_sparse_pull's answer.
  static result<row_sparse_array> from_dense_rows(const ndarray& dense,
                                                  std::span<const std::int64_t> rows);
  /// No row stored: all zeros of `shape` (at least one axis).
  static row_sparse_array zeros(shape_vector shape, dtype type = dtype::float32);

  bool none() const noexcept { return shape_.empty(); }
  const shape_vector& shape() const noexcept { return shape_; }
  troupe::dtype dtype() const noexcept { return type_; }
  /// The stored rows, shape (stored_rows(), shape[1], ...).
  const ndarray& data() const noexcept { return data_; }
  /// Their row indices, strictly increasing.
  const std::vector<std::int64_t>& indices() const noexcept { return indices_; }
  std::size_t stored_rows() const noexcept { return indices_.size(); }
  /// Elements of one row (the product of shape[1], ...).
  std::int64_t row_elements() const noexcept;

  /// The dense array, zero where no row is stored.
  ndarray to_dense() const;
  /// Writes the stored rows into the same rows of `dense` (this shape and dtype, on the host)
  /// and leaves its other rows as they are: pulled rows into a worker's copy of a table. Waits
  /// for the work queued on `dense` first. An error names what does not fit.
  status write_rows_into(ndarray& dense) const;
  /// The stored rows among `row_ids` (strictly increasing): MXNet's sparse_retain.
  row_sparse_array retain(std::span<const std::int64_t> row_ids) const;

private:
  shape_vector shape_;
  troupe::dtype type_ = dtype::float32;
  ndarray data_;
  std::vector<std::int64_t> indices_;
};

/// The sum of `values` (at least one, all of one shape and dtype) over the union of their rows,
/// summed in float32 and rounded once to their dtype: what a store applies for a list of pushes.
row_sparse_array sum_rows(std::span<const row_sparse_array* const> values);

/// 0, 1, ..., rows - 1 as int64 row ids (a row_sparse_pull of every row).
ndarray all_row_ids(std::int64_t rows);

/// MXNet's row ids of row_sparse_pull: an array of any shape of integers, or of floats holding
/// integers, flattened, sorted and de-duplicated; each must lie in [0, rows). `what` names the
/// array in errors ("row_sparse_pull of key 3: row_ids").
result<std::vector<std::int64_t>> unique_row_ids(const ndarray& row_ids, std::int64_t rows,
                                                 std::string_view what);

} // namespace troupe

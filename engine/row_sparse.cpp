#include "engine/row_sparse.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace troupe {

std::string_view to_string(storage_type type) noexcept {
  return type == storage_type::row_sparse ? "row_sparse" : "default";
}

namespace {

ndarray on_host(const ndarray& array) {
  return array.ctx().is_cpu() ? array : array.copy_to(context::cpu());
}

const std::byte* bytes_of(const ndarray& array) {
  return static_cast<const std::byte*>(array.raw_data());
}

} // namespace

std::int64_t row_sparse_array::row_elements() const noexcept {
  return shape_.empty() ? 0 : element_count(shape_vector(shape_.begin() + 1, shape_.end()));
}

result<row_sparse_array> row_sparse_array::from_rows(const ndarray& data,
                                                     std::span<const std::int64_t> indices,
                                                     shape_vector shape) {
  if (shape.empty())
    return error{errc::invalid_argument, "row_sparse array of shape () : it needs a row axis"};
  for (auto extent : shape)
    if (extent < 0)
      return error{errc::invalid_argument,
                   "row_sparse array of shape " + shape_to_string(shape) + ": negative extent"};
  shape_vector expected = shape;
  expected[0] = static_cast<std::int64_t>(indices.size());
  if (data.is_none() || data.shape() != expected)
    return error{errc::shape_mismatch,
                 "row_sparse array of shape " + shape_to_string(shape) + " with " +
                     std::to_string(indices.size()) + " indices: data of shape " +
                     (data.is_none() ? std::string{"none"} : shape_to_string(data.shape())) +
                     ", expected " + shape_to_string(expected)};
  for (std::size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || indices[i] >= shape[0])
      return error{errc::invalid_argument, "row_sparse array of shape " + shape_to_string(shape) +
                                               ": index " + std::to_string(indices[i]) +
                                               " at position " + std::to_string(i) +
                                               " is outside [0, " + std::to_string(shape[0]) + ")"};
    if (i > 0 && indices[i] <= indices[i - 1])
      return error{errc::invalid_argument,
                   "row_sparse array of shape " + shape_to_string(shape) + ": index " +
                       std::to_string(indices[i]) + " at position " + std::to_string(i) +
                       " does not follow " + std::to_string(indices[i - 1]) +
                       " (indices must be strictly increasing, as MXNet checks them)"};
  }
  row_sparse_array out;
  out.shape_ = std::move(shape);
  out.type_ = data.dtype();
  out.data_ = on_host(data);
  out.indices_.assign(indices.begin(), indices.end());
  return out;
}

result<row_sparse_array> row_sparse_array::from_dense(const ndarray& dense) {
  if (dense.is_none() || dense.ndim() == 0)
    return error{errc::invalid_argument,
                 "row_sparse from a dense array of shape " +
                     (dense.is_none() ? std::string{"none"} : shape_to_string(dense.shape())) +
                     ": it needs a row axis"};
  const auto host = on_host(dense);
  const auto rows = host.shape()[0];
  const auto row_bytes = rows == 0 ? 0 : host.nbytes() / static_cast<std::size_t>(rows);
  const auto element = size_of(host.dtype());
  const auto* bytes = row_bytes == 0 ? nullptr : bytes_of(host);
  std::vector<std::int64_t> present;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto* row = bytes + static_cast<std::size_t>(r) * row_bytes;
    // A non-zero element: any bit set but the sign's (-0.0 is zero, as MXNet compares with 0).
    bool nonzero = false;
    for (std::size_t at = 0; at < row_bytes && !nonzero; at += element) {
      if (host.dtype() == dtype::float32) {
        float v;
        std::memcpy(&v, row + at, sizeof v);
        nonzero = v != 0.0f;
      } else if (host.dtype() == dtype::float64) {
        double v;
        std::memcpy(&v, row + at, sizeof v);
        nonzero = v != 0.0;
      } else if (host.dtype() == dtype::float16) {
        std::uint16_t v;
        std::memcpy(&v, row + at, sizeof v);
        nonzero = (v & 0x7fffu) != 0;
      } else {
        for (std::size_t b = 0; b < element; ++b)
          nonzero = nonzero || row[at + b] != std::byte{0};
      }
    }
    if (nonzero)
      present.push_back(r);
  }
  return from_dense_rows(host, present);
}

result<row_sparse_array> row_sparse_array::from_dense_rows(const ndarray& dense,
                                                           std::span<const std::int64_t> rows) {
  if (dense.is_none() || dense.ndim() == 0)
    return error{errc::invalid_argument, "rows of a dense array without a row axis"};
  const auto host = on_host(dense);
  const auto count = host.shape()[0];
  const auto row_bytes = count == 0 ? 0 : host.nbytes() / static_cast<std::size_t>(count);
  shape_vector data_shape = host.shape();
  data_shape[0] = static_cast<std::int64_t>(rows.size());
  auto data = ndarray::empty(data_shape, context::cpu(), host.dtype());
  // An index out of range is from_rows' error, before any row is read.
  for (auto r : rows)
    if (r < 0 || r >= count)
      return from_rows(data, rows, host.shape());
  if (!rows.empty() && row_bytes != 0) {
    const auto* from = bytes_of(host);
    auto* to = static_cast<std::byte*>(data.raw_data());
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::memcpy(to + i * row_bytes, from + static_cast<std::size_t>(rows[i]) * row_bytes,
                  row_bytes);
  }
  return from_rows(data, rows, host.shape());
}

row_sparse_array row_sparse_array::zeros(shape_vector shape, troupe::dtype type) {
  shape_vector data_shape = shape;
  if (!data_shape.empty())
    data_shape[0] = 0;
  return from_rows(ndarray::empty(data_shape, context::cpu(), type), {}, std::move(shape)).value();
}

ndarray row_sparse_array::to_dense() const {
  auto dense = ndarray::zeros(shape_, context::cpu(), type_);
  const auto row_bytes = static_cast<std::size_t>(row_elements()) * size_of(type_);
  if (indices_.empty() || row_bytes == 0)
    return dense;
  auto* out = static_cast<std::byte*>(dense.raw_data());
  const auto* rows = bytes_of(data_);
  for (std::size_t i = 0; i < indices_.size(); ++i)
    std::memcpy(out + static_cast<std::size_t>(indices_[i]) * row_bytes, rows + i * row_bytes,
                row_bytes);
  return dense;
}

status row_sparse_array::write_rows_into(ndarray& dense) const {
  if (dense.is_none() || dense.shape() != shape_ || dense.dtype() != type_ || !dense.ctx().is_cpu())
    return error{errc::shape_mismatch,
                 "write_rows_into: rows of a " + shape_to_string(shape_) + " " +
                     std::string{to_string(type_)} + " array into " +
                     (dense.is_none() ? std::string{"the none handle"}
                                      : shape_to_string(dense.shape()) + " " +
                                            std::string{to_string(dense.dtype())} + " on " +
                                            dense.ctx().to_string())};
  dense.wait_to_write();
  const auto row_bytes = static_cast<std::size_t>(row_elements()) * size_of(type_);
  if (indices_.empty() || row_bytes == 0)
    return ok();
  auto* out = static_cast<std::byte*>(dense.raw_data());
  const auto* rows = bytes_of(data_);
  for (std::size_t i = 0; i < indices_.size(); ++i)
    std::memcpy(out + static_cast<std::size_t>(indices_[i]) * row_bytes, rows + i * row_bytes,
                row_bytes);
  return ok();
}

row_sparse_array row_sparse_array::retain(std::span<const std::int64_t> row_ids) const {
  std::vector<std::int64_t> kept;
  std::vector<std::size_t> positions;
  std::size_t at = 0;
  for (auto id : row_ids) {
    while (at < indices_.size() && indices_[at] < id)
      ++at;
    if (at < indices_.size() && indices_[at] == id) {
      kept.push_back(id);
      positions.push_back(at);
    }
  }
  shape_vector data_shape = shape_;
  data_shape[0] = static_cast<std::int64_t>(kept.size());
  auto data = ndarray::empty(data_shape, context::cpu(), type_);
  const auto row_bytes = static_cast<std::size_t>(row_elements()) * size_of(type_);
  auto* out =
      positions.empty() || row_bytes == 0 ? nullptr : static_cast<std::byte*>(data.raw_data());
  for (std::size_t i = 0; out != nullptr && i < positions.size(); ++i)
    std::memcpy(out + i * row_bytes, bytes_of(data_) + positions[i] * row_bytes, row_bytes);
  row_sparse_array retained;
  retained.shape_ = shape_;
  retained.type_ = type_;
  retained.data_ = std::move(data);
  retained.indices_ = std::move(kept);
  return retained;
}

result<std::vector<std::int64_t>> unique_row_ids(const ndarray& row_ids, std::int64_t rows,
                                                 std::string_view what) {
  std::vector<std::int64_t> ids;
  if (row_ids.is_none())
    return ids;
  // float16 ids are widened once: every float16 integer is exact in float32.
  const auto host = row_ids.dtype() == dtype::float16 ? on_host(row_ids).as_type(dtype::float32)
                                                      : on_host(row_ids);
  ids.reserve(static_cast<std::size_t>(host.size()));
  const auto count = static_cast<std::size_t>(host.size());
  const auto* bytes = count == 0 ? nullptr : bytes_of(host);
  for (std::size_t i = 0; i < count; ++i) {
    double value = 0;
    switch (host.dtype()) {
    case dtype::int64: {
      std::int64_t v;
      std::memcpy(&v, bytes + i * 8, 8);
      if (v < 0 || v >= rows)
        return error{errc::invalid_argument, std::string{what} + ": row id " + std::to_string(v) +
                                                 " is outside [0, " + std::to_string(rows) + ")"};
      ids.push_back(v);
      continue;
    }
    case dtype::int32: {
      std::int32_t v;
      std::memcpy(&v, bytes + i * 4, 4);
      value = v;
      break;
    }
    case dtype::float32: {
      float v;
      std::memcpy(&v, bytes + i * 4, 4);
      value = v;
      break;
    }
    case dtype::float64:
      std::memcpy(&value, bytes + i * 8, 8);
      break;
    case dtype::float16: // widened above
      break;
    }
    if (!std::isfinite(value) || value != std::floor(value) || value < 0 ||
        value >= static_cast<double>(rows))
      return error{errc::invalid_argument,
                   std::string{what} + ": row id " + number_text(value) +
                       (value == std::floor(value) ? " is outside [0, " + std::to_string(rows) + ")"
                                                   : " is not an integer")};
    ids.push_back(static_cast<std::int64_t>(value));
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

/// The sum of `values` (one shape and dtype) over the union of their rows, summed in float32 and
/// rounded once to their dtype.
ndarray all_row_ids(std::int64_t rows) {
  ndarray ids({rows}, context::cpu(), dtype::int64);
  auto* out = static_cast<std::int64_t*>(ids.raw_data());
  for (std::int64_t row = 0; row < rows; ++row)
    out[row] = row;
  return ids;
}

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

} // namespace troupe

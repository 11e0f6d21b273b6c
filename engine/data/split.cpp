#include "engine/data/split.hpp"

#include <cstdint>
#include <string>

namespace troupe::data {

result<std::vector<ndarray>> split_and_load(const ndarray& batch, std::span<const context> contexts,
                                            bool even_split) {
  if (contexts.empty())
    return error{errc::invalid_argument, "split_and_load needs at least one context, got 0"};
  if (batch.is_none())
    return error{errc::invalid_argument, "split_and_load of the none ndarray"};
  if (batch.ndim() == 0)
    return error{errc::invalid_argument,
                 "split_and_load needs a batch with an axis 0 to split along, got shape " +
                     shape_to_string(batch.shape())};

  const std::int64_t size = batch.shape()[0];
  const auto num_slice = static_cast<std::int64_t>(contexts.size());
  if (size < num_slice)
    return error{errc::invalid_argument,
                 "batch of " + std::to_string(size) + " samples (shape " +
                     shape_to_string(batch.shape()) + ") is smaller than the number of contexts, " +
                     std::to_string(num_slice) + "; every context needs at least one sample"};

  std::vector<ndarray> slices;
  slices.reserve(contexts.size());
  // MXNet: `if len(ctx_list) == 1: return [data.as_in_context(ctx_list[0])]`.
  if (num_slice == 1) {
    slices.push_back(batch.copy_to(contexts[0]));
    return slices;
  }

  if (even_split && size % num_slice != 0)
    return error{errc::invalid_argument,
                 "data with shape " + shape_to_string(batch.shape()) +
                     " cannot be evenly split into " + std::to_string(num_slice) +
                     " slices along axis 0. Use a batch size that's multiple of " +
                     std::to_string(num_slice) +
                     " or set even_split=False to allow uneven partitioning of data."};

  // MXNet: step = size // num_slice; slice i is [i*step, (i+1)*step), the last [i*step, size).
  // (size >= num_slice here, so MXNet's "fewer slices" branch never applies.)
  const std::int64_t step = size / num_slice;
  for (std::int64_t i = 0; i < num_slice; ++i) {
    const std::int64_t begin = i * step;
    const std::int64_t end = i < num_slice - 1 ? (i + 1) * step : size;
    slices.push_back(batch.slice(begin, end).copy_to(contexts[static_cast<std::size_t>(i)]));
  }
  return slices;
}

} // namespace troupe::data

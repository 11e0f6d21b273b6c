#pragma once
// split_and_load: MXNet gluon.utils.split_and_load (and split_data, which it calls) for batch
// axis 0. A batch is cut along its first axis into one slice per context, and each slice is
// copied to its context, in the order the contexts are given.
//
// MXNet 1.x python/mxnet/gluon/utils.py::split_data:
//
//   size = data.shape[batch_axis]
//   if even_split and size % num_slice != 0:
//       raise ValueError("data with shape %s cannot be evenly split into %d slices along axis %d. "
//                        "Use a batch size that's multiple of %d or set even_split=False to allow "
//                        "uneven partitioning of data." % (...))
//   step = size // num_slice
//   if not even_split and size < num_slice:   # "make fewer slices"
//       step = 1
//       num_slice = size
//   slices = [data[i*step:(i+1)*step] if i < num_slice - 1 else data[i*step:size]
//             for i in range(num_slice)]
//
// and split_and_load returns [data.as_in_context(ctx_list[0])] for one context, otherwise
// [s.as_in_context(ctx) for s, ctx in zip(split_data(...), ctx_list)].
//
// So with even_split = false the first n-1 slices hold size/n rows (rounded down) and the last
// one the rest: 10 rows over 4 contexts give 2, 2, 2, 4.
//
// Where troupe differs, on purpose:
//  - a batch with fewer rows than there are contexts is an error (errc::invalid_argument, naming
//    both numbers), whatever even_split says. MXNet silently makes fewer slices (the later
//    contexts get nothing, through zip) with even_split=False, or raises the "cannot be evenly
//    split" error with even_split=True; an empty batch (0 rows) it splits into empty slices.
//  - zero contexts is an error; MXNet fails with an IndexError (ctx_list[0]) or a division by 0.
//  - every slice is a copy on its context (copy_to), even when the batch already lives there;
//    MXNet's as_in_context returns the same array in that case.

#include <span>
#include <vector>

#include "engine/context.hpp"
#include "engine/error.hpp"
#include "engine/ndarray.hpp"

namespace troupe::data {

/// One slice of `batch` per context, slice i copied to contexts[i], cut along axis 0 as MXNet's
/// split_data does (see above). Errors, all errc::invalid_argument with the numbers named: no
/// contexts; a none or scalar (0-d) batch; a batch of fewer rows than contexts; with
/// even_split, a row count that is not a multiple of the number of contexts.
result<std::vector<ndarray>> split_and_load(const ndarray& batch, std::span<const context> contexts,
                                            bool even_split = true);

} // namespace troupe::data

#pragma once
// Where the optimizer runs: MXNet 1.x gluon Trainer's choice of update_on_kvstore for dense
// weights with dense gradients (python/mxnet/gluon/trainer.py::_init_kvstore, the final `else:`
// branch, together with python/mxnet/model.py::_create_kvstore, which gives its default).
//
// Not covered here, because the answer needs more than the store's type: the sparse-weight and
// sparse-gradient branches of _init_kvstore; _create_kvstore's `local` rule (update_on_kvstore
// becomes False when the largest parameter has more than 16M elements); and the case of no
// kvstore at all (one device, a non-dist type), where update_on_kvstore is False.

#include <optional>
#include <string_view>

#include "engine/error.hpp"

namespace troupe {

/// True when the optimizer runs on the kvstore (push gradients, pull weights), false when each
/// worker updates its own weights (pushpull gradients, update locally).
///
/// `kvstore_type` is the store's type string ("local", "device", "dist_sync", "dist_async",
/// "dist_device_sync", "dist_device_async", ...); `optimizer_capable` is
/// kv.is_capable('optimizer'); `user_choice` is Trainer's update_on_kvstore argument (nullopt for
/// None). The rules, in MXNet's order:
///  1. default: MXNET_UPDATE_ON_KVSTORE, which defaults to 1 (true);
///  2. a type containing both "dist" and "async" forces true, and a user false is an error
///     (errc::invalid_argument, "Please set update_on_kvstore=True when training in async mode.");
///  3. otherwise a user value replaces the default;
///  4. if the result is true and the store is not optimizer-capable: a user true is an error
///     (errc::invalid_argument, "Please set update_on_kvstore=False when training with ..."),
///     and with no user value the result falls back to false (this applies to async types too).
result<bool> resolve_update_on_kvstore(std::string_view kvstore_type, bool optimizer_capable,
                                       std::optional<bool> user_choice);

} // namespace troupe

#pragma once
// How a KVStore sums the values pushed for one key from several contexts and hands the stored
// value back to them (MXNet's src/kvstore/comm.h, CommCPU and CommDevice).
//
//  - comm_host   (`local`):  every value is summed on the host, in one pass over all inputs.
//  - comm_device (`device`): each key gets a merge buffer on one of the pushing devices (the
//    least loaded one, as MXNet balances merge buffers by size); the other inputs are copied
//    there and summed by that device's kernel. More than two inputs are summed as a tree: pairs
//    on the first one's device, level by level, so that with device actors
//    (actors/device_actors.hpp) the sums of a level run concurrently. For cpu(i) contexts this
//    is the very code path gpu(i) takes; only the kernel behind sum_into differs, and a host sum
//    reads other cpu contexts in place instead of copying them.
//
// Both keep their buffers per key and reuse them round after round.

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "engine/ndarray.hpp"

namespace troupe {

class comm {
public:
  virtual ~comm() = default;

  /// Sums `values` (one shape and dtype; at least one) for `key`. The result stays valid until the
  /// next reduce of the same key; where it lives (context) is the strategy's choice.
  virtual const ndarray& reduce(std::int64_t key, std::span<const ndarray> values) = 0;
  /// Copies `source` into every output, whatever their contexts.
  void broadcast(const ndarray& source, std::span<ndarray> outputs) const;

  /// "host" or "device".
  virtual std::string_view name() const noexcept = 0;
};

class comm_host final : public comm {
public:
  const ndarray& reduce(std::int64_t key, std::span<const ndarray> values) override;
  std::string_view name() const noexcept override { return "host"; }

private:
  struct buffers {
    ndarray merged;
    std::vector<ndarray> staging; // host copies of inputs that live on a gpu
  };
  std::map<std::int64_t, buffers> buffers_;
};

class comm_device final : public comm {
public:
  const ndarray& reduce(std::int64_t key, std::span<const ndarray> values) override;
  std::string_view name() const noexcept override { return "device"; }

  /// The context holding `key`'s merge buffer, once the key has been reduced.
  context merge_context(std::int64_t key) const;

private:
  struct buffers {
    ndarray merged;
    std::vector<ndarray> staging;  // copies of inputs from other devices, on merged's context
    std::vector<ndarray> partials; // the tree's sums of pairs (more than two inputs)
    std::vector<std::vector<ndarray>> partial_staging;
  };
  context pick_merge_context(std::span<const ndarray> values);

  std::map<std::int64_t, buffers> buffers_;
  std::map<context, std::int64_t> assigned_bytes_; // load per device, for placement
};

} // namespace troupe

#pragma once
// Memory blocks for ndarray, and the pool that recycles them.
//
// Why a pool: the first write to freshly mapped memory runs at ~0.3 GB/s on these machines, warm
// memory at 12+ GB/s, and cudaMalloc synchronises the device. The KVStore allocates arrays of the
// same few sizes every round, so keeping freed blocks and handing them out again turns almost
// every allocation into a cache hit on warm memory.
//
// How:
//  - requests are rounded up to a size class (storage_pool::size_class): 64-byte multiples up to
//    256 bytes, then four classes per power of two (at most 25 % slack; from 16 KiB on every class
//    is a multiple of the 4 KiB page). A freed block is reused only for a request of the same
//    class and device, so a block never serves a request much smaller than itself;
//  - host blocks (every cpu(i): they are all the same host memory, so they share one set of
//    buckets) are 64-byte aligned and, when new, pre-faulted: every page is touched once, so that
//    the first real write runs at warm speed and the fault cost is paid once per block, not per
//    use;
//  - gpu(i) blocks come from troupe::kernels::cuda::allocate and are kept per device;
//  - cached (freed, kept) bytes are capped; a freed block that does not fit under the cap pushes
//    the least recently freed blocks out (really released), or is released itself when it alone
//    exceeds the cap;
//  - an allocation that fails releases every cached block of that device and tries once more.
//
// Thread-safe: one mutex guards the buckets; fresh memory is obtained, pre-faulted and released
// outside it.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "engine/context.hpp"

namespace troupe {

namespace detail {
struct pool_core;
} // namespace detail

/// What the dependency engine (engine/dispatch.hpp) keeps on a block: the queued task that wrote
/// it last and those that read it since, each as its lane and ticket in one word, and the error
/// of a failed task that wrote it.
struct storage_dependency {
  std::atomic<std::uint64_t> last_write{0};
  std::vector<std::uint64_t> readers; ///< under the engine's issue mutex; one per lane at most
  std::atomic<bool> failed{false};
  std::exception_ptr error; ///< written and cleared under the engine's error mutex
};

/// A block of memory of one device: `capacity()` bytes at `data()`, never null (a request for 0
/// bytes gets the smallest class). Not copyable; owned through std::shared_ptr<storage>. When the
/// last owner lets go, the block goes back to the pool it came from (or is released, if that pool
/// is gone or full). The contents of a block are unspecified when handed out.
///
/// A borrowed block (borrow()) is memory troupe did not allocate, such as a NumPy array's: it
/// never enters a pool, and the last owner letting go releases only `lender`, the owner's
/// keep-alive handle.
class storage {
  struct private_tag {};

public:
  /// Made by storage_pool and borrow() only (the tag is private).
  storage(private_tag, std::shared_ptr<detail::pool_core> owner, void* data, std::size_t capacity,
          context ctx) noexcept;
  storage(private_tag, std::shared_ptr<const void> lender, void* data, std::size_t capacity,
          context ctx) noexcept;
  /// A block over `bytes` bytes at `data` that someone else owns; `lender` keeps them alive and
  /// is dropped when the block's last owner lets go (on whatever thread that happens). Host
  /// memory only (a cpu context); `data` must not be null. The caller keeps `data` valid and
  /// unmoved while `lender` lives. Why: binding languages hand troupe their own arrays, and a
  /// push or pull on them must not copy (python/, docs/python.md).
  static std::shared_ptr<storage> borrow(void* data, std::size_t bytes, context ctx,
                                         std::shared_ptr<const void> lender);
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;
  ~storage();

  /// Host address for cpu contexts, device address for gpu contexts; 64-byte aligned on the host.
  void* data() const noexcept { return data_; }
  /// Usable bytes: the request rounded up to its size class.
  std::size_t capacity() const noexcept { return capacity_; }
  /// The context the block was requested for.
  context ctx() const noexcept { return ctx_; }
  /// The engine's record of the work queued on this block.
  storage_dependency& dependency() const noexcept { return dependency_; }
  /// True for a block made by borrow().
  bool is_borrowed() const noexcept { return lender_ != nullptr; }

private:
  friend class storage_pool;

  std::shared_ptr<detail::pool_core> owner_;
  std::shared_ptr<const void> lender_;
  void* data_;
  std::size_t capacity_;
  context ctx_;
  mutable storage_dependency dependency_;
};

/// Counters of one pool, for tests and diagnostics; a consistent snapshot.
struct storage_pool_stats {
  std::uint64_t hits = 0;       ///< allocations served from cached blocks
  std::uint64_t misses = 0;     ///< allocations that needed fresh memory
  std::uint64_t releases = 0;   ///< blocks really freed (over the cap, trim, pool destroyed)
  std::size_t cached_bytes = 0; ///< capacity of the blocks kept for reuse
  std::size_t cached_blocks = 0;
  std::size_t live_bytes = 0; ///< capacity of the blocks handed out and not yet returned
  std::size_t live_blocks = 0;
};

/// A recycling allocator of storage blocks (see the file comment for the policy).
///
/// ndarray takes its storage from `shared()`: memory is a per-process resource, and one pool per
/// process lets a block freed by one component (a KVStore round) serve the next request of any
/// other. Tests and components that want isolated accounting construct their own instance.
///
/// Destroying a pool releases its cached blocks; blocks still handed out stay valid and are
/// released (not cached) when their last owner lets go.
class storage_pool {
public:
  /// Host blocks are aligned to this many bytes (Cap'n Proto needs 8, AVX-512 loads like 64).
  static constexpr std::size_t alignment = 64;
  /// Default cap on cached bytes.
  static constexpr std::size_t default_max_cached_bytes = std::size_t{2} << 30;

  struct options {
    /// Freed blocks beyond this many cached bytes (all devices together) are really released.
    std::size_t max_cached_bytes = default_max_cached_bytes;
    /// Touch every page of a new host block once before handing it out.
    bool prefault_host = true;
  };

  storage_pool() : storage_pool(options{}) {}
  explicit storage_pool(options opts);
  storage_pool(const storage_pool&) = delete;
  storage_pool& operator=(const storage_pool&) = delete;
  ~storage_pool();

  /// The process-wide pool that ndarray uses.
  static storage_pool& shared();

  /// A block of at least `bytes` bytes on `ctx`. Throws std::bad_alloc when host memory runs out,
  /// std::runtime_error (from kernels/cuda) when device memory does. The caller checks that a gpu
  /// context names a present device.
  std::shared_ptr<storage> allocate(std::size_t bytes, context ctx);

  /// Releases every cached block (blocks handed out are unaffected).
  void trim();
  /// Changes the cap; cached blocks beyond the new cap are released at once.
  void set_max_cached_bytes(std::size_t bytes);
  std::size_t max_cached_bytes() const;

  storage_pool_stats stats() const;

  /// The capacity a request of `bytes` bytes gets (64 for 0 bytes).
  static std::size_t size_class(std::size_t bytes) noexcept;

private:
  std::shared_ptr<detail::pool_core> core_;
};

} // namespace troupe

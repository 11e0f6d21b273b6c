#include "engine/storage.hpp"

#include <bit>
#include <compare>
#include <cstdlib>
#include <deque>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "engine/error.hpp"
#include "kernels/cuda/device.hpp"

namespace troupe {

namespace {

/// Touching one byte per 4 KiB faults in every page for any page size of 4 KiB or more.
constexpr std::size_t touch_stride = 4096;

/// Which bucket a block belongs to: all cpu(i) share the host buckets, each gpu(i) has its own.
struct bucket_key {
  bool gpu = false;
  int device = 0;
  std::size_t capacity = 0;

  friend auto operator<=>(const bucket_key&, const bucket_key&) = default;
};

bucket_key key_of(context ctx, std::size_t capacity) noexcept {
  return {ctx.is_gpu(), ctx.is_gpu() ? ctx.id : 0, capacity};
}

struct cached_block {
  void* data;
  bucket_key key;
};

void* fresh_block(std::size_t capacity, context ctx, bool prefault) {
  if (ctx.is_gpu())
    return kernels::cuda::allocate(ctx.id, capacity);
  void* data = std::aligned_alloc(storage_pool::alignment, capacity);
  if (data == nullptr)
    throw std::bad_alloc{};
  if (prefault) {
    // volatile: the stores must happen now, although nothing reads these bytes before the
    // caller overwrites them.
    auto* bytes = static_cast<volatile unsigned char*>(data);
    for (std::size_t offset = 0; offset < capacity; offset += touch_stride)
      bytes[offset] = 0;
  }
  return data;
}

void release_block(void* data, const bucket_key& key) noexcept {
  if (key.gpu)
    kernels::cuda::release(key.device, data);
  else
    std::free(data);
}

void release_all(const std::vector<cached_block>& blocks) noexcept {
  for (const auto& block : blocks)
    release_block(block.data, block.key);
}

} // namespace

namespace detail {

/// The state of a pool, shared with every block it handed out so that a block can return after
/// its pool object is gone.
struct pool_core {
  using lru_list = std::list<cached_block>;

  mutable std::mutex mutex;
  storage_pool::options opts;
  bool closed = false;
  /// Every cached block, most recently freed first.
  lru_list lru;
  /// Cached blocks per bucket, least recently freed first (so lru.back() is the front of its
  /// bucket, and a hit takes the warmest block from the back).
  std::map<bucket_key, std::deque<lru_list::iterator>> buckets;
  storage_pool_stats stats;

  explicit pool_core(storage_pool::options o) : opts(o) {}

  /// Takes a cached block of `key`, or returns nullptr. Caller holds `mutex`.
  void* take_cached(const bucket_key& key) {
    const auto found = buckets.find(key);
    if (found == buckets.end())
      return nullptr;
    const auto entry = found->second.back();
    found->second.pop_back();
    if (found->second.empty())
      buckets.erase(found);
    void* data = entry->data;
    lru.erase(entry);
    stats.cached_bytes -= key.capacity;
    --stats.cached_blocks;
    return data;
  }

  /// Moves the least recently freed block to `out`. Caller holds `mutex`; lru is not empty.
  void evict_oldest(std::vector<cached_block>& out) {
    const auto oldest = std::prev(lru.end());
    auto bucket = buckets.find(oldest->key);
    auto& entries = bucket->second;
    // The globally oldest block is the oldest of its bucket, hence at the front; search anyway
    // so that the invariant is not load-bearing.
    for (auto it = entries.begin(); it != entries.end(); ++it) {
      if (*it == oldest) {
        entries.erase(it);
        break;
      }
    }
    if (entries.empty())
      buckets.erase(bucket);
    stats.cached_bytes -= oldest->key.capacity;
    --stats.cached_blocks;
    ++stats.releases;
    out.push_back(*oldest);
    lru.erase(oldest);
  }

  /// Evicts until at most `limit` bytes stay cached. Caller holds `mutex`.
  void shrink_to(std::size_t limit, std::vector<cached_block>& out) {
    while (stats.cached_bytes > limit && !lru.empty())
      evict_oldest(out);
  }

  /// Evicts every cached block of one device (all host blocks when `gpu` is false).
  void evict_device(bool gpu, int device, std::vector<cached_block>& out) {
    for (auto it = lru.begin(); it != lru.end();) {
      const auto next = std::next(it);
      if (it->key.gpu == gpu && it->key.device == device) {
        // Move it to the back and evict it there, reusing the bucket bookkeeping.
        lru.splice(lru.end(), lru, it);
        evict_oldest(out);
      }
      it = next;
    }
  }

  /// A block whose last owner let go.
  void give_back(void* data, std::size_t capacity, context ctx) noexcept {
    const auto key = key_of(ctx, capacity);
    std::vector<cached_block> to_release;
    bool release_self = false;
    {
      std::lock_guard lock{mutex};
      stats.live_bytes -= capacity;
      --stats.live_blocks;
      bool keep = !closed && capacity <= opts.max_cached_bytes;
      if (keep) {
        try {
          to_release.reserve(4);
          shrink_to(opts.max_cached_bytes - capacity, to_release);
          lru.push_front(cached_block{data, key});
          try {
            buckets[key].push_back(lru.begin());
          } catch (...) {
            lru.pop_front();
            throw;
          }
          stats.cached_bytes += capacity;
          ++stats.cached_blocks;
        } catch (...) {
          // Out of memory for the bookkeeping: release the block rather than lose it.
          keep = false;
        }
      }
      if (!keep)
        ++stats.releases;
      release_self = !keep;
    }
    if (release_self)
      release_block(data, key);
    release_all(to_release);
  }
};

} // namespace detail

storage::storage(private_tag, std::shared_ptr<detail::pool_core> owner, void* data,
                 std::size_t capacity, context ctx) noexcept
    : owner_(std::move(owner)), data_(data), capacity_(capacity), ctx_(ctx) {}

storage::storage(private_tag, std::shared_ptr<const void> lender, void* data, std::size_t capacity,
                 context ctx) noexcept
    : lender_(std::move(lender)), data_(data), capacity_(capacity), ctx_(ctx) {}

std::shared_ptr<storage> storage::borrow(void* data, std::size_t bytes, context ctx,
                                         std::shared_ptr<const void> lender) {
  if (data == nullptr)
    throw exception(errc::invalid_argument,
                    "storage::borrow: the borrowed memory's address is null");
  if (!ctx.is_cpu())
    throw exception(errc::invalid_argument,
                    "storage::borrow: only host memory can be borrowed, not " + ctx.to_string());
  if (lender == nullptr)
    throw exception(errc::invalid_argument,
                    "storage::borrow: no keep-alive handle for the borrowed memory");
  return std::make_shared<storage>(private_tag{}, std::move(lender), data, bytes, ctx);
}

storage::~storage() {
  if (owner_)
    owner_->give_back(data_, capacity_, ctx_);
}

storage_pool::storage_pool(options opts) : core_(std::make_shared<detail::pool_core>(opts)) {}

storage_pool::~storage_pool() {
  std::vector<cached_block> to_release;
  {
    std::lock_guard lock{core_->mutex};
    core_->closed = true;
    core_->shrink_to(0, to_release);
  }
  release_all(to_release);
}

storage_pool& storage_pool::shared() {
  static storage_pool pool;
  return pool;
}

std::shared_ptr<storage> storage_pool::allocate(std::size_t bytes, context ctx) {
  const std::size_t capacity = size_class(bytes);
  const auto key = key_of(ctx, capacity);
  void* data = nullptr;
  bool prefault = false;
  {
    std::lock_guard lock{core_->mutex};
    data = core_->take_cached(key);
    if (data != nullptr)
      ++core_->stats.hits;
    else
      ++core_->stats.misses;
    prefault = core_->opts.prefault_host;
  }
  if (data == nullptr) {
    try {
      data = fresh_block(capacity, ctx, prefault);
    } catch (...) {
      // Cached blocks of other sizes may be what stands in the way: drop them, try once more.
      std::vector<cached_block> to_release;
      {
        std::lock_guard lock{core_->mutex};
        core_->evict_device(key.gpu, key.device, to_release);
      }
      release_all(to_release);
      data = fresh_block(capacity, ctx, prefault);
    }
  }
  {
    std::lock_guard lock{core_->mutex};
    core_->stats.live_bytes += capacity;
    ++core_->stats.live_blocks;
  }
  try {
    return std::make_shared<storage>(storage::private_tag{}, core_, data, capacity, ctx);
  } catch (...) {
    core_->give_back(data, capacity, ctx);
    throw;
  }
}

void storage_pool::trim() {
  std::vector<cached_block> to_release;
  {
    std::lock_guard lock{core_->mutex};
    core_->shrink_to(0, to_release);
  }
  release_all(to_release);
}

void storage_pool::set_max_cached_bytes(std::size_t bytes) {
  std::vector<cached_block> to_release;
  {
    std::lock_guard lock{core_->mutex};
    core_->opts.max_cached_bytes = bytes;
    core_->shrink_to(bytes, to_release);
  }
  release_all(to_release);
}

std::size_t storage_pool::max_cached_bytes() const {
  std::lock_guard lock{core_->mutex};
  return core_->opts.max_cached_bytes;
}

storage_pool_stats storage_pool::stats() const {
  std::lock_guard lock{core_->mutex};
  return core_->stats;
}

std::size_t storage_pool::size_class(std::size_t bytes) noexcept {
  constexpr std::size_t smallest = 64;
  if (bytes <= smallest)
    return smallest;
  if (bytes > std::numeric_limits<std::size_t>::max() / 4)
    return bytes; // no allocation of this size can succeed; let the allocator say so
  const auto round_up = [](std::size_t value, std::size_t step) {
    return (value + step - 1) / step * step;
  };
  if (bytes <= 256)
    return round_up(bytes, smallest);
  // Four classes per power of two: [p, 2p] is split into steps of p/4.
  const std::size_t step = std::bit_floor(bytes - 1) / 4;
  return round_up(bytes, step);
}

} // namespace troupe

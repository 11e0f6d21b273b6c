#include "engine/dispatch.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "engine/error.hpp"
#include "engine/ndarray.hpp"
#include "engine/storage.hpp"

namespace troupe::engine {

namespace {

/// On a lane's thread while it runs a task: the task's arrays are ready, nothing waits.
thread_local bool on_lane = false;
/// Inside an inline_scope: work runs at once, after waiting for the queued work on its arrays.
thread_local bool inline_requested = false;

/// One context's queue, as the engine sees it: tickets handed out and tickets done. The backend
/// runs the tasks; a task marks its ticket done when it ends, so `completed` only grows, one by
/// one.
struct lane {
  lane(context where, std::uint64_t number) : ctx(where), index(number) {}

  context ctx;
  std::uint64_t index;                  ///< in lane_table::all(), from 1
  std::atomic<std::uint64_t> issued{0}; ///< written under issue_mutex
  std::atomic<std::uint64_t> completed{0};
  std::mutex mutex;
  std::condition_variable changed;

  void wait_until(std::uint64_t ticket) {
    if (completed.load(std::memory_order_acquire) >= ticket)
      return;
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return completed.load(std::memory_order_acquire) >= ticket; });
  }

  void complete(std::uint64_t ticket) {
    {
      std::lock_guard lock(mutex);
      completed.store(ticket, std::memory_order_release);
    }
    changed.notify_all();
  }
};

/// A queued use of a block (storage_dependency) in one word: the lane's index in the top byte,
/// the ticket below. 0: none.
constexpr int ticket_bits = 56;
constexpr std::uint64_t max_lanes = 255;

/// The process's lanes. They live until exit (never destroyed: a task still queued at exit may
/// refer to them), small ids in a table read without a lock.
class lane_table {
public:
  lane& of(context ctx) {
    const auto kind = static_cast<std::size_t>(ctx.kind == device_kind::gpu);
    if (ctx.id >= 0 && static_cast<std::size_t>(ctx.id) < fast_ids) {
      auto& slot = fast_[kind][static_cast<std::size_t>(ctx.id)];
      if (auto* found = slot.load(std::memory_order_acquire))
        return *found;
      std::lock_guard lock(mutex_);
      if (auto* found = slot.load(std::memory_order_relaxed))
        return *found;
      auto* made = make(ctx);
      slot.store(made, std::memory_order_release);
      return *made;
    }
    std::lock_guard lock(mutex_);
    auto& found = others_[ctx];
    if (found == nullptr)
      found = make(ctx);
    return *found;
  }

  /// The lane of a use_word's index.
  lane& at(std::uint64_t index) { return *by_index_[index].load(std::memory_order_acquire); }

  std::vector<lane*> all() {
    std::lock_guard lock(mutex_);
    return all_;
  }

private:
  lane* make(context ctx) {
    if (all_.size() >= max_lanes)
      throw exception(errc::invalid_argument, "the dependency engine takes at most " +
                                                  std::to_string(max_lanes) + " contexts; " +
                                                  ctx.to_string() + " is one more");
    auto* made = new lane(ctx, all_.size() + 1);
    all_.push_back(made);
    by_index_[made->index].store(made, std::memory_order_release);
    return made;
  }

  static constexpr std::size_t fast_ids = 64;
  std::mutex mutex_;
  std::array<std::array<std::atomic<lane*>, fast_ids>, 2> fast_{};
  std::map<context, lane*> others_;
  std::array<std::atomic<lane*>, 256> by_index_{};
  std::vector<lane*> all_;
};

constexpr std::uint64_t use_word(const lane& where, std::uint64_t ticket) {
  return (where.index << ticket_bits) | ticket;
}
constexpr std::uint64_t lane_index_of(std::uint64_t use) {
  return use >> ticket_bits;
}
constexpr std::uint64_t ticket_of(std::uint64_t use) {
  return use & ((std::uint64_t{1} << ticket_bits) - 1);
}

lane_table& lanes() {
  static auto* table = new lane_table;
  return *table;
}

/// Orders pushes: a push's ticket, its blocks' last uses and its post happen together, so that
/// tickets are posted to each lane in increasing order and every wait is on an earlier push.
std::mutex& issue_mutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}

std::atomic<bool> backend_installed{false};
std::shared_ptr<device_backend>& installed_backend() {
  static auto* backend = new std::shared_ptr<device_backend>;
  return *backend;
}

/// Guards storage_dependency::error and the first error waitall reports.
std::mutex& error_mutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}
std::exception_ptr& unreported_error() {
  static auto* error = new std::exception_ptr;
  return *error;
}

/// The error a failed task leaves: the operation and the context first, then what went wrong,
/// keeping troupe's error code.
std::exception_ptr describe_failure(std::string_view operation, context ctx,
                                    std::exception_ptr thrown) {
  const std::string where = std::string{operation} + " on " + ctx.to_string() + ": ";
  try {
    std::rethrow_exception(std::move(thrown));
  } catch (const exception& e) {
    return std::make_exception_ptr(exception(e.error().code(), where + e.error().message()));
  } catch (const std::bad_alloc&) {
    return std::make_exception_ptr(exception(errc::internal, where + "out of memory"));
  } catch (const std::exception& e) {
    return std::make_exception_ptr(exception(errc::internal, where + e.what()));
  } catch (...) {
    return std::make_exception_ptr(exception(errc::internal, where + "unknown exception"));
  }
}

void mark_failed(std::span<const std::shared_ptr<storage>> written, std::exception_ptr error) {
  std::lock_guard lock(error_mutex());
  for (const auto& block : written) {
    auto& dependency = block->dependency();
    dependency.error = error;
    dependency.failed.store(true, std::memory_order_release);
  }
  if (!unreported_error())
    unreported_error() = std::move(error);
}

/// Waits for the queued uses of `block` that an access of `kind` must follow.
void wait_for_uses(const std::shared_ptr<storage>& block, access_kind kind);

/// A successful write replaces what a failed one left: the block's error goes.
void clear_failures(std::span<const std::shared_ptr<storage>> written) {
  for (const auto& block : written)
    if (block->dependency().failed.load(std::memory_order_acquire)) {
      std::lock_guard lock(error_mutex());
      block->dependency().error = nullptr;
      block->dependency().failed.store(false, std::memory_order_release);
    }
}

/// The error a failed read left on one of `read`, if any: work on a failed input fails too.
std::exception_ptr inherited_failure(std::span<const std::shared_ptr<storage>> read) {
  for (const auto& block : read)
    if (block->dependency().failed.load(std::memory_order_acquire)) {
      std::lock_guard lock(error_mutex());
      if (block->dependency().error)
        return block->dependency().error;
    }
  return nullptr;
}

class lane_thread_scope {
public:
  lane_thread_scope() noexcept : previous_(std::exchange(on_lane, true)) {}
  ~lane_thread_scope() { on_lane = previous_; }
  lane_thread_scope(const lane_thread_scope&) = delete;
  lane_thread_scope& operator=(const lane_thread_scope&) = delete;

private:
  bool previous_;
};

const std::shared_ptr<storage>* block_of(const ndarray* array) {
  if (array == nullptr || array->is_none())
    return nullptr;
  return &array->block();
}

/// Runs at once in an inline scope, after the queued work on the arrays.
void run_inline(std::span<const ndarray* const> reads, std::span<const ndarray* const> writes,
                const std::function<void()>& work) {
  for (const auto* array : reads)
    if (const auto* block = block_of(array))
      wait_for(*block, access_kind::read);
  std::vector<std::shared_ptr<storage>> written;
  for (const auto* array : writes)
    if (const auto* block = block_of(array)) {
      wait_for_uses(*block, access_kind::write);
      written.push_back(*block);
    }
  work();
  clear_failures(written);
}

/// Queues `work` (moved from); false, leaving it alone, when the backend went away since the
/// caller looked (set_backend from another thread): the caller runs it itself.
bool push_queued(std::string_view operation, context ctx, std::span<const ndarray* const> reads,
                 std::span<const ndarray* const> writes, std::function<void()>& work) {
  lane& own = lanes().of(ctx);
  // Back-pressure: the caller waits for the lane instead of queueing without bound.
  const auto issued = own.issued.load(std::memory_order_relaxed);
  if (issued >= max_queued_per_lane)
    own.wait_until(issued - max_queued_per_lane + 1);

  std::vector<std::shared_ptr<storage>> read_blocks, written_blocks;
  read_blocks.reserve(reads.size());
  written_blocks.reserve(writes.size());
  for (const auto* array : reads)
    if (const auto* block = block_of(array))
      read_blocks.push_back(*block);
  for (const auto* array : writes)
    if (const auto* block = block_of(array))
      written_blocks.push_back(*block);

  std::lock_guard issue(issue_mutex());
  auto& backend = installed_backend();
  if (!backend)
    return false;
  const std::uint64_t ticket = own.issued.load(std::memory_order_relaxed) + 1;
  own.issued.store(ticket, std::memory_order_relaxed);

  // Uses on other lanes this task must wait for when it starts (on its own lane, order does it):
  // a read waits for the block's last write, a write also for the reads since. Each of those had
  // waited for the write before it, so these cover every earlier use.
  std::vector<std::pair<lane*, std::uint64_t>> waits;
  auto wait_on = [&](std::uint64_t use) {
    if (use != 0 && lane_index_of(use) != own.index)
      waits.emplace_back(&lanes().at(lane_index_of(use)), ticket_of(use));
  };
  const std::uint64_t this_use = use_word(own, ticket);
  for (const auto& block : read_blocks) {
    auto& dependency = block->dependency();
    wait_on(dependency.last_write.load(std::memory_order_relaxed));
    auto same_lane =
        std::find_if(dependency.readers.begin(), dependency.readers.end(),
                     [&](std::uint64_t use) { return lane_index_of(use) == own.index; });
    if (same_lane != dependency.readers.end())
      *same_lane = this_use;
    else
      dependency.readers.push_back(this_use);
  }
  for (const auto& block : written_blocks) {
    auto& dependency = block->dependency();
    wait_on(dependency.last_write.load(std::memory_order_relaxed));
    for (const auto use : dependency.readers)
      wait_on(use);
    dependency.readers.clear();
    dependency.last_write.store(this_use, std::memory_order_release);
  }

  backend->post(ctx, [&own, ticket, operation = std::string{operation}, ctx,
                      waits = std::move(waits), read_blocks = std::move(read_blocks),
                      written_blocks = std::move(written_blocks), work = std::move(work)] {
    lane_thread_scope on_lane;
    for (const auto& [other, earlier] : waits)
      other->wait_until(earlier);
    auto failure = inherited_failure(read_blocks);
    if (!failure) {
      try {
        work();
      } catch (...) {
        failure = describe_failure(operation, ctx, std::current_exception());
      }
    }
    if (failure)
      mark_failed(written_blocks, std::move(failure));
    else
      clear_failures(written_blocks);
    own.complete(ticket);
  });
  return true;
}

} // namespace

std::shared_ptr<device_backend> set_backend(std::shared_ptr<device_backend> backend) {
  for (auto* each : lanes().all())
    each->wait_until(each->issued.load(std::memory_order_acquire));
  std::lock_guard issue(issue_mutex());
  auto previous = std::exchange(installed_backend(), std::move(backend));
  backend_installed.store(installed_backend() != nullptr, std::memory_order_release);
  {
    std::lock_guard lock(error_mutex());
    unreported_error() = nullptr;
  }
  return previous;
}

bool has_backend() noexcept {
  return backend_installed.load(std::memory_order_acquire);
}

inline_scope::inline_scope() noexcept : previous_(std::exchange(inline_requested, true)) {}
inline_scope::~inline_scope() {
  inline_requested = previous_;
}

on_behalf_of_lane_scope::on_behalf_of_lane_scope() noexcept
    : previous_(std::exchange(on_lane, true)) {}
on_behalf_of_lane_scope::~on_behalf_of_lane_scope() {
  on_lane = previous_;
}

bool runs_inline() noexcept {
  return on_lane || inline_requested;
}

bool runs_now() noexcept {
  return !has_backend() || on_lane;
}

void add_addresses(std::vector<const ndarray*>& to, std::span<const ndarray> arrays) {
  for (const auto& array : arrays)
    to.push_back(&array);
}

void push(std::string_view operation, context ctx, access arrays, std::function<void()> work) {
  push(operation, ctx, std::span<const ndarray* const>(arrays.reads.begin(), arrays.reads.size()),
       std::span<const ndarray* const>(arrays.writes.begin(), arrays.writes.size()),
       std::move(work));
}

void push(std::string_view operation, context ctx, std::span<const ndarray* const> reads,
          std::span<const ndarray* const> writes, std::function<void()> work) {
  // Without a backend, or inside a lane's task (whose arrays are ready, and whose outcome the
  // task's own bookkeeping records): at once, nothing to wait for.
  if (runs_now()) {
    work();
    return;
  }
  if (inline_requested) {
    run_inline(reads, writes, work);
    return;
  }
  if (!push_queued(operation, ctx, reads, writes, work))
    run_inline(reads, writes, work);
}

void wait_for(const std::shared_ptr<storage>& block, access_kind kind) {
  if (block == nullptr || !has_backend() || on_lane)
    return;
  wait_for_uses(block, kind);
  auto& dependency = block->dependency();
  if (!dependency.failed.load(std::memory_order_acquire))
    return;
  std::exception_ptr error;
  {
    std::lock_guard lock(error_mutex());
    error = dependency.error;
    if (unreported_error() == error)
      unreported_error() = nullptr; // seen here: waitall need not throw it again
  }
  if (error)
    std::rethrow_exception(error);
}

namespace {

void wait_for_uses(const std::shared_ptr<storage>& block, access_kind kind) {
  if (!has_backend() || on_lane) // on a lane, the task's arrays are ready
    return;
  auto& dependency = block->dependency();
  auto wait_on = [](std::uint64_t use) {
    if (use != 0)
      lanes().at(lane_index_of(use)).wait_until(ticket_of(use));
  };
  if (kind == access_kind::write) {
    std::vector<std::uint64_t> readers;
    {
      std::lock_guard issue(issue_mutex());
      readers = dependency.readers;
    }
    for (const auto use : readers)
      wait_on(use);
  }
  wait_on(dependency.last_write.load(std::memory_order_acquire));
}

} // namespace

void waitall() {
  for (auto* each : lanes().all())
    each->wait_until(each->issued.load(std::memory_order_acquire));
  std::exception_ptr error;
  {
    std::lock_guard lock(error_mutex());
    error = std::exchange(unreported_error(), nullptr);
  }
  if (error)
    std::rethrow_exception(error);
}

} // namespace troupe::engine

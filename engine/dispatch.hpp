#pragma once
// The dependency engine: MXNet's Engine, per device. Work on an ndarray of a context is queued on
// that context's lane and runs there in the order it was queued; the caller goes on at once.
// Reading an array's bytes from outside a lane (to_vector, data<T>(), raw_data(), wait_to_read)
// first waits for the queued work that uses that array; an error inside queued work is kept on
// the arrays the work writes and thrown at every wait on one of them (and once by waitall),
// naming the operation and the context, until a later task writes the array again. Work that
// reads a failed array fails with its error, whenever it runs.
//
// Who runs a lane is a device_backend. The engine itself has none: without one (the naive engine,
// MXNet's NaiveEngine, and the default) every operation runs at once on the caller's thread. The
// device actors (actors/device) are the backend of a process that wants its contexts to compute
// concurrently: one actor per context, each with its own thread.
//
// Ordering:
//  - each lane runs its tasks one at a time in ticket order, so work on one context needs no
//    other dependency tracking;
//  - each array remembers the last queued task that wrote it and the tasks that read it since
//    (the latest per lane). A task that reads an array first waits, on its own lane, for the last
//    write when another lane did it; a task that writes also waits for the reads since. Readers
//    on several lanes run at the same time, and as each use had waited for the write before it,
//    these waits cover every earlier use. Every wait is on a task pushed earlier, so the lanes
//    cannot wait on each other in a cycle; work of another lane that does not touch the array
//    goes on meanwhile;
//  - work queued from inside a lane's task (an operator that calls others) runs at once, inline:
//    it is already ordered by the task around it;
//  - a caller may run at most `max_queued_per_lane` tasks ahead of a lane; the next push waits.
//
// Threads that must not hand work to a lane (a server shard's actor answers from its own thread,
// and a hop to a device thread per operation would cost more than the operation) open an
// inline_scope: their operations then run at once, after the queued work on their arrays.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/context.hpp"

namespace troupe {

class ndarray;
class storage;

namespace engine {

/// Runs each context's work in the order it is posted, on a thread that is not the poster's.
/// post() must not block for long and must not run `work` before it returns.
class device_backend {
public:
  virtual ~device_backend() = default;
  virtual void post(context ctx, std::function<void()> work) = 0;
};

/// How far the caller may run ahead of one lane, in tasks.
inline constexpr std::uint64_t max_queued_per_lane = 1024;

/// Installs `backend` (null: the naive engine) and returns the one it replaces. Waits for all
/// queued work first; an error still pending then is dropped (waitall() before, to see it).
std::shared_ptr<device_backend> set_backend(std::shared_ptr<device_backend> backend);
/// True when a backend is installed.
bool has_backend() noexcept;

/// Work pushed from this thread while the scope lives runs at once (after the queued work on the
/// arrays it names).
class inline_scope {
public:
  inline_scope() noexcept;
  ~inline_scope();
  inline_scope(const inline_scope&) = delete;
  inline_scope& operator=(const inline_scope&) = delete;

private:
  bool previous_;
};

/// For a thread that works on arrays for a task of a lane which waits for it (the KVStore worker
/// actor: a lane's task waits for the request that writes a parameter, and the caller already
/// waited for the queued uses of the request's arrays before handing them over). While the scope
/// lives the thread is treated as that task's: waits do nothing and work runs at once, as on a
/// lane. Waiting here would wait for the task that waits for this thread.
class on_behalf_of_lane_scope {
public:
  on_behalf_of_lane_scope() noexcept;
  ~on_behalf_of_lane_scope();
  on_behalf_of_lane_scope(const on_behalf_of_lane_scope&) = delete;
  on_behalf_of_lane_scope& operator=(const on_behalf_of_lane_scope&) = delete;

private:
  bool previous_;
};

/// True on a lane's thread while it runs a task, and inside an inline_scope: work pushed from
/// here runs at once (in a scope after the queued work on its arrays; on a lane's thread, where
/// the task's arrays are ready, without waiting).
bool runs_inline() noexcept;

/// True when push() would run work at once on this thread with nothing to wait for: no backend is
/// installed (the naive engine), or the thread runs a lane's task. A caller may then run its work
/// itself, without wrapping it for a queue (an update of a server shard, which allocates nothing
/// once warm).
bool runs_now() noexcept;

/// The arrays a task reads and writes. Every array the work touches must be named (views count
/// as their storage); arrays the work creates itself need not be.
struct access {
  std::initializer_list<const ndarray*> reads = {};
  std::initializer_list<const ndarray*> writes = {};
};

/// Appends the address of each of `arrays` to `to`: the reads or writes of a task whose arrays
/// come as a span (an operator's inputs).
void add_addresses(std::vector<const ndarray*>& to, std::span<const ndarray> arrays);

/// Queues `work` on `ctx`'s lane (or runs it at once, see the file comment). `operation` names it
/// in errors ("FullyConnected", "copy_to").
void push(std::string_view operation, context ctx, access arrays, std::function<void()> work);
/// The same with the arrays as spans (an operator's inputs and outputs).
void push(std::string_view operation, context ctx, std::span<const ndarray* const> reads,
          std::span<const ndarray* const> writes, std::function<void()> work);

enum class access_kind : std::uint8_t { read, write };

/// Waits until the queued work that writes `block` is done (and, to write it, the work that reads
/// it too); throws the error a failed task left on it. The error stays with the block, thrown at
/// every wait, until a later task writes the block without failing. Does nothing on a lane's
/// thread or without a backend.
void wait_for(const std::shared_ptr<storage>& block, access_kind kind);
/// Waits until every lane has finished everything queued so far; throws the first error of any
/// task since the last waitall that no wait on its array has thrown yet (once).
void waitall();

} // namespace engine

} // namespace troupe

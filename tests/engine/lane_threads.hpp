#pragma once
// A device backend for the engine's tests (engine/dispatch.hpp): one plain thread per context,
// running its context's work in order. The process's real backend is the device actors
// (actors/device_actors.hpp), which the engine's tests cannot link; this one has the same
// contract, so the engine's queued paths run in the engine's own suite.

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/dispatch.hpp"

namespace troupe::test {

class lane_threads : public engine::device_backend {
public:
  ~lane_threads() override {
    for (auto& [ctx, lane] : lanes_) {
      {
        std::lock_guard lock(lane->mutex);
        lane->stopping = true;
      }
      lane->ready.notify_one();
      lane->thread.join();
    }
  }

  void post(context ctx, std::function<void()> work) override {
    lane_state& lane = lane_of(ctx);
    {
      std::lock_guard lock(lane.mutex);
      lane.queue.push_back(std::move(work));
    }
    lane.ready.notify_one();
  }

private:
  struct lane_state {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::function<void()>> queue;
    bool stopping = false;
    std::thread thread;
  };

  lane_state& lane_of(context ctx) {
    std::lock_guard lock(mutex_);
    auto& lane = lanes_[ctx];
    if (!lane) {
      lane = std::make_unique<lane_state>();
      lane->thread = std::thread([state = lane.get()] { run(*state); });
    }
    return *lane;
  }

  static void run(lane_state& lane) {
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock lock(lane.mutex);
        lane.ready.wait(lock, [&] { return lane.stopping || !lane.queue.empty(); });
        if (lane.queue.empty())
          return;
        work = std::move(lane.queue.front());
        lane.queue.pop_front();
      }
      work();
    }
  }

  std::mutex mutex_;
  std::map<context, std::unique_ptr<lane_state>> lanes_;
};

/// Installs lane_threads as the engine's backend while it lives, then puts back the one before.
class queued_engine {
public:
  queued_engine() : previous_(engine::set_backend(backend_)) {}
  ~queued_engine() { engine::set_backend(previous_); }
  queued_engine(const queued_engine&) = delete;
  queued_engine& operator=(const queued_engine&) = delete;

private:
  std::shared_ptr<lane_threads> backend_ = std::make_shared<lane_threads>();
  std::shared_ptr<engine::device_backend> previous_;
};

} // namespace troupe::test

#include "actors/io_spin.hpp"

#include <sched.h>

#include <caf/io/network/multiplexer.hpp>
#include <caf/make_counted.hpp>

namespace troupe {
namespace {

using spin_clock = std::chrono::steady_clock;

class spinner final : public caf::io::network::multiplexer::runnable {
public:
  resume_result resume(caf::execution_unit*, size_t) override {
    if (spin_clock::now() < until) {
      sched_yield();
      return resume_later;
    }
    posted = false;
    return done;
  }

  spin_clock::time_point until;
  bool posted = false;
};

// One per multiplexer thread. The multiplexer holds a second reference while the spinner is
// posted, so it outlives this thread's if the thread ends first.
thread_local caf::intrusive_ptr<spinner> this_threads_spinner;

} // namespace

void keep_multiplexer_polling(caf::io::network::multiplexer& backend,
                              std::chrono::microseconds spin) {
  if (spin <= std::chrono::microseconds::zero())
    return;
  if (!this_threads_spinner)
    this_threads_spinner = caf::make_counted<spinner>();
  auto& mine = *this_threads_spinner;
  mine.until = spin_clock::now() + spin;
  if (mine.posted)
    return;
  mine.posted = true;
  intrusive_ptr_add_ref(&mine);
  backend.exec_later(&mine); // on the multiplexer's thread: internally posted, no wake-up
}

} // namespace troupe

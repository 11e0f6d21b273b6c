#pragma once
// Keeps a CAF multiplexer polling its sockets for a short while after it last received data,
// instead of going back to sleep in epoll_wait at once.
//
// Why: a small request's round trip crosses two sockets, and at each the receiving middleman
// thread wakes from epoll_wait. On the 2-vCPU VMs troupe is measured on, that wake-up is most of
// the hop (docs/data-path.md, "A small request against a plain ping-pong": 11.5 µs per socket
// hop against 5 µs for a ping-pong whose ends poll). A thread that has just handled a frame is
// likely to get the next one soon (the answer to what it sent, or the caller's next request), so
// for `data.io_spin_us` after each received frame the multiplexer polls without blocking,
// yielding its core to any other thread that is ready between polls.
//
// How, in CAF 0.17.6 (default_multiplexer::poll_once): a runnable posted on the multiplexer's own
// thread goes to its internally_posted_ list, and while that list is not empty each round of the
// event loop runs it and then polls epoll with a zero timeout. The spinner is such a runnable: it
// asks to run again (resume_later) until `spin` has passed since the last touch(), then ends
// (done), and the loop blocks again. It is one object per multiplexer thread, owned by that
// thread, touched by the brokers that run on it; nothing here is shared with other threads.

#include <chrono>

namespace caf::io::network {
class multiplexer;
}

namespace troupe {

/// Called by a broker on its multiplexer's thread when it has received data: the multiplexer
/// polls for `spin` from now (zero: nothing happens, the loop blocks as CAF's does).
void keep_multiplexer_polling(caf::io::network::multiplexer& backend,
                              std::chrono::microseconds spin);

} // namespace troupe

// Replaces operator new / delete for the whole test executable: they forward to malloc / free
// (which AddressSanitizer still intercepts) and, while a probe is armed, keep the largest size
// and the count.

#include "tests/allocation_probe.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {

std::atomic<bool> armed{false};
std::atomic<std::size_t> largest_seen{0};
std::atomic<std::size_t> allocations{0};

void record(std::size_t size) noexcept {
  if (!armed.load(std::memory_order_relaxed))
    return;
  allocations.fetch_add(1, std::memory_order_relaxed);
  std::size_t seen = largest_seen.load(std::memory_order_relaxed);
  while (size > seen && !largest_seen.compare_exchange_weak(seen, size, std::memory_order_relaxed))
    ;
}

} // namespace

void* operator new(std::size_t size) {
  record(size);
  if (void* p = std::malloc(size == 0 ? 1 : size))
    return p;
  throw std::bad_alloc();
}

void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

namespace troupe::test {

allocation_probe::allocation_probe() noexcept {
  largest_seen.store(0);
  allocations.store(0);
  armed.store(true);
}

allocation_probe::~allocation_probe() {
  armed.store(false);
}

std::size_t allocation_probe::largest() const noexcept {
  return largest_seen.load();
}

std::size_t allocation_probe::count() const noexcept {
  return allocations.load();
}

} // namespace troupe::test

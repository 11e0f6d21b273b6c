#pragma once
// Shared by the GPU kernel tests: the preconditions that skip a suite with a message when no CUDA
// device is present (or run it only then), device memory owned by a test, the check that a call
// throws a std::runtime_error that says what failed, and the check of a sum of n arrays on a
// device against its CPU kernel.

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "kernels/cuda/device.hpp"
#include "tests/kernels/kernels_test_support.hpp"

namespace troupe::kernels::testing {

inline boost::test_tools::assertion_result has_cuda_device(boost::unit_test::test_unit_id) {
  if (troupe::kernels::cuda::device_count() > 0)
    return true;
  BOOST_TEST_MESSAGE("GPU tests are skipped because no CUDA device is present: "
                     << troupe::kernels::cuda::describe_device(0));
  boost::test_tools::assertion_result result{false};
  result.message() << "no CUDA device is present (" << troupe::kernels::cuda::describe_device(0)
                   << ")";
  return result;
}

inline boost::test_tools::assertion_result has_no_cuda_device(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result result{troupe::kernels::cuda::device_count() == 0};
  if (!result)
    result.message() << "a CUDA device is present";
  return result;
}

/// Owns `n` elements of device memory; release() on destruction.
template <class T>
class device_buffer {
public:
  device_buffer(int device, std::size_t n)
      : device_{device}, n_{n}, data_{static_cast<T*>(
                                    troupe::kernels::cuda::allocate(device, n * sizeof(T)))} {}
  explicit device_buffer(int device, const std::vector<T>& host)
      : device_buffer(device, host.size()) {
    upload(host);
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { troupe::kernels::cuda::release(device_, data_); }

  T* get() const { return data_; }
  void upload(const std::vector<T>& host) {
    BOOST_TEST_REQUIRE(host.size() == n_);
    troupe::kernels::cuda::copy_host_to_device(device_, data_, host.data(), n_ * sizeof(T));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    troupe::kernels::cuda::copy_device_to_host(device_, host.data(), data_, n_ * sizeof(T));
    return host;
  }

private:
  int device_;
  std::size_t n_;
  T* data_;
};

/// `call` must throw a std::runtime_error whose message contains `what` (which call failed) and,
/// when given, `also` (why it failed).
template <class F>
void check_throws_runtime_error(F call, std::string_view what, const char* also = nullptr) {
  bool thrown = false;
  try {
    call();
  } catch (const std::runtime_error& e) {
    thrown = true;
    const std::string message = e.what();
    BOOST_TEST(message.find(what) != std::string::npos, message);
    if (also != nullptr)
      BOOST_TEST(message.find(also) != std::string::npos, message);
  }
  BOOST_TEST(thrown, what << " did not throw std::runtime_error");
}

/// Sums `count` arrays of n elements, each drawn by `draw()` in turn, on `device` with
/// gpu_sum(device, inputs, count, out, n), and checks the result bit for bit against
/// cpu_sum(inputs, count, out, n) of the same arrays: first into an output that starts as
/// `initial_out` everywhere, then into inputs[0] itself. `name` names the sum in a failure.
template <class T, class Draw, class CpuSum, class GpuSum>
void check_sum_matches_the_cpu(int device, std::size_t n, std::size_t count, Draw draw,
                               CpuSum cpu_sum, GpuSum gpu_sum, T initial_out,
                               const std::string& name) {
  std::vector<std::vector<T>> host;
  std::vector<std::unique_ptr<device_buffer<T>>> on_device;
  std::vector<const T*> host_pointers, device_pointers;
  for (std::size_t k = 0; k < count; ++k) {
    host.push_back(draw());
    on_device.push_back(std::make_unique<device_buffer<T>>(device, host.back()));
  }
  for (std::size_t k = 0; k < count; ++k) {
    host_pointers.push_back(host[k].data());
    device_pointers.push_back(on_device[k]->get());
  }
  std::vector<T> expected(n);
  cpu_sum(host_pointers.data(), count, expected.data(), n);

  device_buffer<T> out{device, std::vector<T>(n, initial_out)};
  gpu_sum(device, device_pointers.data(), count, out.get(), n);
  check_equal(out.download(), expected, name);
  if (count > 0) {
    // out may alias inputs[0]
    gpu_sum(device, device_pointers.data(), count, on_device[0]->get(), n);
    check_equal(on_device[0]->download(), expected, name + " into inputs[0]");
  }
}

} // namespace troupe::kernels::testing

#pragma once
// Shared by the GPU kernel tests: the preconditions that skip a suite with a message when no CUDA
// device is present (or run it only then), and device memory owned by a test.

#include <cstddef>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "kernels/cuda/device.hpp"

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

} // namespace troupe::kernels::testing

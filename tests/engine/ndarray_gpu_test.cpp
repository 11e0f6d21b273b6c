// The gpu(0) paths of ndarray, checked against the cpu results. Each case runs only where a GPU
// is present and is reported as skipped elsewhere (Boost.Test precondition).

#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/ndarray.hpp"
#include "engine/storage.hpp"
#include "engine_test_support.hpp"

using troupe::context;
using troupe::dtype;
using troupe::ndarray;

namespace {

const auto gpu = context::gpu(0);
constexpr dtype all_dtypes[] = {dtype::float32, dtype::float16, dtype::int32, dtype::int64,
                                dtype::float64};

} // namespace

BOOST_AUTO_TEST_SUITE(ndarray_gpu_suite, *boost::unit_test::precondition(troupe::test::gpu_present))

BOOST_AUTO_TEST_CASE(gpu_arrays_round_trip_through_the_host_in_every_dtype) {
  for (const dtype type : all_dtypes) {
    BOOST_TEST_CONTEXT(troupe::to_string(type)) {
      const auto host = ndarray::from_values({1, -2, 3, 4, 5, 6}, {2, 3}, context::cpu(), type);
      const auto device = host.copy_to(gpu);
      BOOST_TEST((device.ctx() == gpu));
      BOOST_TEST(device.to_vector<double>() == host.to_vector<double>(),
                 boost::test_tools::per_element());
      BOOST_TEST(device.copy().to_vector<double>() == host.to_vector<double>(),
                 boost::test_tools::per_element());
      BOOST_TEST(device.as_type(dtype::float32).to_vector<double>() == host.to_vector<double>(),
                 boost::test_tools::per_element());
      BOOST_TEST(ndarray::full({3}, 2.0, gpu, type).to_vector<double>() ==
                     std::vector<double>(3, 2.0),
                 boost::test_tools::per_element());
      BOOST_TEST(ndarray::zeros({3}, gpu, type).sum() == 0.0);
      BOOST_TEST(device.to_string() ==
                 host.to_string().substr(0, host.to_string().rfind('@')) + "@gpu(0)>");
    }
  }
}

BOOST_AUTO_TEST_CASE(gpu_arithmetic_matches_the_cpu_for_every_dtype) {
  for (const dtype type : all_dtypes) {
    BOOST_TEST_CONTEXT(troupe::to_string(type)) {
      const auto a = ndarray::from_values({1, 2, 3, 4, 5, 6}, {2, 3}, context::cpu(), type);
      const auto b = ndarray::from_values({2, 4, 6, 8, 10, 12}, {2, 3}, context::cpu(), type);
      const auto ga = a.copy_to(gpu);
      const auto gb = b.copy_to(gpu);
      const auto same = [](const ndarray& device, const ndarray& host) {
        BOOST_TEST((device.ctx() == gpu));
        BOOST_TEST(device.to_vector<double>() == host.to_vector<double>(),
                   boost::test_tools::per_element());
      };
      same(ga + gb, a + b);
      same(gb - ga, b - a);
      same(ga * gb, a * b);
      same(gb / ga, b / a);
      same(ga + 1.5, a + 1.5);
      same(ga - 1.0, a - 1.0);
      same(ga * 3.0, a * 3.0);
      same(gb / 2.0, b / 2.0);
      same(-ga, -a);
      auto gc = ga.copy();
      gc += gb;
      gc *= 2.0;
      auto c = a.copy();
      c += b;
      c *= 2.0;
      same(gc, c);
      BOOST_TEST(ga.sum() == a.sum());
      BOOST_TEST(ga.l2_norm() == a.l2_norm());
    }
  }
}

BOOST_AUTO_TEST_CASE(gpu_sum_into_and_axpy_match_the_cpu) {
  for (const dtype type : {dtype::float32, dtype::float16, dtype::float64}) {
    BOOST_TEST_CONTEXT(troupe::to_string(type)) {
      std::vector<ndarray> host_inputs;
      std::vector<ndarray> device_inputs;
      for (int k = 0; k < 4; ++k) {
        host_inputs.push_back(ndarray::random_uniform(
            -1, 1, {1000, 100}, static_cast<std::uint64_t>(k), context::cpu(), type));
        device_inputs.push_back(host_inputs.back().copy_to(gpu));
      }
      auto host_out = ndarray::empty({1000, 100}, context::cpu(), type);
      auto device_out = ndarray::empty({1000, 100}, gpu, type);
      troupe::sum_into(host_inputs, host_out);
      troupe::sum_into(device_inputs, device_out);
      BOOST_TEST(device_out.to_vector<double>() == host_out.to_vector<double>(),
                 boost::test_tools::per_element());
      // In place over the first input, as the KVStore reduces.
      troupe::sum_into(device_inputs, device_inputs[0]);
      BOOST_TEST(device_inputs[0].to_vector<double>() == host_out.to_vector<double>(),
                 boost::test_tools::per_element());
      troupe::axpy(0.5, host_inputs[1], host_out);
      troupe::axpy(0.5, device_inputs[1], device_out);
      BOOST_TEST(device_out.to_vector<double>() == host_out.to_vector<double>(),
                 boost::test_tools::tolerance(1e-6) << boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(gpu_random_arrays_equal_cpu_arrays_of_the_same_seed) {
  const auto host = ndarray::random_normal(0, 1, {1000}, 99);
  const auto device = ndarray::random_normal(0, 1, {1000}, 99, gpu);
  BOOST_TEST(device.to_vector<float>() == host.to_vector<float>(),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_gpu_view_copied_onto_an_overlapping_view_matches_the_cpu) {
  // memmove semantics on the host; on a gpu the source is copied first (cudaMemcpy's ranges may
  // not overlap).
  for (const dtype type : {dtype::float32, dtype::float16}) {
    BOOST_TEST_CONTEXT(troupe::to_string(type)) {
      auto host = ndarray::from_values({1, 2, 3, 4, 5, 6, 7, 8}, {8}, context::cpu(), type);
      auto device = host.copy_to(gpu);
      auto host_target = host.slice(1, 8);
      auto device_target = device.slice(1, 8);
      host.slice(0, 7).copy_to(host_target);
      device.slice(0, 7).copy_to(device_target);
      BOOST_TEST(device.to_vector<double>() == host.to_vector<double>(),
                 boost::test_tools::per_element());
      BOOST_TEST(host.to_vector<double>() == std::vector<double>({1, 1, 2, 3, 4, 5, 6, 7}),
                 boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(gpu_blocks_are_pooled_per_device) {
  troupe::storage_pool pool;
  auto block = pool.allocate(1 << 20, gpu);
  const void* address = block->data();
  block.reset();
  block = pool.allocate(1 << 20, gpu);
  BOOST_TEST(block->data() == address);
  BOOST_TEST(pool.stats().hits == 1u);
  block.reset();
  pool.trim();
  BOOST_TEST(pool.stats().cached_blocks == 0u);
}

BOOST_AUTO_TEST_CASE(a_gpu_id_beyond_the_devices_present_throws_device_unavailable) {
  const int count = troupe::num_gpus();
  troupe::test::require_error([count] { ndarray::zeros({2}, context::gpu(count)); },
                              troupe::errc::device_unavailable, "is not available");
}

BOOST_AUTO_TEST_SUITE_END()

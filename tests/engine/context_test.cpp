#include <sstream>

#include <boost/test/unit_test.hpp>

#include "engine/context.hpp"
#include "kernels/cuda/device.hpp"

using troupe::context;

BOOST_AUTO_TEST_SUITE(context_suite)

BOOST_AUTO_TEST_CASE(contexts_print_as_mxnet_writes_them) {
  BOOST_TEST(context::cpu().to_string() == "cpu(0)");
  BOOST_TEST(context::cpu(3).to_string() == "cpu(3)");
  BOOST_TEST(context::gpu(1).to_string() == "gpu(1)");
  std::ostringstream out;
  out << context::gpu(2);
  BOOST_TEST(out.str() == "gpu(2)");
}

BOOST_AUTO_TEST_CASE(parse_context_accepts_exactly_what_to_string_writes) {
  BOOST_TEST((troupe::parse_context("cpu(0)") == context::cpu(0)));
  BOOST_TEST((troupe::parse_context("gpu(12)") == context::gpu(12)));
  for (const char* bad : {"cpu", "cpu()", "cpu(0", "cpu( 0)", "cpu(-1)", "cpu(+1)", "tpu(0)",
                          "cpu(0)x", "cpu(1a)", "gpu(99999999999)", ""})
    BOOST_TEST(!troupe::parse_context(bad), bad);
}

BOOST_AUTO_TEST_CASE(contexts_compare_by_kind_then_id) {
  BOOST_TEST((context::cpu(0) == context{}));
  BOOST_TEST((context::cpu(0) != context::cpu(1)));
  BOOST_TEST((context::cpu(5) < context::gpu(0)));
  BOOST_TEST((context::gpu(0) < context::gpu(1)));
  BOOST_TEST(context::gpu(0).is_gpu());
  BOOST_TEST(context::cpu(0).is_cpu());
}

BOOST_AUTO_TEST_CASE(num_gpus_is_what_the_cuda_kernels_report) {
  BOOST_TEST(troupe::num_gpus() == troupe::kernels::cuda::device_count());
  if (!troupe::kernels::cuda::built_with_cuda())
    BOOST_TEST(troupe::num_gpus() == 0);
}

BOOST_AUTO_TEST_SUITE_END()

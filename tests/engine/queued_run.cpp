// With TROUPE_TEST_ENGINE=queued, the whole engine suite runs with every context's work queued on
// a thread of its own (the engine_tests_queued CTest entry): the results must not change.

#include <cstdlib>
#include <memory>
#include <string_view>

#include <boost/test/unit_test.hpp>

#include "tests/engine/lane_threads.hpp"

namespace {

struct engine_for_the_run {
  engine_for_the_run() {
    const char* wanted = std::getenv("TROUPE_TEST_ENGINE");
    if (wanted != nullptr && std::string_view{wanted} == "queued")
      queued = std::make_unique<troupe::test::queued_engine>();
  }
  std::unique_ptr<troupe::test::queued_engine> queued;
};

} // namespace

BOOST_TEST_GLOBAL_FIXTURE(engine_for_the_run);

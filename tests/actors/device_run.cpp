// With TROUPE_TEST_ENGINE=device, a whole suite runs with device actors
// (actors/device_actors.hpp) as the engine's backend: every context's work is queued on its own
// actor, and the results must be those of the naive engine. CTest runs kvstore_tests and
// gluon_tests both ways.

#include <cstdlib>
#include <memory>
#include <string_view>

#include <boost/test/unit_test.hpp>

#include "actors/device_actors.hpp"

namespace {

struct engine_for_the_run {
  engine_for_the_run() {
    const char* wanted = std::getenv("TROUPE_TEST_ENGINE");
    if (wanted != nullptr && std::string_view{wanted} == "device")
      devices = std::make_unique<troupe::device_scope>();
  }
  std::unique_ptr<troupe::device_scope> devices;
};

} // namespace

BOOST_TEST_GLOBAL_FIXTURE(engine_for_the_run);

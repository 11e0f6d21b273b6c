#pragma once
// Helpers shared by the engine test files.

#include <string>
#include <string_view>

#include <boost/test/unit_test.hpp>

#include "engine/context.hpp"
#include "engine/error.hpp"

namespace troupe::test {

/// Runs `action`, which must throw troupe::exception with `code` and a message containing
/// `fragment`; anything else is a test failure.
template <class Action>
void require_error(Action&& action, errc code, std::string_view fragment) {
  try {
    action();
  } catch (const exception& thrown) {
    BOOST_TEST(to_string(thrown.error().code()) == to_string(code));
    const std::string& message = thrown.error().message();
    BOOST_TEST(message.find(fragment) != std::string::npos,
               "message \"" << message << "\" does not contain \"" << fragment << "\"");
    return;
  }
  BOOST_ERROR("expected troupe::exception " << to_string(code) << " containing \"" << fragment
                                            << "\", nothing was thrown");
}

/// Boost.Test precondition: the test runs only where a GPU is present, and is reported as
/// skipped (not passed) elsewhere. A function, not a functor: Boost 1.74's boost::function copy
/// of an empty functor trips g++ 12's -Wuninitialized.
inline boost::test_tools::assertion_result gpu_present(boost::unit_test::test_unit_id) {
  if (num_gpus() > 0)
    return true;
  BOOST_TEST_MESSAGE("skipping a GPU test: this process sees no CUDA device");
  boost::test_tools::assertion_result result{false};
  result.message() << "no CUDA device (num_gpus() == 0)";
  return result;
}

/// The converse: tests of what happens without a GPU.
inline boost::test_tools::assertion_result gpu_absent(boost::unit_test::test_unit_id) {
  if (num_gpus() == 0)
    return true;
  boost::test_tools::assertion_result result{false};
  result.message() << "a CUDA device is present";
  return result;
}

} // namespace troupe::test

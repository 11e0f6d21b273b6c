// resolve_update_on_kvstore against MXNet 1.x gluon Trainer::_init_kvstore (dense weights and
// gradients): every kvstore type x optimizer capability x user choice, written out.

#include <optional>
#include <string>
#include <string_view>

#include <boost/test/unit_test.hpp>

#include "actors/gluon/update_policy.hpp"

using troupe::errc;
using troupe::resolve_update_on_kvstore;

namespace {

enum class outcome { on_kvstore, on_worker, async_error, capability_error };

struct row {
  std::string_view type;
  bool capable;
  std::optional<bool> user;
  outcome expected;
};

constexpr auto none = std::nullopt;

// clang-format off
const row table[] = {
  // type                 capable user   expected
  {"local",              true,  none,  outcome::on_kvstore},
  {"local",              true,  true,  outcome::on_kvstore},
  {"local",              true,  false, outcome::on_worker},
  {"local",              false, none,  outcome::on_worker},
  {"local",              false, true,  outcome::capability_error},
  {"local",              false, false, outcome::on_worker},

  {"device",             true,  none,  outcome::on_kvstore},
  {"device",             true,  true,  outcome::on_kvstore},
  {"device",             true,  false, outcome::on_worker},
  {"device",             false, none,  outcome::on_worker},
  {"device",             false, true,  outcome::capability_error},
  {"device",             false, false, outcome::on_worker},

  {"dist_sync",          true,  none,  outcome::on_kvstore},
  {"dist_sync",          true,  true,  outcome::on_kvstore},
  {"dist_sync",          true,  false, outcome::on_worker},
  {"dist_sync",          false, none,  outcome::on_worker},
  {"dist_sync",          false, true,  outcome::capability_error},
  {"dist_sync",          false, false, outcome::on_worker},

  {"dist_async",         true,  none,  outcome::on_kvstore},
  {"dist_async",         true,  true,  outcome::on_kvstore},
  {"dist_async",         true,  false, outcome::async_error},
  {"dist_async",         false, none,  outcome::on_worker},
  {"dist_async",         false, true,  outcome::capability_error},
  {"dist_async",         false, false, outcome::async_error},

  {"dist_device_sync",   true,  none,  outcome::on_kvstore},
  {"dist_device_sync",   true,  true,  outcome::on_kvstore},
  {"dist_device_sync",   true,  false, outcome::on_worker},
  {"dist_device_sync",   false, none,  outcome::on_worker},
  {"dist_device_sync",   false, true,  outcome::capability_error},
  {"dist_device_sync",   false, false, outcome::on_worker},

  {"dist_device_async",  true,  none,  outcome::on_kvstore},
  {"dist_device_async",  true,  true,  outcome::on_kvstore},
  {"dist_device_async",  true,  false, outcome::async_error},
  {"dist_device_async",  false, none,  outcome::on_worker},
  {"dist_device_async",  false, true,  outcome::capability_error},
  {"dist_device_async",  false, false, outcome::async_error},
};
// clang-format on

std::string describe(const row& r) {
  return std::string(r.type) + (r.capable ? " capable" : " not capable") +
         " user=" + (r.user ? (*r.user ? "true" : "false") : "none");
}

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

} // namespace

BOOST_AUTO_TEST_SUITE(update_policy_suite)

BOOST_AUTO_TEST_CASE(every_type_capability_and_user_choice_resolves_as_mxnet_trainer_does) {
  BOOST_TEST(std::size(table) == 36U);
  for (const row& r : table) {
    BOOST_TEST_CONTEXT(describe(r)) {
      auto resolved = resolve_update_on_kvstore(r.type, r.capable, r.user);
      switch (r.expected) {
      case outcome::on_kvstore:
      case outcome::on_worker:
        BOOST_TEST_REQUIRE(resolved.has_value());
        BOOST_TEST(*resolved == (r.expected == outcome::on_kvstore));
        break;
      case outcome::async_error:
        BOOST_TEST_REQUIRE(!resolved.has_value());
        BOOST_TEST(resolved.error().code() == errc::invalid_argument);
        BOOST_TEST(contains(resolved.error().message(),
                            "Please set update_on_kvstore=True when training in async mode."));
        BOOST_TEST(contains(resolved.error().message(), r.type));
        break;
      case outcome::capability_error:
        BOOST_TEST_REQUIRE(!resolved.has_value());
        BOOST_TEST(resolved.error().code() == errc::invalid_argument);
        BOOST_TEST(contains(resolved.error().message(),
                            "Please set update_on_kvstore=False when training with"));
        BOOST_TEST(contains(resolved.error().message(), r.type));
        break;
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

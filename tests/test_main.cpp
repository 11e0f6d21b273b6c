// The one translation unit of each test executable that defines Boost.Test's main().
#define BOOST_TEST_MODULE troupe
#include <boost/test/unit_test.hpp>

#pragma once
// A temporary directory of a test's own, for the files it writes (configs, pid files, states).

#include <filesystem>
#include <fstream>
#include <stdlib.h>
#include <string>
#include <system_error>

#include <boost/test/unit_test.hpp>

namespace troupe::testing {

/// A fresh directory under the system's temp dir, removed with everything in it.
class temp_dir {
public:
  temp_dir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "troupe-test-XXXXXX").string();
    BOOST_TEST_REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~temp_dir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// The path of `name` inside the directory.
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  std::filesystem::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
    return path_ / name;
  }
  /// As write, then with permission bits `mode` (0600: only the owner may read or write it, as a
  /// token must be kept).
  std::filesystem::path write(const std::string& name, const std::string& text,
                              unsigned mode) const {
    auto file = write(name, text);
    std::filesystem::permissions(file, static_cast<std::filesystem::perms>(mode));
    return file;
  }

private:
  std::filesystem::path path_;
};

} // namespace troupe::testing

// libFuzzer target: a cluster configuration file as every program reads it (load_config, then the
// checks of each role). The input is the file's text, handed over as a memory file; no
// environment and no flags. A broken file must give an error, never a crash.

#include <cstddef>
#include <cstdint>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

#include "actors/config/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace troupe;
  const int fd = ::memfd_create("troupe-fuzz-config", MFD_CLOEXEC);
  if (fd < 0)
    return 0;
  std::size_t written = 0;
  while (written < size) {
    const auto n = ::write(fd, data + written, size - written);
    if (n <= 0)
      break;
    written += static_cast<std::size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto loaded = load_config(path, environment_from({}), config_overrides{});
  if (loaded)
    for (auto role : {node_role::scheduler, node_role::server, node_role::worker})
      (void)validate_for_role(*loaded, role);
  ::close(fd);
  return 0;
}

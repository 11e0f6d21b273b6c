#include "engine/blas_setup.hpp"

#include <cstdlib>
#include <string_view>
#include <unistd.h>

#include "kernels/cpu/gemm.hpp"

namespace troupe {

const char* suited_openblas_core() noexcept {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return "Haswell";
#endif
  return nullptr;
}

void reexec_with_suited_openblas_core(char** argv) noexcept {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr)
    return;
  const char* chosen = kernels::cpu::blas_core_name();
  if (chosen == nullptr || std::string_view{chosen} != "Prescott")
    return;
  const char* core = suited_openblas_core();
  if (core == nullptr || setenv("OPENBLAS_CORETYPE", core, 1) != 0)
    return;
  execv("/proc/self/exe", argv);
  // Still here: the re-exec failed; carry on with the kernels already loaded.
}

} // namespace troupe

#pragma once
// OpenBLAS picks its kernels once, when the library loads, from the CPU's family and model
// numbers. Debian 12's OpenBLAS 0.3.21 does not recognise the Xeons of this project's machines
// (they report "Intel(R) Xeon(R) Processor" with AVX-512) and falls back to its oldest x86-64
// kernels (Prescott, SSE3): a 128×784×256 SGEMM then runs at 16-30 GFLOP/s against 129 with the
// SkylakeX kernels on the same machine. The only way to choose is the OPENBLAS_CORETYPE
// environment variable, read at load time, so a program that wants the right kernels must set it
// and start itself again before any GEMM.

namespace troupe {

/// The OpenBLAS core name that suits this CPU by its instruction-set flags ("SkylakeX" with
/// AVX-512, "Haswell" with AVX2 and FMA), or nullptr when there is none better than the
/// library's fallback.
const char* suited_openblas_core() noexcept;

/// When OPENBLAS_CORETYPE is unset, the library fell back to its Prescott kernels and a suited
/// core exists: sets the variable and re-executes the running program (/proc/self/exe) with the
/// same arguments. Returns when nothing needs doing or the re-exec failed (the program then runs
/// on the slow kernels). Call first in main().
void reexec_with_suited_openblas_core(char** argv) noexcept;

} // namespace troupe

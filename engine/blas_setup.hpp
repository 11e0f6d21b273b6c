#pragma once
// OpenBLAS picks its kernels once, when the library loads, from the CPU's family and model
// numbers. On virtual machines that report a generic "Intel Xeon Processor" it falls back to
// its oldest x86-64 kernels (Prescott, SSE3): a 128×784×256 SGEMM then runs at 16-30 GFLOP/s
// against 129 with the SkylakeX kernels on the same machine. The only way to choose is the
// OPENBLAS_CORETYPE environment variable, read at load time, so a program that wants the right
// kernels must set it and start itself again before any GEMM.

namespace troupe {

/// The OpenBLAS core name that suits this CPU by its instruction-set flags ("SkylakeX" with
/// AVX-512, "Haswell" with AVX2 and FMA), or nullptr when the library's own choice should stand.
const char* suited_openblas_core() noexcept;

/// When OPENBLAS_CORETYPE is unset and a suited core exists, sets it and re-executes the
/// running program (/proc/self/exe) with the same arguments; returns when nothing needs doing or
/// the re-exec failed (the program then runs with the library's choice). Call first in main().
/// TROUPE_KEEP_BLAS_CORE=1 turns this off.
void reexec_with_suited_openblas_core(char** argv) noexcept;

} // namespace troupe

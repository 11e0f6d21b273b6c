#pragma once
// Internal to the CPU-only build's kernels/cuda/*_none.cpp: the one error every call that needs a
// device throws there.

namespace troupe::kernels::cuda::detail {

/// Throws std::runtime_error "troupe::kernels::cuda::<function> on device <device>: troupe was
/// built without CUDA (TROUPE_ENABLE_CUDA=OFF or no nvcc)".
[[noreturn]] void built_without_cuda(const char* function, int device);

} // namespace troupe::kernels::cuda::detail

#pragma once
// Shared by the optimizer tests (optimizer_rules_test.cpp, cuda_optimizer_test.cpp): the
// combinations of the rules' optional parts that both sweep, and their gradient settings.

#include <cstddef>
#include <vector>

#include "kernels/cpu/optimizer_rules.hpp"

namespace troupe::kernels::testing {

/// One combination of the optional parts of the rules.
struct variant {
  float rescale_grad;
  float clip_gradient; ///< < 0: off
  float wd;
  float momentum;     ///< SGD and NAG's (and, on the GPU, centered RMSProp's gamma2)
  float clip_weights; ///< < 0: off (RMSProp only)
};

/// Every combination of gradient clipping, weight decay (off, or `wd`), momentum, gradient
/// rescaling and weight clipping on the small sizes; on 1M elements only "everything off" and
/// "everything on" so that the suite stays fast.
inline std::vector<variant> variants_for(std::size_t n, float wd) {
  std::vector<variant> out;
  for (float clip : {-1.0f, 0.5f})
    for (float decay : {0.0f, wd})
      for (float momentum : {0.0f, 0.9f})
        for (float rescale : {1.0f, 0.25f})
          for (float clip_weights : {-1.0f, 0.8f}) {
            const bool all_off =
                clip < 0 && decay == 0 && momentum == 0 && rescale == 1.0f && clip_weights < 0;
            const bool all_on =
                clip >= 0 && decay > 0 && momentum > 0 && rescale != 1.0f && clip_weights >= 0;
            if (n < 1'000'000 || all_off || all_on)
              out.push_back({rescale, clip, decay, momentum, clip_weights});
          }
  return out;
}

inline cpu::gradient_settings settings_of(const variant& v) {
  return {v.rescale_grad, v.clip_gradient};
}

} // namespace troupe::kernels::testing

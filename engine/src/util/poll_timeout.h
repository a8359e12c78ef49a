// The timeout argument of poll(2) for a wait that ends at a deadline.
#pragma once

#include <algorithm>
#include <chrono>

namespace gpuckpt {

// Milliseconds until `deadline`, rounded up and clamped to [0, 2^30]. Rounded up because a poll
// that wakes before the deadline reads as a timeout while time is left: a caller that then tries
// again, in that last millisecond, times out the same way and loses what it saw before.
inline int poll_timeout_ms(std::chrono::steady_clock::time_point deadline) {
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, 1 << 30));
}

}  // namespace gpuckpt

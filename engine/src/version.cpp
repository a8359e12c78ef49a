#include "gpuckpt/gpuckpt.h"

namespace gpuckpt {
const char* version() noexcept {
  return GPUCKPT_VERSION;
}
}  // namespace gpuckpt

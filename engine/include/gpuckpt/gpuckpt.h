// gpuckpt's checkpoint API: the public headers of the checkpoint core. Reporting (the roofline
// and the transient report) is a separate library with its own headers, gpuckpt/roofline.h and
// gpuckpt/report.h, which only its users include.
#pragma once

#include "gpuckpt/device.h"
#include "gpuckpt/error.h"
#include "gpuckpt/image.h"
#include "gpuckpt/process.h"
#include "gpuckpt/progress.h"
#include "gpuckpt/timing.h"

namespace gpuckpt {
const char* version() noexcept;
}  // namespace gpuckpt

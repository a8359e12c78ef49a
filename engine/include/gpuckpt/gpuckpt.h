// gpuckpt's public interface: the only headers the CLI (and other users) include.
#pragma once

#include "gpuckpt/error.h"
#include "gpuckpt/image.h"
#include "gpuckpt/process.h"
#include "gpuckpt/device.h"
#include "gpuckpt/roofline.h"
#include "gpuckpt/report.h"
#include "gpuckpt/progress.h"
#include "gpuckpt/timing.h"

namespace gpuckpt {
const char* version() noexcept;
}  // namespace gpuckpt

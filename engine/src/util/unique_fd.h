// UniqueFd is public (the CLI owns fds too): gpuckpt/unique_fd.h.
#pragma once

#include "gpuckpt/unique_fd.h"

// migrate --to ssh://[USER@]HOST[:PORT]: to another host, over one SSH connection
// (process/migrate_ssh.cpp, remote/ssh.h).
#pragma once

#include "gpuckpt/process.h"

namespace gpuckpt::process {

MigrateResult migrate_over_ssh(const MigrateOptions& o);

}  // namespace gpuckpt::process

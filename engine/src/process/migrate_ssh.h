// migrate --to ssh://[USER@]HOST[:PORT]: to another host, over one SSH connection
// (process/migrate_ssh.cpp, remote/ssh.h); and the steps both kinds of migration share
// (process/migrate.cpp).
#pragma once

#include <filesystem>

#include "gpuckpt/process.h"
#include "process/dump_impl.h"
#include "process/guard.h"

namespace gpuckpt::process {

MigrateResult migrate_over_ssh(const MigrateOptions& o);

// The dump of a migration: to `output`, the tree kept stopped (dump_keep_stopped).
DumpOptions migration_dump(const MigrateOptions& o, const std::filesystem::path& output);
// A release handoff: the original tree ends now that `checkpoint` is durable, and from here on
// the guard's rollback restores it from there. Timed as "end_original".
void release_original(const MigrateOptions& o, const DumpOutcome& dumped,
                      const std::filesystem::path& checkpoint, Guard& guard, Timeline& tl);

}  // namespace gpuckpt::process

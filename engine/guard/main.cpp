// gpuckpt-guard: started by gpuckpt before it freezes anything; undoes the operation if gpuckpt
// dies or asks for a rollback. Commands on stdin, its summary on stdout (process/guard.h).
#include <cstring>

#include "process/guard.h"

int main(int argc, char** argv) {
  // `--operation NAME [--journal PATH]`: the name is only for process listings, the journal is
  // the operation's (process/journal.h). Nothing else is accepted, so nobody mistakes it for a
  // tool to run by hand.
  if ((argc != 3 && argc != 5) || std::strcmp(argv[1], "--operation") != 0) return 2;
  if (argc == 5 && std::strcmp(argv[3], "--journal") != 0) return 2;
  return gpuckpt::process::guard_main(0, 1, argc == 5 ? argv[4] : "");
}

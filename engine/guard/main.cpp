// gpuckpt-guard: started by gpuckpt before it freezes anything; undoes the operation if gpuckpt
// dies or asks for a rollback. Commands on stdin, its summary on stdout (process/guard.h).
#include <cstring>

#include "process/guard.h"

int main(int argc, char** argv) {
  // `--operation NAME` only names the guard in process listings; nothing else is accepted, so
  // nobody mistakes it for a tool to run by hand.
  if (argc != 3 || std::strcmp(argv[1], "--operation") != 0) return 2;
  return gpuckpt::process::guard_main(0, 1);
}

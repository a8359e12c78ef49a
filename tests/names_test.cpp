// The names gpuckpt's timelines and fault points share (gpuckpt/names.h): each is one that the
// documentation describes, so that a stage a report shows or a point a test stops at is known.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gpuckpt/names.h"

namespace gpuckpt {
namespace {

std::string process_doc() {
  std::ifstream in(std::string(GPUCKPT_SOURCE_DIR) + "/docs/PROCESS.md");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Names, EveryStageIsDescribedWhereTheStagesAre) {
  const std::string doc = process_doc();
  const auto at = doc.find("\n## Stages");
  ASSERT_NE(at, std::string::npos) << "docs/PROCESS.md has no Stages section";
  const std::string section = doc.substr(at, doc.find("\n## ", at + 1) - at);
  for (const char* s : stage::kAll)
    EXPECT_NE(section.find("`" + std::string(s) + "`"), std::string::npos)
        << "stage " << s << " has no row in docs/PROCESS.md, \"Stages\"";
}

TEST(Names, EveryFaultPointIsListedForTheTestsThatUseIt) {
  const std::string doc = process_doc();
  const auto at = doc.find("Test hook: `$GPUCKPT_FAULT_PAUSE=POINT`");
  ASSERT_NE(at, std::string::npos) << "docs/PROCESS.md lists no fault points";
  const std::string list = doc.substr(at, 4000);
  for (const char* p : fault::kAll)
    EXPECT_NE(list.find("`" + std::string(p) + "`"), std::string::npos)
        << "fault point " << p << " is not in docs/PROCESS.md's list";
}

}  // namespace
}  // namespace gpuckpt

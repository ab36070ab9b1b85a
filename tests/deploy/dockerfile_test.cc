// deploy/docker/Dockerfile, checked without a Docker engine (container_test builds and runs
// the image where one runs): it is read instruction by instruction and held against the set-up
// script, the CMake targets and the binaries of this build. Two stages on debian:12; the build
// stage runs deploy/setup.sh with only settings the script knows; the runtime stage copies binaries
// that are CMake executables, installs the Debian package of every shared library they link (ldd
// and dpkg -S on this build) and runs as a non-root user.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace stratum {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

struct Instruction {
  std::string keyword;  // upper case: FROM, RUN, COPY, ...
  std::string args;     // continuation lines joined with spaces
};

struct Stage {
  std::string image;
  std::string name;
  std::vector<Instruction> instructions;
};

struct Dockerfile {
  std::map<std::string, std::string> global_args;  // ARGs before the first FROM
  std::vector<Stage> stages;
};

// Docker's syntax, as much of it as the file uses: comment lines (also inside a
// continued instruction), "\" continuations, ARG defaults substituted into FROM.
Dockerfile Parse(const std::string& text) {
  Dockerfile file;
  std::vector<std::string> logical;
  std::string current;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const std::string trimmed(absl::StripAsciiWhitespace(line));
    if (trimmed.empty() || trimmed.front() == '#') continue;
    if (absl::EndsWith(trimmed, "\\")) {
      current += trimmed.substr(0, trimmed.size() - 1) + " ";
      continue;
    }
    logical.push_back(current + trimmed);
    current.clear();
  }
  for (const std::string& line : logical) {
    const size_t space = line.find(' ');
    Instruction instruction{absl::AsciiStrToUpper(line.substr(0, space)),
                            space == std::string::npos ? "" : line.substr(space + 1)};
    if (instruction.keyword == "FROM") {
      std::vector<std::string> words = absl::StrSplit(instruction.args, ' ', absl::SkipEmpty());
      Stage stage;
      stage.image = words.at(0);
      for (const auto& [name, value] : file.global_args) {
        stage.image = std::regex_replace(stage.image, std::regex("\\$\\{" + name + "\\}"), value);
      }
      if (words.size() == 3 && absl::AsciiStrToUpper(words[1]) == "AS") stage.name = words[2];
      file.stages.push_back(stage);
    } else if (file.stages.empty()) {
      if (instruction.keyword == "ARG") {
        std::pair<std::string, std::string> arg = absl::StrSplit(instruction.args, '=');
        file.global_args[arg.first] = arg.second;
      }
    } else {
      file.stages.back().instructions.push_back(instruction);
    }
  }
  return file;
}

// Runs a shell command; its standard output.
std::string Shell(const std::string& command) {
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  pclose(pipe);
  return output;
}

class DockerfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dockerfile_ = Parse(ReadFile(source_ / "deploy/docker/Dockerfile"));
    ASSERT_EQ(dockerfile_.stages.size(), 2u) << "expected a build and a runtime stage";
  }

  const Stage& build() const { return dockerfile_.stages[0]; }
  const Stage& runtime() const { return dockerfile_.stages[1]; }

  // The binaries the runtime stage copies from the build stage, by file name.
  std::vector<std::string> CopiedBinaries() const {
    std::vector<std::string> binaries;
    for (const Instruction& instruction : runtime().instructions) {
      if (instruction.keyword != "COPY" || !absl::StartsWith(instruction.args, "--from=build ")) {
        continue;
      }
      std::vector<std::string> words = absl::StrSplit(instruction.args, ' ', absl::SkipEmpty());
      for (size_t i = 1; i + 1 < words.size(); ++i) {
        EXPECT_TRUE(absl::StartsWith(words[i], "/src/build/bin/"))
            << words[i] << " is not where setup.sh puts binaries (build/bin/)";
        binaries.push_back(fs::path(words[i]).filename().string());
      }
      EXPECT_EQ(words.back(), "/usr/local/bin/") << "the manifests run /usr/local/bin/<binary>";
    }
    return binaries;
  }

  // The packages the runtime stage's apt-get installs.
  std::set<std::string> RuntimePackages() const {
    std::set<std::string> packages;
    for (const Instruction& instruction : runtime().instructions) {
      if (instruction.keyword != "RUN" || !absl::StrContains(instruction.args, "apt-get install")) {
        continue;
      }
      std::string command(instruction.args.substr(instruction.args.find("apt-get install")));
      command = command.substr(0, command.find("&&"));
      for (absl::string_view word : absl::StrSplit(command, ' ', absl::SkipEmpty())) {
        if (word != "apt-get" && word != "install" && !absl::StartsWith(word, "-")) {
          packages.insert(std::string(word));
        }
      }
    }
    return packages;
  }

  const fs::path source_ = STRATUM_SOURCE_DIR;
  const fs::path bin_dir_ = STRATUM_BIN_DIR;
  Dockerfile dockerfile_;
};

TEST_F(DockerfileTest, TwoStagesOnDebian12) {
  EXPECT_EQ(build().image, "debian:12");
  EXPECT_EQ(build().name, "build");
  EXPECT_EQ(runtime().image, "debian:12");
  EXPECT_EQ(runtime().name, "runtime");
}

TEST_F(DockerfileTest, BuildStageRunsTheSetUpScriptWithSettingsItKnows) {
  const std::string setup = ReadFile(source_ / "deploy/setup.sh");
  bool copied_sources = false, ran_setup = false;
  std::string workdir;
  for (const Instruction& instruction : build().instructions) {
    if (instruction.keyword == "WORKDIR") workdir = instruction.args;
    if (instruction.keyword == "COPY" && instruction.args == ". .") copied_sources = true;
    if (instruction.keyword != "RUN" || !absl::StrContains(instruction.args, "deploy/setup.sh")) {
      continue;
    }
    ran_setup = true;
    EXPECT_TRUE(copied_sources) << "setup.sh runs before the sources are copied";
    for (absl::string_view word : absl::StrSplit(instruction.args, ' ', absl::SkipEmpty())) {
      if (absl::StrContains(word, "=") && !absl::StartsWith(word, "-")) {
        const std::string variable(word.substr(0, word.find('=')));
        EXPECT_THAT(setup, ::testing::HasSubstr("${" + variable))
            << "setup.sh does not read " << variable;
      } else if (absl::StartsWith(word, "--")) {
        EXPECT_THAT(setup, ::testing::HasSubstr(std::string(word) + ")"))
            << "setup.sh has no option " << word;
      }
    }
  }
  EXPECT_TRUE(ran_setup) << "the build stage does not run deploy/setup.sh";
  EXPECT_EQ(workdir, "/src") << "the runtime stage copies from /src/build/bin";
  EXPECT_THAT(setup, ::testing::HasSubstr("build_dir=\"${BUILD_DIR:-$repo/build}\""));
}

TEST_F(DockerfileTest, RuntimeStageRunsAsANonRootUser) {
  std::string user;
  for (const Instruction& instruction : runtime().instructions) {
    if (instruction.keyword == "USER") user = instruction.args;
  }
  ASSERT_FALSE(user.empty()) << "the runtime stage has no USER, so it runs as root";
  const std::string uid = user.substr(0, user.find(':'));
  EXPECT_NE(uid, "root");
  EXPECT_NE(uid, "0");
  // Numeric, so that Kubernetes' runAsNonRoot can check it.
  EXPECT_TRUE(std::all_of(uid.begin(), uid.end(), [](char c) { return absl::ascii_isdigit(c); }))
      << user;
}

TEST_F(DockerfileTest, CopiedBinariesAreCMakeExecutablesOfThisBuild) {
  std::string cmake_lists;
  for (auto it = fs::recursive_directory_iterator(source_);
       it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() && (absl::StartsWith(name, "build") || absl::StartsWith(name, "."))) {
      it.disable_recursion_pending();  // build trees and .git
    } else if (name == "CMakeLists.txt") {
      cmake_lists += ReadFile(it->path());
    }
  }
  const std::vector<std::string> binaries = CopiedBinaries();
  for (const char* role :
       {"stratum-coordinator", "stratum-worker", "stratum-ps", "stratum-launch", "stratum-train"}) {
    EXPECT_THAT(binaries, ::testing::Contains(role));
  }
  for (const std::string& binary : binaries) {
    EXPECT_THAT(cmake_lists, ::testing::HasSubstr("add_executable(" + binary + " "))
        << binary << " is not a CMake executable";
    EXPECT_TRUE(fs::exists(bin_dir_ / binary)) << binary << " was not built into " << bin_dir_;
  }
}

TEST_F(DockerfileTest, CopiesEveryExampleJob) {
  std::string copies;
  for (const Instruction& instruction : runtime().instructions) {
    if (instruction.keyword == "COPY") copies += instruction.args + "\n";
  }
  const bool all_jobs = absl::StrContains(copies, "examples/*.json");
  for (const auto& entry : fs::directory_iterator(source_ / "examples")) {
    if (entry.path().extension() != ".json" || all_jobs) continue;
    EXPECT_THAT(copies, ::testing::HasSubstr("examples/" + entry.path().filename().string()));
  }
  // The examples read Fashion-MNIST from Debian's package.
  EXPECT_THAT(RuntimePackages(), ::testing::Contains("dataset-fashion-mnist"));
}

TEST_F(DockerfileTest, RuntimeStageInstallsEveryLibraryTheBinariesLink) {
  if (Shell("command -v ldd && command -v dpkg").empty()) {
    GTEST_SKIP() << "ldd or dpkg is missing: the library check needs a Debian machine";
  }
  // In debian:12 itself (Priority: required), so not installed again.
  const std::set<std::string> in_base = {"libc6", "libgcc-s1", "libstdc++6"};
  const std::set<std::string> installed = RuntimePackages();
  std::map<std::string, std::set<std::string>> linked_by;  // library -> binaries
  for (const std::string& binary : CopiedBinaries()) {
    const std::string ldd = Shell("ldd '" + (bin_dir_ / binary).string() + "'");
    for (absl::string_view line : absl::StrSplit(ldd, '\n')) {
      const size_t arrow = line.find("=> /");
      if (arrow == absl::string_view::npos) continue;
      std::string library(line.substr(arrow + 3));
      library = library.substr(0, library.find(' '));
      // A CUDA build's libraries come with a CUDA base image, not from Debian.
      if (!absl::StartsWith(library, "/usr/local/cuda")) linked_by[library].insert(binary);
    }
  }
  ASSERT_FALSE(linked_by.empty()) << "ldd found no shared library";
  // One dpkg -S for all: each library by the path ldd gives and by its real path (with
  // /lib merged into /usr/lib, dpkg knows some by one and some by the other).
  std::string query = "dpkg -S";
  for (const auto& [library, binaries] : linked_by) {
    query += " '" + library + "' '" + fs::canonical(library).string() + "'";
  }
  std::map<std::string, std::string> owner_of;  // path -> package
  for (absl::string_view line : absl::StrSplit(Shell(query + " 2>/dev/null"), '\n')) {
    const size_t colon = line.find(": /");
    if (colon == absl::string_view::npos) continue;
    std::string package(line.substr(0, colon));
    package = package.substr(0, package.find_first_of(":,"));
    owner_of[std::string(line.substr(colon + 2))] = package;
  }
  std::set<std::string> missing;
  for (const auto& [library, binaries] : linked_by) {
    auto owner = owner_of.find(library);
    if (owner == owner_of.end()) owner = owner_of.find(fs::canonical(library).string());
    ASSERT_NE(owner, owner_of.end()) << library << " (linked by " << absl::StrJoin(binaries, ", ")
                                     << ") belongs to no Debian package";
    if (!in_base.count(owner->second) && !installed.count(owner->second)) {
      missing.insert(owner->second + " (" + library + ", linked by " +
                     absl::StrJoin(binaries, ", ") + ")");
    }
  }
  EXPECT_TRUE(missing.empty()) << "add to the runtime stage's apt-get install: "
                               << absl::StrJoin(missing, ", ");
}

}  // namespace
}  // namespace stratum

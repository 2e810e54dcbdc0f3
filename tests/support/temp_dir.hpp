// A directory of its own under the system's temporary directory, removed with everything in it
// when the test is done.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace walgate::test {

struct temp_dir {
  std::filesystem::path path;
  explicit temp_dir(const char* prefix = "walgate-test") {
    std::string t = (std::filesystem::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
    path = mkdtemp(t.data());
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

}  // namespace walgate::test

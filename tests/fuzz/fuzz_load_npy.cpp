// libFuzzer target for load_npy: every input is written to a file and loaded as float and
// double tensors of rank 1 to 3. Any outcome but a tensor, an npy_error or a shape_error (a
// crash, a hang, a sanitizer report, another exception) is a finding. Built and run for a
// minute by scripts/sanitize.sh, seeded with tests/reference/*.npy:
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude tests/fuzz/fuzz_load_npy.cpp
#include <dimsum/interop/npy.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <unistd.h>

namespace ds = dimsum;

namespace {

using A = ds::axis<"a">;
using B = ds::axis<"b">;
using C = ds::axis<"c">;

template <class F>
void expect_clean(F&& load) {
    try {
        load();
    } catch (const ds::npy_error&) {
    } catch (const ds::shape_error&) {
    }
}

const std::string& scratch_path() {
    static const std::string path = std::string(access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") +
                                    "/dimsum_fuzz_" + std::to_string(getpid()) + ".npy";
    return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string& path = scratch_path();
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return 0;
    std::fwrite(data, 1, size, f);
    std::fclose(f);
    expect_clean([&] { ds::load_npy<float, A, B>(path); });
    expect_clean([&] { ds::load_npy<double, A>(path); });
    expect_clean([&] { ds::load_npy<float, A, B, C>(path); });
    expect_clean([&] { ds::load_npy<float, A, ds::axis<"b", 3>>(path); });
    return 0;
}

// libFuzzer target for ds::load's .npz and .safetensors readers (interop/parameters.hpp, with
// zip.hpp's inflate and safetensors.hpp's JSON): every input is written to a file of each
// format and loaded into a parameter struct shaped like tests/reference/parameters/block.*,
// which seed the run. Any outcome but a loaded layer, a file_error or a shape_error (a crash,
// a hang, a sanitizer report, another exception, an allocation past the run's memory limit)
// is a finding. Built and run by scripts/sanitize.sh:
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude tests/fuzz/fuzz_load_parameters.cpp
#include <dimsum/interop/parameters.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <unistd.h>

namespace ds = dimsum;

namespace {

using Model = ds::axis<"model", 8>;
using Fused = ds::axis<"qkv", 24>;
// Static, as the seeds' 5: then nothing a legitimate input loads needs 2 MiB at once, and
// scripts/sanitize.sh's -malloc_limit_mb=2 makes any larger allocation a finding (an 8 KiB
// input can claim an 8.5 MB deflated member, or a .npy header of 1 MiB). A run-time extent
// that a lying header makes huge is test_hostile_files' to check.
using Hidden = ds::axis<"hidden", 5>;

struct attention_weights {
    BOOST_HANA_DEFINE_STRUCT(attention_weights,
        (std::optional<ds::tensor<float, Model, Fused>>, w_qkv),
        (std::optional<ds::tensor<float, Fused>>, b_qkv),
        (ds::tensor<float, ds::axis<"inner", 8>, Model>, w_o));
};
struct feed_forward {
    BOOST_HANA_DEFINE_STRUCT(feed_forward,
        (ds::tensor<float, Model, Hidden>, w1),
        (std::optional<ds::tensor<float, Hidden>>, b1));
};
struct block {
    BOOST_HANA_DEFINE_STRUCT(block,
        (attention_weights, attention),
        (feed_forward, ff),
        (ds::tensor<double, Model>, norm));
};

std::string scratch_path(const char* extension) {
    return std::string(access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") + "/dimsum_fuzz_" +
           std::to_string(getpid()) + extension;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    for (const char* extension : {".npz", ".safetensors"}) {
        static const std::string npz = scratch_path(".npz"), safetensors = scratch_path(".safetensors");
        const std::string& path = extension[1] == 'n' ? npz : safetensors;
        std::FILE* f = std::fopen(path.c_str(), "wb");
        if (!f) return 0;
        std::fwrite(data, 1, size, f);
        std::fclose(f);
        block layer;
        try {
            ds::load(layer, path, {.allow_unused = true});
        } catch (const ds::file_error&) {
        } catch (const ds::shape_error&) {
        }
    }
    return 0;
}

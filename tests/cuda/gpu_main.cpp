// Catch2's main for the tests that need a GPU: without a CUDA device the program prints why
// and exits with 77, which ctest reports as "Skipped", never "Passed". DIMSUM_REQUIRE_GPU=1
// (set by scripts/gpu_check.sh on the GPU machine) turns that into a failure, so that a broken
// setup there cannot pass as skipped. Listing the tests needs no device.
#include "../support/catch_session.hpp"

#include <dimsum/backend/cuda/kernels.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

int main(int argc, char* argv[]) {
    bool listing = false;
    for (int i = 1; i < argc; ++i) listing = listing || std::string_view(argv[i]).starts_with("--list");
    if (!listing) {
        const dimsum::backend::cuda::device_status status = dimsum::backend::cuda::query_devices();
        if (status.count == 0) {
            const char* required = std::getenv("DIMSUM_REQUIRE_GPU");
            const bool must = required && std::strcmp(required, "1") == 0;
            std::printf("%s: no CUDA device (%s)\n", must ? "FAILED" : "SKIPPED", status.reason.c_str());
            return must ? 1 : 77;
        }
        std::printf("CUDA device 0: %s (runtime %d, driver %d)\n", status.name.c_str(), status.runtime_version,
                    status.driver_version);
    }
    return run_catch_session(argc, argv);
}

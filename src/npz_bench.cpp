// dimsum_npz_bench: how fast ds::checkpoint reads a compressed .npz (numpy.savez_compressed:
// every member deflated) of BERT-base size, against numpy.load of the same file in the same
// run (docs/performance.md). NumPy writes the file and times itself (scripts/npz_bench.py,
// run with /usr/bin/python3); dimsum's values are checked against NumPy's by the CRC-32 of
// each array. Both read on one thread, from the page cache (the file was just written).
//
//   dimsum_npz_bench [--scale=1] [--rounds=3] [--dir=/tmp] [--keep]
//
// --scale multiplies every extent of the model but its 12 layers (0.1 for a smoke test);
// --keep leaves the file, and reuses it if there, instead of writing it again. Exit code 77
// (a skip, for ctest) where /usr/bin/python3 or numpy is missing.
#include <dimsum/interop/parameters.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ds = dimsum;

namespace {

struct options {
    double scale = 1;
    int rounds = 3;
    std::string dir = "/tmp";
    bool keep = false;
};

options parse(int argc, char** argv) {
    options opt;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&](const std::string& key) { return a.starts_with(key) ? a.substr(key.size()) : std::string(); };
        if (!value("--scale=").empty()) opt.scale = std::stod(value("--scale="));
        else if (!value("--rounds=").empty()) opt.rounds = std::max(1, std::stoi(value("--rounds=")));
        else if (!value("--dir=").empty()) opt.dir = value("--dir=");
        else if (a == "--keep") opt.keep = true;
        else {
            std::cerr << "usage: dimsum_npz_bench [--scale=1] [--rounds=3] [--dir=/tmp] [--keep]\n";
            std::exit(2);
        }
    }
    return opt;
}

// Runs scripts/npz_bench.py with these arguments: its stdout, or exit 77 where numpy is missing.
std::string python(const std::string& arguments) {
    if (access("/usr/bin/python3", X_OK) != 0) {
        std::cout << "skipped: /usr/bin/python3 is missing\n";
        std::exit(77);
    }
    const std::string command = "/usr/bin/python3 " DIMSUM_NPZ_SCRIPT " " + arguments;
    std::FILE* child = popen(command.c_str(), "r");
    if (!child) throw std::runtime_error("cannot run " + command);
    std::string out;
    char buffer[4096];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, child)) > 0;) out.append(buffer, n);
    if (pclose(child) != 0) throw std::runtime_error("failed: " + command);
    if (out.starts_with("numpy_unavailable,")) {
        std::cout << "skipped: " << out;
        std::exit(77);
    }
    return out;
}

std::string cpu_model() {
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);) {
        if (line.starts_with("model name")) return line.substr(line.find(':') + 2);
    }
    return "unknown";
}

using clock_type = std::chrono::steady_clock;
using Rows = ds::axis<"rows">;
using Columns = ds::axis<"columns">;

// Reads one array whole (every one in the file is of rank 1 or 2), then gives f its bytes.
template <class F>
void read_array(ds::checkpoint& in, const std::string& name, F&& f) {
    const auto info = in.find(name);
    if (info->shape.size() == 1) {
        ds::tensor<float, Rows> t;
        in.read(name, t);
        f(t.data(), t.size() * sizeof(float));
    } else {
        ds::tensor<float, Rows, Columns> t;
        in.read(name, t);
        f(t.data(), t.size() * sizeof(float));
    }
}

}  // namespace

int main(int argc, char** argv) {
    const options opt = parse(argc, argv);
    const std::filesystem::path path = std::filesystem::path(opt.dir) / "dimsum_npz_bench.npz";
    if (!opt.keep || !std::filesystem::exists(path)) {
        std::cout << "writing " << path.string() << " with numpy.savez_compressed (scale " << opt.scale << ")...\n"
                  << std::flush;
        python("write " + path.string() + " " + std::to_string(opt.scale));
    }

    // 1. dimsum: every array, `rounds` times; the fastest round
    ds::checkpoint in(path);
    const std::vector<std::string> names = in.names();
    double dimsum_seconds = 1e30;
    std::uint64_t bytes = 0;
    for (int round = 0; round < opt.rounds; ++round) {
        bytes = 0;
        const auto start = clock_type::now();
        for (const std::string& name : names) read_array(in, name, [&](const void*, std::size_t n) { bytes += n; });
        dimsum_seconds = std::min(dimsum_seconds, std::chrono::duration<double>(clock_type::now() - start).count());
    }

    // 2. numpy, in a child process timing itself, and the CRC-32 of each of its arrays
    std::map<std::string, std::string> numpy_crc;
    std::uint64_t numpy_bytes = 0;
    double numpy_seconds = 0;
    std::istringstream lines(python("load " + path.string() + " " + std::to_string(opt.rounds)));
    for (std::string line; std::getline(lines, line);) {
        const std::size_t comma = line.find(','), last = line.rfind(',');
        if (line.starts_with("crc,")) numpy_crc[line.substr(comma + 1, last - comma - 1)] = line.substr(last + 1);
        if (line.starts_with("numpy,")) {
            numpy_bytes = std::stoull(line.substr(comma + 1, last - comma - 1));
            numpy_seconds = std::stod(line.substr(last + 1));
        }
    }

    // 3. the same values: dimsum's arrays against NumPy's CRCs (untimed)
    std::size_t differ = 0;
    for (const std::string& name : names) {
        read_array(in, name, [&](const void* data, std::size_t n) {
            char crc[9];
            std::snprintf(crc, sizeof crc, "%08x", ds::detail::zip::crc32(0, data, n));
            if (numpy_crc[name] != crc) ++differ;
        });
    }

    const double mb = double(bytes) / 1e6;
    std::printf("machine: %s\n", cpu_model().c_str());
    std::printf("file: %s, %.1f MB on disk, %zu arrays, %.1f MB of float32 (deflated to %.0f%%)\n", path.c_str(),
                double(std::filesystem::file_size(path)) / 1e6, names.size(), mb,
                100.0 * double(std::filesystem::file_size(path)) / double(bytes));
    std::printf("dimsum  ds::checkpoint::read  %7.3f s  %6.0f MB/s of inflated data\n", dimsum_seconds, mb / dimsum_seconds);
    std::printf("numpy   numpy.load            %7.3f s  %6.0f MB/s\n", numpy_seconds, double(numpy_bytes) / 1e6 / numpy_seconds);
    std::printf("dimsum / numpy: %.2fx (the fastest of %d rounds each, one thread)\n", numpy_seconds / dimsum_seconds,
                opt.rounds);
    std::printf("values: %s\n", differ == 0 && numpy_bytes == bytes && numpy_crc.size() == names.size()
                                    ? "the same as numpy's (CRC-32 of each array)"
                                    : "DIFFERENT from numpy's");
    if (!opt.keep) std::filesystem::remove(path);
    return differ == 0 && numpy_bytes == bytes ? 0 : 1;
}

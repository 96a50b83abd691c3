// The baselines of dimsum_bench, OpenBLAS and oneDNN. They are not linked but dlopen()ed
// once the tool has chosen OpenBLAS's kernels: OpenBLAS reads OPENBLAS_CORETYPE and
// OPENBLAS_L2_SIZE once, when it loads; a core type forced for another purpose can halve it,
// and its own detection falls back to SSE3 kernels on CPUs newer than it knows (see
// load_openblas_at_best). The environment is put back as it was as soon as it has loaded.

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#if __has_include(<dnnl.h>)
#include <dnnl.h>  // only the C API's types: its functions are found in the loaded library
#define DIMSUM_BENCH_HAS_DNNL_H 1
#endif

#include "bench.hpp"

namespace dimsum_bench {

namespace {

template <class F>
bool find_symbol(void* handle, const char* symbol, F& f) {
    f = reinterpret_cast<F>(dlsym(handle, symbol));
    return f != nullptr;
}

// The first library of the list that loads, with its name; else why each failed.
std::pair<void*, std::string> open_first(std::initializer_list<const char*> names) {
    std::string errors;
    for (const char* name : names) {
        if (void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return {handle, name};
        const char* error = dlerror();
        if (!errors.empty()) errors += "; ";
        errors += error ? error : name;
    }
    return {nullptr, errors};
}

// Loads OpenBLAS, or says in `why` why not.
std::optional<openblas> load_openblas(std::string& why) {
    auto [handle, file] = open_first({"libopenblas.so.0", "libopenblas.so"});
    if (!handle) {
        why = "not loadable (" + file + ")";
        return std::nullopt;
    }
    openblas lib;
    lib.file = file;
    if (!find_symbol(handle, "cblas_sgemm", lib.sgemm) ||
        !find_symbol(handle, "openblas_set_num_threads", lib.set_num_threads)) {
        why = file + " lacks cblas_sgemm or openblas_set_num_threads";
        return std::nullopt;
    }
    find_symbol(handle, "openblas_get_corename", lib.get_corename);
    find_symbol(handle, "openblas_get_config", lib.get_config);
    return lib;
}

// OpenBLAS's kernel families for sgemm, by the widest vectors they use: 1 SSE, 2 AVX2 and
// FMA, 3 AVX-512.
int openblas_core_level(std::string core) {
    std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return std::tolower(c); });
    for (const char* name : {"skylakex", "cooperlake", "sapphirerapids"})
        if (core == name) return 3;
    for (const char* name : {"haswell", "zen", "excavator"})
        if (core == name) return 2;
    return 1;
}

int cpu_level() {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return 3;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
    return 1;
}

// The core type OpenBLAS's own detection picks on this machine, with the variables unset,
// asked of a child process: a library loads once per process, and here it must load only
// with the final choice. Empty if it cannot tell. Called before any thread exists.
std::string detected_openblas_core() {
    int ends[2];
    if (pipe(ends) != 0) return {};
    pid_t child = fork();
    if (child < 0) {
        close(ends[0]);
        close(ends[1]);
        return {};
    }
    if (child == 0) {
        close(ends[0]);
        unsetenv("OPENBLAS_CORETYPE");
        unsetenv("OPENBLAS_L2_SIZE");
        std::string why;
        std::optional<openblas> lib = load_openblas(why);
        if (lib && lib->get_corename) {
            const char* core = lib->get_corename();
            if (write(ends[1], core, std::strlen(core)) < 0) _exit(1);
        }
        _exit(0);  // no destructors, no flush of the parent's buffers
    }
    close(ends[1]);
    std::string core;
    char buffer[64];
    for (ssize_t n; (n = read(ends[0], buffer, sizeof buffer)) > 0;) core.append(buffer, std::size_t(n));
    close(ends[0]);
    waitpid(child, nullptr, 0);
    return core;
}

// dnnl_cpu_isa_t values of oneDNN 2.x.
const char* onednn_isa_name(int isa) {
    switch (isa) {
        case 0x1: return "sse41";
        case 0x3: return "avx";
        case 0x7: return "avx2";
        case 0x27: return "avx512_core";
        case 0x67: return "avx512_core_vnni";
        case 0xe7: return "avx512_core_bf16";
        case 0x3e7: return "avx512_core_amx";
        case 0x407: return "avx2_vnni";
        default: return "other";
    }
}

}  // namespace

std::optional<onednn> load_onednn(std::string& why) {
    auto [handle, file] = open_first({"libdnnl.so.2", "libdnnl.so"});
    if (!handle) {
        why = "not loadable (" + file + ")";
        return std::nullopt;
    }
    onednn lib;
    lib.file = file;
    lib.handle = handle;
    if (!find_symbol(handle, "dnnl_sgemm", lib.sgemm)) {
        why = file + " lacks dnnl_sgemm";
        return std::nullopt;
    }
    find_symbol(handle, "dnnl_version", lib.version);
    find_symbol(handle, "dnnl_get_effective_cpu_isa", lib.effective_isa);
    return lib;
}

// ---- oneDNN's matmul primitive in bf16

#if defined(DIMSUM_BENCH_HAS_DNNL_H)
struct onednn_bf16_matmul::api {
    decltype(&dnnl_engine_create) engine_create = nullptr;
    decltype(&dnnl_engine_destroy) engine_destroy = nullptr;
    decltype(&dnnl_stream_create) stream_create = nullptr;
    decltype(&dnnl_stream_destroy) stream_destroy = nullptr;
    decltype(&dnnl_stream_wait) stream_wait = nullptr;
    decltype(&dnnl_memory_desc_init_by_tag) memory_desc_init_by_tag = nullptr;
    decltype(&dnnl_memory_create) memory_create = nullptr;
    decltype(&dnnl_memory_destroy) memory_destroy = nullptr;
    decltype(&dnnl_matmul_desc_init) matmul_desc_init = nullptr;
    decltype(&dnnl_primitive_desc_create) primitive_desc_create = nullptr;
    decltype(&dnnl_primitive_desc_query) primitive_desc_query = nullptr;
    decltype(&dnnl_primitive_desc_destroy) primitive_desc_destroy = nullptr;
    decltype(&dnnl_primitive_create) primitive_create = nullptr;
    decltype(&dnnl_primitive_execute) primitive_execute = nullptr;
    decltype(&dnnl_primitive_destroy) primitive_destroy = nullptr;
    std::string missing;  // the first function the library lacks; empty if none

    explicit api(void* handle) {
        auto find = [&](const char* symbol, auto& f) {
            if (!find_symbol(handle, symbol, f) && missing.empty()) missing = symbol;
        };
        find("dnnl_engine_create", engine_create);
        find("dnnl_engine_destroy", engine_destroy);
        find("dnnl_stream_create", stream_create);
        find("dnnl_stream_destroy", stream_destroy);
        find("dnnl_stream_wait", stream_wait);
        find("dnnl_memory_desc_init_by_tag", memory_desc_init_by_tag);
        find("dnnl_memory_create", memory_create);
        find("dnnl_memory_destroy", memory_destroy);
        find("dnnl_matmul_desc_init", matmul_desc_init);
        find("dnnl_primitive_desc_create", primitive_desc_create);
        find("dnnl_primitive_desc_query", primitive_desc_query);
        find("dnnl_primitive_desc_destroy", primitive_desc_destroy);
        find("dnnl_primitive_create", primitive_create);
        find("dnnl_primitive_execute", primitive_execute);
        find("dnnl_primitive_destroy", primitive_destroy);
    }
};

namespace {
void check_dnnl(dnnl_status_t status, const char* what) {
    if (status != dnnl_success) throw std::runtime_error(std::string("onednn: ") + what + " failed with status " + std::to_string(int(status)));
}
}  // namespace

onednn_bf16_matmul::onednn_bf16_matmul(const onednn& lib, bool b_transposed, std::size_t m, std::size_t n,
                                       std::size_t k, const void* a, const void* b, void* c) {
    static const api functions(lib.handle);  // one library per process
    if (!functions.missing.empty()) throw std::runtime_error("onednn: " + lib.file + " lacks " + functions.missing);
    api_ = &functions;
    const api& f = *api_;
    try {
        dnnl_engine_t engine;
        check_dnnl(f.engine_create(&engine, dnnl_cpu, 0), "dnnl_engine_create");
        engine_ = engine;
        dnnl_stream_t stream;
        check_dnnl(f.stream_create(&stream, engine, dnnl_stream_default_flags), "dnnl_stream_create");
        stream_ = stream;
        const dnnl_dims_t a_dims = {dnnl_dim_t(m), dnnl_dim_t(k)}, b_dims = {dnnl_dim_t(k), dnnl_dim_t(n)},
                          c_dims = {dnnl_dim_t(m), dnnl_dim_t(n)};
        dnnl_memory_desc_t descs[3];
        check_dnnl(f.memory_desc_init_by_tag(&descs[0], 2, a_dims, dnnl_bf16, dnnl_ab), "dnnl_memory_desc_init_by_tag");
        // B (k, n) stored (n, k): the (k, n) tensor with its axes permuted
        check_dnnl(f.memory_desc_init_by_tag(&descs[1], 2, b_dims, dnnl_bf16, b_transposed ? dnnl_ba : dnnl_ab),
                   "dnnl_memory_desc_init_by_tag");
        check_dnnl(f.memory_desc_init_by_tag(&descs[2], 2, c_dims, dnnl_bf16, dnnl_ab), "dnnl_memory_desc_init_by_tag");
        dnnl_matmul_desc_t desc;
        check_dnnl(f.matmul_desc_init(&desc, &descs[0], &descs[1], nullptr, &descs[2]), "dnnl_matmul_desc_init");
        dnnl_primitive_desc_t pd;
        check_dnnl(f.primitive_desc_create(&pd, &desc, nullptr, engine, nullptr), "dnnl_primitive_desc_create");
        primitive_desc_ = pd;
        const char* impl = nullptr;
        if (f.primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl) implementation_ = impl;
        dnnl_primitive_t primitive;
        check_dnnl(f.primitive_create(&primitive, pd), "dnnl_primitive_create");
        primitive_ = primitive;
        void* data[3] = {const_cast<void*>(a), const_cast<void*>(b), c};
        for (int i = 0; i < 3; ++i) {
            dnnl_memory_t memory;
            check_dnnl(f.memory_create(&memory, &descs[i], engine, data[i]), "dnnl_memory_create");
            memory_[i] = memory;
        }
    } catch (...) {
        destroy();
        throw;
    }
}

onednn_bf16_matmul::~onednn_bf16_matmul() { destroy(); }

void onednn_bf16_matmul::destroy() noexcept {
    const api& f = *api_;
    for (void*& memory : memory_) {
        if (memory) f.memory_destroy(static_cast<dnnl_memory_t>(memory));
        memory = nullptr;
    }
    if (primitive_) f.primitive_destroy(static_cast<dnnl_primitive_t>(primitive_));
    if (primitive_desc_) f.primitive_desc_destroy(static_cast<dnnl_primitive_desc_t>(primitive_desc_));
    if (stream_) f.stream_destroy(static_cast<dnnl_stream_t>(stream_));
    if (engine_) f.engine_destroy(static_cast<dnnl_engine_t>(engine_));
    primitive_ = primitive_desc_ = stream_ = engine_ = nullptr;
}

void onednn_bf16_matmul::run() const {
    const api& f = *api_;
    const dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, static_cast<dnnl_memory_t>(memory_[0])},
                                     {DNNL_ARG_WEIGHTS, static_cast<dnnl_memory_t>(memory_[1])},
                                     {DNNL_ARG_DST, static_cast<dnnl_memory_t>(memory_[2])}};
    check_dnnl(f.primitive_execute(static_cast<dnnl_primitive_t>(primitive_), static_cast<dnnl_stream_t>(stream_), 3, args),
               "dnnl_primitive_execute");
    check_dnnl(f.stream_wait(static_cast<dnnl_stream_t>(stream_)), "dnnl_stream_wait");
}
#else
struct onednn_bf16_matmul::api {};
onednn_bf16_matmul::onednn_bf16_matmul(const onednn&, bool, std::size_t, std::size_t, std::size_t, const void*, const void*,
                                       void*) {
    throw std::runtime_error("onednn: dimsum_bench was built without dnnl.h (libdnnl-dev), so without its bf16 matmul");
}
onednn_bf16_matmul::~onednn_bf16_matmul() = default;
void onednn_bf16_matmul::destroy() noexcept {}
void onednn_bf16_matmul::run() const {}
#endif

// Loads OpenBLAS at its best, changing OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE for the
// moment it loads (it reads them then) and putting them back after, so that nothing else
// sees the change. A core type set in the environment for another purpose is ignored, and
// so is OpenBLAS's own choice when its detection does not know the CPU: 0.3.21 falls back
// to Prescott (SSE3) on CPUs newer than it, e.g. family 6 model 207, at a sixth of the
// speed of its AVX-512 kernels.
std::optional<openblas> load_openblas_at_best(const report& out) {
    const char* variables[] = {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"};
    std::optional<std::string> saved[2];
    for (int i = 0; i < 2; ++i) {
        if (const char* value = std::getenv(variables[i])) saved[i] = value;
    }
    const std::string& choice = out.opt.openblas_core;
    std::string core;  // empty: OpenBLAS detects
    if (choice == "keep") {
        core = saved[0].value_or("");
    } else if (choice == "auto") {
        std::string detected = detected_openblas_core();
        int level = cpu_level();
        if (!detected.empty() && openblas_core_level(detected) < level) {
            core = level == 3 ? "SkylakeX" : "Haswell";
            std::fprintf(out.table,
                         "openblas: its own detection picks %s, below what this CPU supports: using %s "
                         "(--openblas-core=detect keeps its choice)\n",
                         detected.c_str(), core.c_str());
        }
    } else if (choice != "detect") {
        core = choice;
    }
    for (int i = 0; i < 2; ++i) {
        if (!saved[i] || choice == "keep") continue;
        std::fprintf(out.table, "openblas: %s=%s in the environment, not used here (--openblas-core=keep uses it)\n",
                     variables[i], saved[i]->c_str());
    }
    if (choice != "keep") unsetenv("OPENBLAS_L2_SIZE");
    if (core.empty()) unsetenv("OPENBLAS_CORETYPE");
    else setenv("OPENBLAS_CORETYPE", core.c_str(), 1);

    std::string why;
    std::optional<openblas> lib = load_openblas(why);
    if (!lib) std::fprintf(out.table, "skipped: openblas: %s; its rows are left out\n", why.c_str());

    for (int i = 0; i < 2; ++i) {
        if (saved[i]) setenv(variables[i], saved[i]->c_str(), 1);
        else unsetenv(variables[i]);
    }
    return lib;
}

void print_libraries(const report& out, const std::optional<openblas>& blas, const std::optional<onednn>& dnnl) {
    if (blas) {
        std::fprintf(out.table, "openblas: %s, core %s, config %s\n", blas->file.c_str(),
                     blas->get_corename ? blas->get_corename() : "?", blas->get_config ? blas->get_config() : "?");
    }
    if (dnnl) {
        const onednn::version_info* v = dnnl->version ? dnnl->version() : nullptr;
        std::fprintf(out.table, "onednn: %s", dnnl->file.c_str());
        if (v) std::fprintf(out.table, ", %d.%d.%d", v->major, v->minor, v->patch);
        if (dnnl->effective_isa) std::fprintf(out.table, ", isa %s", onednn_isa_name(dnnl->effective_isa()));
        std::fprintf(out.table, "\n");
    }
}

}  // namespace dimsum_bench

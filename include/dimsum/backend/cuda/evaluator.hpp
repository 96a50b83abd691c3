#pragma once
// The CUDA backend: formulas evaluated on the GPU. The program links dimsum::cuda.
// Their tensors may live on the device (cuda::tensor, tensor.hpp) or on the host, and so may
// the destination: `cuda::eval(f)` gives a device tensor, `ds::eval(f, cuda::evaluator{})` a
// host one. Host tensors are copied to the device for the evaluation ("staging").
//
// run(formula, destination) lowers the formula and plans it on the host as every backend
// does (evaluation/), runs the plan on the device (executor.hpp), and copies the value back
// if the destination is the host's. ds::map, whose function is host code, is refused.
// Staging copies every operand both ways on each evaluation, so it pays off only for
// formulas heavy in arithmetic (products, attention); memory-bound formulas are faster on
// the CPU backend.
//
// Device memory comes from the calling thread's arena (kernels.hpp), kept between
// evaluations: a formula evaluated in a loop allocates nothing on the device after its first
// evaluation. A host destination is written only once the device has finished without error;
// a device destination is written in place, and an error part way leaves it part written.

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "dimsum/backend/cuda/executor.hpp"
#include "dimsum/backend/cuda/kernels.hpp"
#include "dimsum/backend/cuda/view.hpp"
#include "dimsum/evaluation/convert.hpp"
#include "dimsum/evaluation/explain.hpp"
#include "dimsum/evaluation/integers.hpp"
#include "dimsum/evaluation/lower.hpp"
#include "dimsum/evaluation/plan.hpp"

namespace dimsum::backend::cuda {

namespace detail {

// Everything one evaluation needs, kept per thread and type so that it is allocated once.
template <class T>
struct state {
    evaluation::program program;
    std::vector<evaluation::binding> bindings;
    evaluation::plan plan;
    // the plan's places bound to device memory: each binding's device copy (or its own memory,
    // on the device), the temporaries in the arena, the destination
    evaluation::bound_memory memory;
    std::vector<std::byte> result;  // the destination's value, downloaded row-major
    std::vector<evaluation::layout> other_roots;  // where the other roots' values are computed (row-major)
    std::vector<evaluation::binding> checked;  // the bindings as the host checks them (device ids copied back)
    std::vector<std::vector<std::byte>> host_ids;

    static state& of_this_thread() {
        thread_local state s;
        return s;
    }
};

}  // namespace detail

class evaluator {
public:
    // How products of float compute: exactly in float (the default), or on TF32 tensor cores.
    gemm_precision precision = gemm_precision::exact;

    // Formulas of device tensors are this backend's (evaluation/assign.hpp).
    static constexpr bool reads_device_memory = true;

    // Whether attention formulas run fused (one pass, no queries x keys matrix) or step by step.
    bool fuse_attention = true;

    // Into how many ranges fused attention splits each query's keys (flash-decoding, for few
    // queries and long keys): 0 lets attention_key_splits (kernels.hpp) choose; 1 never splits.
    std::size_t key_splits = 0;

    // Epilogues run as a pass after the product.
    evaluation::planner_options planning() const { return {fuse_attention, true, false}; }

    // Writes the value of e into dst, a host view of e's shape that e does not read, once the
    // device has finished without error. A formula of bf16 is computed in float and rounded
    // on the device.
    template <class E, class T, class... A>
    void run(const E& e, const tensor_view<T, A...>& dst) {
        run_into(e, evaluation::to_strided(dst), false);
    }

    // Writes the value of e into device memory (a cuda::view of e's shape that e does not
    // read), and waits for the device.
    template <class E, class T, class... A>
    void run(const E& e, const view<T, A...>& dst) {
        run_into(e, evaluation::to_strided(dst.device_memory()), true);
    }

    // Lowers a program with lower(program, bindings), which sets its root and other roots, then
    // computes the root into `destination` and each of program::other_roots into `others`, in
    // order, planned as one program: the gradients of a parameter struct (nn/gradients.hpp),
    // a tape's backward (nn/tape.hpp). All of them host memory of T: each value is computed
    // row-major on the device and copied back once the device has finished without error.
    template <class T, class Lower>
    void run_program(Lower&& lower, const evaluation::strided<T>& destination, std::span<const evaluation::strided<T>> others) {
        auto& s = detail::state<T>::of_this_thread();
        lower(s.program, s.bindings);
        refuse_host_functions(s.program);
        const evaluation::layout where = evaluation::row_major(destination.where.rank, destination.where.extents);
        s.other_roots.clear();
        for (const evaluation::strided<T>& other : others) s.other_roots.push_back(evaluation::row_major(other.where.rank, other.where.extents));
        constexpr element_type type = evaluation::element_type_of<T>();
        evaluation::make_plan(s.program, s.bindings, where, type, planning(), s.plan, nullptr, s.other_roots);
        context& c = this_thread_context();
        evaluation::check_before_running<T>(s.program, detail::host_checkable(c, s.bindings, s.plan, s.checked, s.host_ids), s.plan);
        detail::executor<T> device(s.plan, s.bindings, s.memory, c, precision, key_splits);
        const detail::device_array value = device.run(where, 0, type, s.other_roots);
        finish(c);  // every value computed, or the first error, before any destination is written
        copy_back(c, value, destination, s.result);
        for (std::size_t r = 0; r < others.size(); ++r) {  // other root r: destination r + 1, laid out as planned
            copy_back(c, {s.memory.destinations[r + 1], type, s.other_roots[r]}, others[r], s.result);
        }
    }

    // The plan run(e, ...) follows, as text (evaluation/explain.hpp).
    template <class E>
    std::string explain(const E& e, evaluation::explain_detail detail = evaluation::explain_detail::plan) const {
        return evaluation::explain_formula<compute_type_t<value_type_of<E>>>(e, planning(), "cuda", detail);
    }

private:
    template <class E, class D>
    void run_into(const E& e, const evaluation::strided<D>& destination, bool on_device) {
        using T = compute_type_t<std::remove_const_t<D>>;
        constexpr element_type stored = evaluation::element_type_of<std::remove_const_t<D>>();
        auto& s = detail::state<T>::of_this_thread();
        evaluation::lower<T>(e, s.program, s.bindings);
        refuse_host_functions(s.program);
        // a host destination is computed row-major on the device, then copied; a formula of
        // bf16 is planned into a row-major array of float, then rounded into the destination
        const evaluation::layout row_major = evaluation::row_major(destination.where.rank, destination.where.extents);
        const evaluation::layout where = on_device ? destination.where : row_major;
        evaluation::make_plan(s.program, s.bindings, stored == evaluation::element_type_of<T>() ? where : row_major,
                              evaluation::element_type_of<T>(), planning(), s.plan);
        context& c = this_thread_context();
        evaluation::check_before_running<T>(s.program, detail::host_checkable(c, s.bindings, s.plan, s.checked, s.host_ids), s.plan);
        const auto address = on_device ? reinterpret_cast<std::uintptr_t>(destination.data) : 0;
        const detail::device_array value = detail::executor<T>(s.plan, s.bindings, s.memory, c, precision, key_splits).run(where, address, stored);
        if (on_device) return finish(c);
        copy_back(c, value, destination, s.result);
    }

    static void refuse_host_functions(const evaluation::program& p) {
        if (!p.functions.empty()) {
            throw std::invalid_argument("dimsum: cuda: ds::map runs on the host backends only (its function is host code)");
        }
    }

    // destination (host memory) := value, row-major device memory of its extents; through
    // `staging` where the destination is not row-major. Waits for the device first.
    template <class D>
    static void copy_back(context& c, const detail::device_array& value, const evaluation::strided<D>& destination,
                          std::vector<std::byte>& staging) {
        const std::size_t bytes = destination.where.size() * sizeof(D);
        if (evaluation::is_row_major(destination)) return download(c, destination.data, value.first(), bytes);
        staging.resize(bytes);
        download(c, staging.data(), value.first(), bytes);
        const evaluation::strided<const D> from{reinterpret_cast<const D*>(staging.data()), value.where};
        evaluation::convert_each(from, destination, [](D x) { return x; });
    }
};

}  // namespace dimsum::backend::cuda

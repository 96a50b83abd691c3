// ds::prepack: a matrix packed once for the CPU's products. The product that takes it as its
// right operand reads the packing (explain says so, a bf16 one is not converted), and its
// values equal the product of the matrix itself; every other use reads the matrix.
// The products' values on every path are in tests/parity/test_parity_gemm.cpp.
#include "support.hpp"

#include <string>

namespace ds = dimsum;

using Rows = ds::axis<"rows">;
using Inner = ds::axis<"inner">;
using Cols = ds::axis<"cols">;

namespace {

using test::require_same_bits;

std::size_t count(const std::string& text, const std::string& word) {
    std::size_t n = 0;
    for (std::size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++n;
    return n;
}

}  // namespace

TEST_CASE("prepack: the product reads the packing, with the same values as the matrix's") {
    for (int threads : {1, 2}) {
        INFO("threads: " << threads);
        ds::set_num_threads(threads);
        // 300 rows: the product packs B itself too (fewer rows read a row-major B in place)
        ds::tensor<float, Rows, Inner> x(Rows{300}, Inner{301});
        ds::tensor<float, Inner, Cols> w(Inner{301}, Cols{67});
        ds::tensor<float, Cols> bias(Cols{67});
        ds::fill_normal(x, 1);
        ds::fill_normal(w, 2);
        ds::fill_normal(bias, 3);
        const auto packed = ds::prepack(w);
        const auto formula = ds::max(ds::matmul(x, packed) + bias, 0.0f);
        const std::string plan = ds::backend::cpu::evaluator{}.explain(formula);
        INFO(plan);
        CHECK(count(plan, "[right operand packed once]") == 1);
        CHECK(count(plan, "[epilogue fused]") == 1);
        require_same_bits(ds::eval(formula), ds::eval(ds::max(ds::matmul(x, w) + bias, 0.0f)));
        // the reference backend reads the matrix
        CHECK(count(ds::backend::reference::evaluator{}.explain(formula), "packed") == 0);
    }
    ds::set_num_threads(0);
}

TEST_CASE("prepack: every other use of a packed matrix reads the matrix itself") {
    ds::tensor<float, Inner, Cols> w(Inner{19}, Cols{23});
    ds::tensor<float, Rows, Cols> y(Rows{5}, Cols{23});
    ds::tensor<float, Cols, Rows> z(Cols{23}, Rows{4});
    ds::fill_normal(w, 1);
    ds::fill_normal(y, 2);
    ds::fill_normal(z, 3);
    const auto packed = ds::prepack(w);
    require_same_bits(ds::eval(packed * 2.0f + 1.0f), ds::eval(w * 2.0f + 1.0f));
    require_same_bits(ds::eval(ds::matmul(packed, z)), ds::eval(ds::matmul(w, z)));                     // the left operand
    require_same_bits(ds::eval(ds::matmul(y, ds::transpose(packed))), ds::eval(ds::matmul(y, ds::transpose(w))));  // transposed
    require_same_bits(ds::eval(packed), w);
    CHECK(count(ds::backend::cpu::evaluator{}.explain(ds::matmul(packed, z)), "packed once") == 0);
}

TEST_CASE("prepack: a bf16 matrix is packed into float panels (and pairs) and read without a convert") {
    namespace cpu = ds::backend::cpu;
    ds::tensor<ds::bf16, Rows, Inner> x(Rows{300}, Inner{70});
    ds::tensor<ds::bf16, Inner, Cols> w(Inner{70}, Cols{45});
    ds::fill_normal(x, 1);
    ds::fill_normal(w, 2);
    // on every path this CPU runs: widen reads the float panels, amx and avx512_bf16 the pairs
    for (const cpu::bf16_path path : cpu::bf16_paths) {
        if (!cpu::support_of(path).usable) continue;
        INFO("bf16 path " << cpu::name(path));
        const cpu::scoped_bf16_path chosen(path);
        const auto packed = ds::prepack(w);
        const std::string plan = cpu::evaluator{}.explain(ds::matmul(x, packed));
        INFO(plan);
        CHECK(count(plan, "convert") == 0);  // x read where it lies, w from its packing
        CHECK(count(plan, "[bf16 read where it lies]") == 1);
        CHECK(count(plan, "[right operand packed once]") == 1);
        // the same sums in the same order as packing w at each call
        const std::size_t before = cpu::bf16_products(path);
        require_same_bits(ds::eval(ds::matmul(x, packed)), ds::eval(ds::matmul(x, w)));
        CHECK(cpu::bf16_products(path) - before == 2);
        // float panels: 70 x 45 rounded up to the micro-kernel's width (at most 32 floats more a
        // row); the pairs: 70 x 45 rounded up to 96 x 64, in bf16
        const std::size_t pairs = path == cpu::bf16_path::widen ? 0 : 96 * 64 * sizeof(ds::bf16);
        CHECK(packed.bytes() >= 70 * 45 * sizeof(float) + pairs);
        CHECK(packed.bytes() < 70 * (45 + 32) * sizeof(float) + pairs);
    }
}

TEST_CASE("prepack: a formula of another type reads the values of a matrix packed once") {
    // float panels of a bf16 w serve float formulas; one over double reads w's values
    ds::tensor<ds::bf16, Rows, Inner> x(Rows{5}, Inner{16});
    ds::tensor<ds::bf16, Inner, Cols> w(Inner{16}, Cols{8});
    ds::fill_normal(x, 1);
    ds::fill_normal(w, 2);
    const auto packed = ds::prepack(w);
    auto product = [&](const auto& right) { return ds::matmul(ds::cast<double>(x), ds::cast<double>(right)); };
    CHECK(count(ds::backend::cpu::evaluator{}.explain(product(packed)), "packed once") == 0);
    require_same_bits(ds::eval(product(packed)), ds::eval(product(w)));
}

TEST_CASE("prepack: a product written over the matrix it reads packed is evaluated before it writes") {
    using Square = ds::axis<"inner2">;
    ds::tensor<double, Inner, Square> w(Inner{9}, Square{9});
    ds::tensor<double, Inner, Inner> x(Inner{9}, Inner{9});
    ds::fill_normal(w, 1);
    ds::fill_normal(x, 2);
    const auto want = ds::eval(ds::matmul(x, w), ds::backend::reference::evaluator{});
    const auto packed = ds::prepack(w);
    ds::assign(w, ds::matmul(x, packed));
    test::require_close(w, test::to_xt(want), 1e-12, 1e-12);
}

TEST_CASE("a multi-head attention layer packed once: the same outputs, fused or separate projections, float or bf16") {
    using Batch = ds::axis<"batch">;
    using Seq = ds::axis<"seq">;
    using Model = ds::axis<"model", 48>;
    using Heads = ds::axis<"heads", 4>;
    using Head = ds::axis<"head", 12>;
    auto check = [](auto element) {
        using T = decltype(element);
        using layer_type = ds::nn::multi_head_attention<T, Model, Heads, Head>;
        layer_type separate, fused;
        separate.w_q.emplace();
        separate.w_k.emplace();
        separate.w_v.emplace();
        separate.b_q.emplace();
        fused.w_qkv.emplace();
        ds::fill_normal(*separate.w_q, 1, 0.0, 0.2);
        ds::fill_normal(*separate.w_k, 2, 0.0, 0.2);
        ds::fill_normal(*separate.w_v, 3, 0.0, 0.2);
        ds::fill_normal(*separate.b_q, 4);
        ds::fill_normal(separate.w_o, 5, 0.0, 0.2);
        ds::fill_normal(*fused.w_qkv, 6, 0.0, 0.2);
        fused.w_o = separate.w_o;
        // 3 x 67 = 201 rows: more than the 4 that take another path, unpacked
        ds::tensor<T, Batch, Seq, Model> x(Batch{3}, Seq{67});
        ds::fill_normal(x, 7);
        for (layer_type* l : {&separate, &fused}) {
            const auto plain = (*l)(x), causal = (*l)(x, {.causal = true});
            REQUIRE(l->packed_bytes() == 0);
            l->prepack();
            // W_Q, W_K, W_V (48 x 48 each) and W_O, in float, each 48 columns rounded up to the
            // micro-kernel's width (16 floats with AVX2: 48; 32 with AVX-512: 64); a bf16 layer
            // packed where the bf16 path has the bf16 instructions, also each one's pairs
            namespace cpu = ds::backend::cpu;
            const bool pairs = std::is_same_v<T, ds::bf16> && cpu::current_bf16_path() != cpu::bf16_path::widen;
            CHECK(l->packed_bytes() == 4 * cpu::packed_elements<float>(48, 48) * sizeof(float) +
                                           (pairs ? 4 * cpu::pair_elements(48, 48) * sizeof(ds::bf16) : 0));
            CHECK(l->packed_bytes() >= 4 * 48 * 48 * sizeof(float));
            require_same_bits((*l)(x), plain);
            require_same_bits((*l)(x, {.causal = true}), causal);
            const layer_type copy = *l;  // shares the packing, reads its own weights
            require_same_bits(copy(x), plain);
            l->unpack();
            REQUIRE(l->packed_bytes() == 0);
            require_same_bits((*l)(x), plain);
        }
    };
    check(float{});
    check(ds::bf16{});
}

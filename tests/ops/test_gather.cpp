// Integer tensors and gather: embedding lookups and gathers along any axis against loops, on
// both backends, with int32 and int64 ids, strided tables and ids, computed tables; ids out of
// range as an index_error that writes nothing; integer lengths and positions in masks; .npy.
#include "support.hpp"

#include <dimsum/interop/npy.hpp>

#include <cstdint>

namespace ds = dimsum;

namespace {

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Vocab = ds::axis<"vocab">;
using Model = ds::axis<"model">;
using Key = ds::axis<"key">;

// Exact unless the formula computes (a copy is exact).
template <class E>
void require_both_backends(const E& formula, const xt::xarray<double>& want, double rtol = 0) {
    test::require_close(ds::eval(formula), want, rtol, 0);
    test::require_close(ds::eval(formula, ds::backend::reference::evaluator{}), want, rtol, 0);
}

}  // namespace

TEMPLATE_TEST_CASE("an embedding lookup: gather<Vocab>(table, ids) against loops", "", std::int32_t, std::int64_t) {
    for (std::size_t vocab : {1, 3, 17}) {
        for (std::size_t model : test::odd_sizes) {
            ds::tensor<float, Vocab, Model> table(Vocab{vocab}, Model{model});
            ds::fill_uniform(table, vocab * model);
            ds::tensor<TestType, Batch, Seq> ids(Batch{2}, Seq{5});
            for (std::size_t i = 0; i < ids.size(); ++i) ids.data()[i] = static_cast<TestType>((i * 7 + 3) % vocab);
            auto rows = ds::gather<Vocab>(table, ids);  // (batch, seq, model)
            static_assert(std::is_same_v<ds::shape_of<decltype(rows)>, ds::shape<Batch, Seq, Model>>);
            const xt::xarray<double> t = test::to_xt(table);
            xt::xarray<double> want = xt::zeros<double>({std::size_t{2}, std::size_t{5}, model});
            for (std::size_t b = 0; b < 2; ++b) {
                for (std::size_t s = 0; s < 5; ++s) {
                    for (std::size_t m = 0; m < model; ++m) want(b, s, m) = t(static_cast<std::size_t>(ids(b, s)), m);
                }
            }
            INFO("vocab=" << vocab << " model=" << model);
            require_both_backends(rows, want);
            // the rows scaled, in one formula: the gather fuses into nothing, the scaling reads it
            test::require_close(ds::eval(rows * 2.0f), want * 2.0, 0, 0);
        }
    }
}

TEST_CASE("gather along a middle axis, from a transposed or computed table, with strided ids") {
    ds::tensor<double, Batch, Vocab, Model> table(Batch{3}, Vocab{9}, Model{4});
    ds::fill_uniform(table, 1);
    ds::tensor<std::int64_t, Seq> all_ids(Seq{11});
    for (std::size_t i = 0; i < 11; ++i) all_ids(i) = static_cast<std::int64_t>((i * 5) % 9);
    auto ids = ds::slice<Seq>(all_ids, 1, 11, 3);  // positions 1, 4, 7, 10: a strided view
    const xt::xarray<double> t = test::to_xt(table);
    xt::xarray<double> want = xt::zeros<double>({std::size_t{3}, std::size_t{4}, std::size_t{4}});
    for (std::size_t b = 0; b < 3; ++b) {
        for (std::size_t s = 0; s < 4; ++s) {
            for (std::size_t m = 0; m < 4; ++m) want(b, s, m) = t(b, static_cast<std::size_t>(ids(s)), m);
        }
    }
    require_both_backends(ds::gather<Vocab>(table, ids), want);                 // (batch, seq, model)
    require_both_backends(ds::gather<Vocab>(table * 3.0 - 1.0, ids), want * 3.0 - 1.0, 1e-15);
    // a transposed table (batch, model, vocab): the gathered axis is the last one
    auto transposed = ds::transpose(table);
    xt::xarray<double> want_last = xt::zeros<double>({std::size_t{3}, std::size_t{4}, std::size_t{4}});
    for (std::size_t b = 0; b < 3; ++b) {
        for (std::size_t m = 0; m < 4; ++m) {
            for (std::size_t s = 0; s < 4; ++s) want_last(b, m, s) = t(b, static_cast<std::size_t>(ids(s)), m);
        }
    }
    require_both_backends(ds::gather<Vocab>(transposed, ids), want_last);  // (batch, model, seq)
    // ids of rank 0: the slice at one id, as select
    ds::tensor<std::int32_t> one;
    one.data()[0] = 5;
    require_both_backends(ds::gather<Vocab>(table, one), test::to_xt(ds::eval(ds::select<Vocab>(table, 5))));
}

TEST_CASE("an id outside the table is an index_error that writes nothing") {
    ds::tensor<float, Vocab, Model> table(Vocab{4}, Model{3});
    ds::fill_uniform(table, 1);
    ds::tensor<std::int64_t, Seq> ids(Seq{3});
    ids(0) = 1;
    ids(1) = 4;
    ids(2) = 0;
    ds::tensor<float, Seq, Model> out(Seq{3}, Model{3});
    out.fill(7.0f);
    for (int reference = 0; reference < 2; ++reference) {
        auto run = [&] {
            ds::backend::reference::evaluator oracle;
            if (reference) ds::evaluation::assign_with(oracle, out.view(), ds::gather<Vocab>(table, ids));
            else out = ds::gather<Vocab>(table, ids) + 1.0f;
        };
        REQUIRE_THROWS_AS(run(), ds::index_error);
        CHECK(test::error_of(run) == "dimsum: gather: id 4 at (seq=1) of the ids lies outside vocab=4");
        for (std::size_t i = 0; i < out.size(); ++i) REQUIRE(out.data()[i] == 7.0f);
    }
    ids(1) = -1;
    CHECK(test::error_of([&] { (void)ds::eval(ds::gather<Vocab>(table, ids)); }) ==
          "dimsum: gather: id -1 at (seq=1) of the ids lies outside vocab=4");
}

TEST_CASE("integer lengths and positions make masks, read converted to the formula's type") {
    ds::tensor<std::int64_t, Batch> lengths(Batch{4});
    ds::tensor<float, Batch> float_lengths(Batch{4});
    const std::int64_t given[] = {0, 2, 5, 9};
    for (std::size_t b = 0; b < 4; ++b) {
        lengths(b) = given[b];
        float_lengths(b) = static_cast<float>(given[b]);
    }
    auto ones = [](auto&& mask) { return ds::eval(ds::where(mask, 1.0f, 0.0f)); };
    const auto want = test::to_xt(ones(ds::sequence_mask(float_lengths, Key{9})));
    test::require_close(ones(ds::sequence_mask(lengths, Key{9})), want, 0, 0);
    test::require_close(ds::eval(ds::where(ds::sequence_mask(lengths, Key{9}), 1.0f, 0.0f), ds::backend::reference::evaluator{}),
                        want, 0, 0);
    // integer arithmetic inside the mask: the last real key of each sequence
    auto last = ones(ds::arange<std::int64_t>(Key{9}) == ds::unsqueeze<ds::axis<"key", 1>, 1>(lengths - 1));
    for (std::size_t b = 0; b < 4; ++b) {
        for (std::size_t j = 0; j < 9; ++j) CHECK(last(b, j) == (static_cast<std::int64_t>(j) == given[b] - 1 ? 1.0f : 0.0f));
    }
    const std::string plan = ds::explain(ds::where(ds::sequence_mask(lengths, Key{9}), 1.0f, 0.0f));
    INFO(plan);
    CHECK(plan.find("convert    t") != std::string::npos);
    CHECK(plan.find("= float(in0)") != std::string::npos);
}

TEST_CASE("integer tensors through .npy files") {
    test::temp_dir tmp;
    ds::tensor<std::int64_t, Batch, Seq> ids(Batch{2}, Seq{3});
    ds::tensor<std::int32_t, Seq> small(Seq{3});
    for (std::size_t i = 0; i < 6; ++i) ids.data()[i] = static_cast<std::int64_t>(i) * 1000000007LL;
    for (std::size_t i = 0; i < 3; ++i) small.data()[i] = -static_cast<std::int32_t>(i);
    ds::save_npy(tmp.path("ids.npy"), ids.view());
    ds::save_npy(tmp.path("small.npy"), small.view());
    auto back = ds::load_npy<std::int64_t, Batch, Seq>(tmp.path("ids.npy"));
    auto small_back = ds::load_npy<std::int32_t, Seq>(tmp.path("small.npy"));
    CHECK(std::equal(back.data(), back.data() + 6, ids.data()));
    CHECK(std::equal(small_back.data(), small_back.data() + 3, small.data()));
    CHECK_THROWS_WITH((ds::load_npy<float, Batch, Seq>(tmp.path("ids.npy"))), Catch::Contains("int64"));
}

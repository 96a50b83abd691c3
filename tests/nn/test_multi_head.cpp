// The multi-head example (examples/multi_head_attention.hpp) against PyTorch: the reference
// outputs in tests/reference/ were made by tests/reference/generate.py from the same seeded
// inputs, with torch.nn.functional in float64.
#include "support.hpp"

#include <xtensor/xnpy.hpp>
#include <xtensor/xview.hpp>

#include "multi_head_attention.hpp"

namespace {

xt::xarray<double> load(const std::string& name) {
    return xt::load_npy<double>(test::data_path(name));
}

}  // namespace

TEST_CASE("the generator script reproduces dimsum's seeded inputs exactly") {
    auto x = mha::make_input(2, 10);
    test::require_close(x, load("multi_head_x.npy"), 0, 0);
    xt::xarray<double> first_rows = xt::view(test::to_xt(mha::make_weight(5)), xt::range(0, 4), xt::all());
    auto want = load("multi_head_w_o_rows.npy");
    bool same = first_rows == want;
    REQUIRE(same);
}

TEST_CASE("multi-head self-attention matches PyTorch") {
    auto x = mha::make_input(2, 10);
    auto w_q = mha::make_weight(2), w_k = mha::make_weight(3), w_v = mha::make_weight(4), w_o = mha::make_weight(5);
    test::require_close(mha::self_attention(x, w_q, w_k, w_v, w_o), load("multi_head_out.npy"), 1e-4, 1e-6);
    test::require_close(mha::self_attention(x, mha::fuse(w_q, w_k, w_v), w_o), load("multi_head_out.npy"), 1e-4, 1e-6);
    test::require_close(mha::self_attention(x, w_q, w_k, w_v, w_o, true), load("multi_head_causal_out.npy"), 1e-4,
                        1e-6);
}

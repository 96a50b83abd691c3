// dimsum_bench's memory-bound cases (softmax, layer_norm, a transformer-style epilogue,
// concat, an embedding lookup), against the copy bandwidth.

#include <dimsum/dimsum.hpp>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "bench.hpp"

namespace dimsum_bench {

namespace ds = dimsum;

namespace {

using Row = ds::axis<"row">;
using Col = ds::axis<"col">;

// Memory-bound formulas: `run` evaluates into y; `error` checks y; `bytes` is what the
// formula must at least move (every input read once, the output written once).
template <class Run, class Error>
void bench_streaming(bench& s, const std::string& name, double bytes, double tolerance, Run run, Error error) {
    for (std::size_t t = 0; t < s.opt.threads.size(); ++t) {
        int threads = s.opt.threads[t];
        fastest mine;
        for (int round = 0; round < rounds(s.opt); ++round) {
            ds::set_num_threads(threads);
            settle(s.opt);
            mine.keep(best_seconds(s.opt, run), "");
        }
        double gbps = bytes / mine.seconds * 1e-9;
        s.out.check(name + " (" + std::to_string(threads) + " threads): dimsum", error(), tolerance);
        s.out.add({name, threads, gbps, "copy_bandwidth", s.limits.copy[t], "GB/s", "memcpy"});
    }
}

// The largest error of 8 sampled rows of y = f(x) along rows, against `exact`, which writes f
// of one row in double; relative (softmax's weights) or absolute (layer_norm's outputs are of
// size 1).
template <class Exact>
double worst_row_error(const ds::tensor<float, Row, Col>& x, const ds::tensor<float, Row, Col>& y, bool relative,
                       Exact exact) {
    const std::size_t rows = x.extent(0), cols = x.extent(1);
    std::vector<double> want(cols);
    sampler pick;
    double worst = 0;
    for (int sample = 0; sample < 8; ++sample) {
        std::size_t r = pick.below(rows);
        exact(x.data() + r * cols, want.data());
        for (std::size_t j = 0; j < cols; ++j) {
            double e = std::abs(double(y.data()[r * cols + j]) - want[j]) / (relative ? want[j] : 1.0);
            if (!(e <= worst)) worst = e;
        }
    }
    return worst;
}

}  // namespace

void bench_softmax(bench& s, std::size_t rows, std::size_t cols) {
    std::string name = "softmax_" + std::to_string(rows) + "x" + std::to_string(cols);
    if (!s.selected(name)) return;
    ds::tensor<float, Row, Col> x(Row{rows}, Col{cols});  // (row, col)
    ds::tensor<float, Row, Col> y(Row{rows}, Col{cols});  // (row, col)
    ds::fill_normal(x, 7, 0.0, 2.0);
    auto error = [&] {
        return worst_row_error(x, y, true, [cols](const float* in, double* out) {
            double top = *std::max_element(in, in + cols), sum = 0;
            for (std::size_t j = 0; j < cols; ++j) sum += std::exp(double(in[j]) - top);
            for (std::size_t j = 0; j < cols; ++j) out[j] = std::exp(double(in[j]) - top) / sum;
        });
    };
    y.fill(std::numeric_limits<float>::quiet_NaN());
    bench_streaming(s, name, 2.0 * double(x.size() * sizeof(float)), 1e-4, [&] { ds::assign(y, ds::softmax(x)); },
                    error);
}

// layer_norm along rows of a transformer's widths.
void bench_layer_norm(bench& s, std::size_t rows, std::size_t cols) {
    std::string name = "layer_norm_" + std::to_string(rows) + "x" + std::to_string(cols);
    if (!s.selected(name)) return;
    ds::tensor<float, Row, Col> x(Row{rows}, Col{cols});  // (row, col)
    ds::tensor<float, Row, Col> y(Row{rows}, Col{cols});  // (row, col)
    ds::fill_normal(x, 11, 3.0, 2.0);
    auto error = [&] {
        return worst_row_error(x, y, false, [cols](const float* in, double* out) {
            double mean = 0, variance = 0;
            for (std::size_t j = 0; j < cols; ++j) mean += in[j];
            mean /= double(cols);
            for (std::size_t j = 0; j < cols; ++j) variance += (in[j] - mean) * (in[j] - mean);
            variance /= double(cols);
            for (std::size_t j = 0; j < cols; ++j) out[j] = (in[j] - mean) / std::sqrt(variance + 1e-5);
        });
    };
    y.fill(std::numeric_limits<float>::quiet_NaN());
    bench_streaming(s, name, 2.0 * double(x.size() * sizeof(float)), 1e-5, [&] { ds::assign(y, ds::layer_norm(x)); },
                    error);
}

// A transformer-style epilogue: scale, bias, ReLU, residual; with dimsum's functions
// (eltwise_), and as one user's function of three operands (map_, ds::map).
void bench_elementwise(bench& s, std::size_t rows, std::size_t cols) {
    const std::string size = std::to_string(rows) + "x" + std::to_string(cols);
    const std::string name = "eltwise_" + size, map_name = "map_" + size;
    if (!s.selected(name) && !s.selected(map_name)) return;
    ds::tensor<float, Row, Col> x(Row{rows}, Col{cols});  // (row, col)
    ds::tensor<float, Col> bias(Col{cols});               // (col)
    ds::tensor<float, Row, Col> r(Row{rows}, Col{cols});  // (row, col) the residual
    ds::tensor<float, Row, Col> y(Row{rows}, Col{cols});  // (row, col)
    ds::fill_uniform(x, 8);
    ds::fill_uniform(bias, 9);
    ds::fill_uniform(r, 10);
    auto error = [&] {
        sampler pick;
        double worst = 0;
        for (int sample = 0; sample < 256; ++sample) {
            std::size_t i = pick.below(rows), j = pick.below(cols), at = i * cols + j;
            double exact = std::max(double(x.data()[at]) * 0.5 + double(bias.data()[j]), 0.0) + double(r.data()[at]);
            double e = std::abs(double(y.data()[at]) - exact);
            if (!(e <= worst)) worst = e;
        }
        return worst;
    };
    double bytes = double((3 * x.size() + bias.size()) * sizeof(float));
    if (s.selected(name)) {
        y.fill(std::numeric_limits<float>::quiet_NaN());
        bench_streaming(s, name, bytes, 1e-5, [&] { ds::assign(y, ds::max(x * 0.5f + bias, 0.0f) + r); }, error);
    }
    if (s.selected(map_name)) {
        auto epilogue = [](float v, float b, float residual) { return std::max(v * 0.5f + b, 0.0f) + residual; };
        y.fill(std::numeric_limits<float>::quiet_NaN());
        bench_streaming(s, map_name, bytes, 1e-5, [&] { ds::assign(y, ds::map(epilogue, x, bias, r)); }, error);
    }
}

// softmax, layer_norm and the epilogue above with input, residual and output in bf16, against
// the same formulas in float on the same values, in the same rounds: elements a second, so the
// ratio is bf16's speed over float's. The bf16 result must be the float result rounded, bit
// for bit (the passes widen and round in their own buffers and compute in float).
void bench_bf16_streaming(bench& s, std::size_t rows, std::size_t cols) {
    const std::string size = std::to_string(rows) + "x" + std::to_string(cols);
    const std::string names[] = {"bf16_softmax_" + size, "bf16_layer_norm_" + size, "bf16_eltwise_" + size};
    if (std::none_of(std::begin(names), std::end(names), [&](const std::string& n) { return s.selected(n); })) return;
    ds::tensor<ds::bf16, Row, Col> x16(Row{rows}, Col{cols}), r16(x16.shape()), y16(x16.shape());
    ds::tensor<ds::bf16, Col> bias16(Col{cols});
    ds::fill_normal(x16, 12, 0.0, 2.0);
    ds::fill_uniform(r16, 13);
    ds::fill_uniform(bias16, 14);
    const ds::tensor<float, Row, Col> x = ds::cast<float>(x16), r = ds::cast<float>(r16);
    const ds::tensor<float, Col> bias = ds::cast<float>(bias16);
    ds::tensor<float, Row, Col> y(x.shape());
    auto run_case = [&](const std::string& name, auto&& in_bf16, auto&& in_float) {
        if (!s.selected(name)) return;
        for (int threads : s.opt.threads) {
            fastest narrow, wide;
            for (int round = 0; round < rounds(s.opt); ++round) {
                ds::set_num_threads(threads);
                settle(s.opt);
                narrow.keep(best_seconds(s.opt, in_bf16), "");
                settle(s.opt);
                wide.keep(best_seconds(s.opt, in_float), "");
            }
            std::size_t different = 0;
            for (std::size_t i = 0; i < y.size(); ++i) {
                const ds::bf16 want(y.data()[i]);
                different += y16.data()[i].bits != want.bits && !(isnan(want) && isnan(y16.data()[i]));
            }
            s.out.check(name + " (" + std::to_string(threads) + " threads): values that are not float's rounded", double(different), 0.0);
            const double elements = double(x.size());
            s.out.add({name, threads, elements / narrow.seconds * 1e-9, "dimsum_float", elements / wide.seconds * 1e-9, "Gelem/s",
                       "bf16 read and written by the pass, computed in float"});
        }
    };
    run_case(names[0], [&] { ds::assign(y16, ds::softmax(x16)); }, [&] { ds::assign(y, ds::softmax(x)); });
    run_case(names[1], [&] { ds::assign(y16, ds::layer_norm(x16)); }, [&] { ds::assign(y, ds::layer_norm(x)); });
    run_case(names[2], [&] { ds::assign(y16, ds::max(x16 * 0.5f + bias16, 0.0f) + r16); },
             [&] { ds::assign(y, ds::max(x * 0.5f + bias, 0.0f) + r); });
}

// concat of two halves along the columns: each read once, the result written once.
void bench_concat(bench& s, std::size_t rows, std::size_t cols) {
    std::string name = "concat_" + std::to_string(rows) + "x" + std::to_string(cols);
    if (!s.selected(name)) return;
    ds::tensor<float, Row, Col> a(Row{rows}, Col{cols / 2}), b(Row{rows}, Col{cols - cols / 2});
    ds::tensor<float, Row, Col> y(Row{rows}, Col{cols});
    ds::fill_uniform(a, 12);
    ds::fill_uniform(b, 13);
    auto error = [&] {
        sampler pick;
        double wrong = 0;
        for (int sample = 0; sample < 256; ++sample) {
            std::size_t i = pick.below(rows), j = pick.below(cols), half = cols / 2;
            float want = j < half ? a.data()[i * half + j] : b.data()[i * (cols - half) + j - half];
            if (y.data()[i * cols + j] != want) wrong = 1;
        }
        return wrong;
    };
    y.fill(std::numeric_limits<float>::quiet_NaN());
    bench_streaming(s, name, 2.0 * double(y.size() * sizeof(float)), 0, [&] { ds::assign(y, ds::concat<Col>(a, b)); },
                    error);
}

// An embedding lookup: rows of a (vocab, col) table at random ids, each row read once and
// written once.
void bench_gather(bench& s, std::size_t rows, std::size_t cols) {
    using Vocab = ds::axis<"vocab">;
    std::string name = "gather_" + std::to_string(rows) + "x" + std::to_string(cols);
    if (!s.selected(name)) return;
    const std::size_t vocab = std::max<std::size_t>(rows / 4, 1);
    ds::tensor<float, Vocab, Col> table(Vocab{vocab}, Col{cols});
    ds::tensor<std::int64_t, Row> ids(Row{rows});
    ds::tensor<float, Row, Col> y(Row{rows}, Col{cols});
    ds::fill_uniform(table, 14);
    sampler draw;
    for (std::size_t i = 0; i < rows; ++i) ids(i) = static_cast<std::int64_t>(draw.below(vocab));
    auto error = [&] {
        sampler pick;
        double wrong = 0;
        for (int sample = 0; sample < 256; ++sample) {
            std::size_t i = pick.below(rows), j = pick.below(cols);
            if (y.data()[i * cols + j] != table.data()[static_cast<std::size_t>(ids(i)) * cols + j]) wrong = 1;
        }
        return wrong;
    };
    y.fill(std::numeric_limits<float>::quiet_NaN());
    bench_streaming(s, name, 2.0 * double(y.size() * sizeof(float)), 0,
                    [&] { ds::assign(y, ds::gather<Vocab>(table, ids)); }, error);
}

}  // namespace dimsum_bench

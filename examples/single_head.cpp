// The classic worked example of scaled dot-product attention: three tokens ("cat", "sat",
// "mat") with d_model = 4 and one head of d_k = 3.
#include <dimsum/dimsum.hpp>

#include <cmath>
#include <iostream>

namespace ds = dimsum;

using Token = ds::axis<"token", 3>;  // the query side
using Key   = ds::axis<"key", 3>;    // the same tokens, seen as keys
using Model = ds::axis<"model", 4>;
using Dk    = ds::axis<"d_k", 3>;

int main() {
    ds::tensor<float, Token, Model> x({1.0, 0.5, -0.2, 0.8,     // cat
                                       0.3, -0.6, 1.2, 0.1,     // sat
                                       0.7, 0.9, 0.4, -0.5});   // mat
    ds::tensor<float, Model, Dk> w_q({0.2, -0.1, 0.4,
                                      0.5, 0.3, -0.2,
                                      -0.3, 0.8, 0.1,
                                      0.1, -0.4, 0.6});
    ds::tensor<float, Model, Dk> w_k({0.3, 0.2, -0.5,
                                      -0.2, 0.6, 0.1,
                                      0.4, -0.1, 0.3,
                                      0.7, 0.2, -0.3});
    ds::tensor<float, Model, Dk> w_v({-0.4, 0.5, 0.2,
                                      0.1, -0.3, 0.7,
                                      0.6, 0.2, -0.1,
                                      0.3, 0.4, 0.5});

    auto q = ds::eval(ds::matmul(x, w_q));                        // (token, d_k)
    auto k = ds::eval(ds::rename<Token, Key>(ds::matmul(x, w_k)));  // (key, d_k)
    auto v = ds::eval(ds::rename<Token, Key>(ds::matmul(x, w_v)));  // (key, d_k)

    auto scores = ds::eval(ds::matmul(q, ds::transpose(k)) / std::sqrt(3.0f));  // (token, key)
    auto weights = ds::eval(ds::softmax<Key>(scores));                          // (token, key)
    auto row_sums = ds::eval(ds::sum<Key>(weights));                            // (token)
    auto output = ds::eval(ds::matmul(weights, v));                             // (token, d_k)

    std::cout << "X, one row per token (cat, sat, mat)\n" << x << "\n\n"
              << "Q = X W_Q\n" << q << "\n\n"
              << "K = X W_K\n" << k << "\n\n"
              << "V = X W_V\n" << v << "\n\n"
              << "scores = Q K^T / sqrt(d_k)\n" << scores << "\n\n"
              << "weights = softmax(scores) over keys\n" << weights << "\n\n"
              << "each row of weights sums to 1\n" << row_sums << "\n\n"
              << "output = weights V\n" << output << "\n";
}

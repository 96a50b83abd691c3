#pragma once
// How a formula is differentiated: ds::grad, ds::vjp, ds::backward, ds::backward_from and
// nn::tape take one (evaluation/differentiate.hpp applies it).

namespace dimsum {

struct gradient_options {
    // A gradient's product whose other operand is stored in bf16 (a bf16 tensor, a cast<bf16>,
    // or a view of either) reads the cotangent rounded to bf16, so that both its operands are
    // bf16 and it runs on the CPU's bf16 instructions where they exist: dA = round(dC) B^T
    // where B is bf16, dB = A^T round(dC) where A is. PyTorch's autocast computes these
    // products so. Off, every gradient is computed in float from float cotangents.
    bool bf16_products = false;
};

}  // namespace dimsum

#pragma once
// The codes a program's steps carry that every executor must know, in a header that names no
// formula type, so that nvcc reads it too (backend/cuda/): element types, the op codes
// (core/op_code.hpp) and the causal mask's rule.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dimsum/core/op_code.hpp"

namespace dimsum::evaluation {

// The element types a program can hold. A program computes in float32 or float64; its
// tensors may also hold bf16 (widened exactly), int32 or int64 (ids, lengths), which it reads
// converted (a `convert` entry), integers also as indices (a `gather` entry).
enum class element_type : std::uint8_t { float32, float64, bf16, int32, int64 };

constexpr std::size_t size_of(element_type type) {
    switch (type) {
        case element_type::bf16: return 2;
        case element_type::float32: case element_type::int32: return 4;
        case element_type::float64: case element_type::int64: return 8;
    }
    return 0;
}

constexpr std::string_view name_of(element_type type) {
    switch (type) {
        case element_type::float32: return "float";
        case element_type::float64: return "double";
        case element_type::bf16: return "bf16";
        case element_type::int32: return "int32";
        case element_type::int64: return "int64";
    }
    return "";
}

// The causal mask's rule (expr::causal_mask), for every backend: key k lies in query q's
// future when k > q + (keys - queries), queries and keys aligned at their ends.
constexpr bool in_future(std::size_t query, std::size_t key, std::size_t queries, std::size_t keys) {
    return key + queries > query + keys;
}

}  // namespace dimsum::evaluation

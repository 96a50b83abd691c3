#pragma once
// matmul(a, b): (..., m, k) x (..., k, n) -> (..., m, n); see shape/matmul_shape.hpp.

#include "dimsum/ops/common.hpp"
#include "dimsum/shape/matmul_shape.hpp"

namespace dimsum {

template <operand A, operand B>
auto matmul(A&& a, B&& b, call_site caller = call_site::current()) {
    detail::operation_site site(caller);
    if constexpr (any_invalid<A, B>) {
        return invalid_expression{};
    } else {
        using SA = shape_of<A>;
        using SB = shape_of<B>;
        constexpr message shapes_error = detail::matmul_error<SA, SB>();
        constexpr message type_error = detail::element_type_error<value_type_of<A>, value_type_of<B>>("matmul");
        if constexpr (shapes_error.length != 0) {
            return fail<shapes_error>();
        } else if constexpr (type_error.length != 0) {
            return fail<type_error>();
        } else {
            using result = detail::matmul_shape<SA, SB>;
            auto extents = result::extents(a.shape(), b.shape());
            return expr::matmul<typename result::type, expr::held_t<A>, expr::held_t<B>>{
                {expr::hold(std::forward<A>(a)), expr::hold(std::forward<B>(b))}, extents};
        }
    }
}

}  // namespace dimsum

#pragma once
// gather<Axis>(table, ids): the slices of table at the given ids along a named axis, e.g. an
// embedding lookup, gather<Vocab>(embedding, token_ids): (vocab, model) and (batch, seq) give
// (batch, seq, model).

#include <cstddef>
#include <utility>

#include "dimsum/core/element_type.hpp"
#include "dimsum/ops/common.hpp"
#include "dimsum/shape/find_axis.hpp"

namespace dimsum {

namespace detail {

// Table's axes before Position, then the ids' axes, then Table's axes after Position.
template <class Table, std::size_t Position, class Ids,
          class = std::make_index_sequence<Position>, class = std::make_index_sequence<Table::rank - Position - 1>>
struct gathered_shape;
template <class Table, std::size_t Position, class... IdAxes, std::size_t... Before, std::size_t... After>
struct gathered_shape<Table, Position, shape<IdAxes...>, std::index_sequence<Before...>, std::index_sequence<After...>> {
    using type = shape<typename Table::template axis_at<Before>..., IdAxes...,
                       typename Table::template axis_at<Position + 1 + After>...>;
};

template <class Ids>
constexpr message gather_ids_error() {
    message m;
    if constexpr (!is_strided_leaf<Ids>) {
        m << "dimsum: gather: the ids must be a named tensor or a view of one, not a formula or a temporary";
    } else if constexpr (!integer_element<std::remove_const_t<value_type_of<Ids>>>) {
        m << "dimsum: gather: the ids must hold int32_t or int64_t, not " << type_name<value_type_of<Ids>>();
    }
    return m;
}

}  // namespace detail

// gather<Axis>(table, ids): for every position of ids (a tensor or view of int32_t or int64_t),
// the slice of table at that id along the axis named like Axis, as torch.index_select
// generalised to ids of any shape (an embedding lookup when table is (vocab, model)). The
// result has table's axes before Axis, the ids' axes, then table's axes after Axis. An id
// outside [0, extent) is an index_error when the formula is evaluated, before anything is
// written. Table may be any formula.
template <axis_type Axis, operand Table, operand Ids>
auto gather(Table&& table, Ids&& ids, call_site caller = call_site::current()) {
    detail::operation_site site(caller);
    if constexpr (any_invalid<Table, Ids>) {
        return invalid_expression{};
    } else {
        using ST = shape_of<Table>;
        constexpr detail::axis_lookup found = detail::find_axis<ST>("gather", describe_axis<Axis>);
        constexpr message ids_error = detail::gather_ids_error<Ids>();
        if constexpr (found.error.length != 0) {
            return fail<found.error>();
        } else if constexpr (ids_error.length != 0) {
            return fail<ids_error>();
        } else {
            constexpr std::size_t position = found.position;
            using S = typename detail::gathered_shape<ST, position, shape_of<Ids>>::type;
            const auto et = table.shape().extents();
            const auto ei = ids.shape().extents();
            std::array<std::size_t, S::rank> all{};
            std::size_t i = 0;
            for (std::size_t a = 0; a < position; ++a) all[i++] = et[a];
            for (std::size_t extent : ei) all[i++] = extent;
            for (std::size_t a = position + 1; a < ST::rank; ++a) all[i++] = et[a];
            return expr::gather<S, position, expr::held_t<Table>, expr::held_t<Ids>>{
                {expr::hold(std::forward<Table>(table)), expr::hold(std::forward<Ids>(ids))}, S::from_extents(all, "gather")};
        }
    }
}

}  // namespace dimsum

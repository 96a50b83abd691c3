#pragma once
// Tensors of integers in a plan, for the executors on the host: the checks made before any
// entry runs (every binding of a type the plan may read; every gather id within its axis, so
// that a bad id leaves the destination untouched).

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "dimsum/core/index_error.hpp"
#include "dimsum/evaluation/convert.hpp"
#include "dimsum/evaluation/plan.hpp"
#include "dimsum/evaluation/strided.hpp"

namespace dimsum::evaluation {

// The integers a binding of int32 or int64 holds.
inline integers integers_of(const binding& b) { return {b.data, b.type == element_type::int64, b.where}; }

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_bad_id(const step& table, std::size_t axis, std::int64_t id,
                                                                const step& ids, const std::size_t* index) {
    message m;
    m << "dimsum: gather: id ";
    if (id < 0) m << '-';
    m << (id < 0 ? std::size_t(0) - static_cast<std::size_t>(id) : static_cast<std::size_t>(id)) << " at (";
    for (std::size_t i = 0; i < ids.rank; ++i) {
        m << (i ? ", " : "");
        if (ids.axes && !ids.axes[i].name.empty()) m << ids.axes[i].name << '=';
        m << index[i];
    }
    m << ") of the ids lies outside ";
    if (table.axes && !table.axes[axis].name.empty()) m << table.axes[axis].name << '=';
    m << table.extents[axis];
    throw index_error(m);
}

// Throws index_error, naming the id and where it is, unless every id that a gather entry of
// the plan reads lies in [0, extent) of the table's axis (a scatter entry, a gather's gradient:
// of its own value's, the table's shape; it reports the gather's ids).
inline void check_gather_ids(const program& p, const std::vector<binding>& bindings, const plan& pl) {
    for (const entry& e : pl.entries) {
        if (e.kind != entry_kind::gather && e.kind != entry_kind::scatter) continue;
        const step& s = p.steps[e.step];
        const step& table = e.kind == entry_kind::scatter ? s : p.steps[s.operands[0]];
        const step& ids = p.steps[s.operands[1]];
        const integers values = integers_of(bindings[ids.binding]);
        const auto extent = static_cast<std::int64_t>(table.extents[s.axis]);
        for_each_index(values.where().extents, values.where().rank, [&](const std::size_t* index) {
            const std::int64_t id = values.at(index);
            if (id < 0 || id >= extent) throw_bad_id(table, s.axis, id, ids, index);
        });
    }
}

// What a host executor of a plan over T checks before it runs the first entry: every binding
// holds T or a type that convert and gather entries read (convert.hpp); every gather id is in
// range.
template <class T>
void check_before_running(const program& p, const std::vector<binding>& bindings, const plan& pl) {
    for (const binding& b : bindings) {
        if (!readable(b.type, element_type_of<T>())) throw std::logic_error("dimsum: a program mixes element types");
    }
    check_gather_ids(p, bindings, pl);
}

}  // namespace dimsum::evaluation

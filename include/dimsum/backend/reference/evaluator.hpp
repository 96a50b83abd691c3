#pragma once
// The reference backend: obviously correct, the oracle every fast backend is tested against.
// It stays in the tree.
//
// run(formula, destination) lowers the formula to a program (evaluation/lower.hpp), a tree
// of steps over plain data, and interprets it (interpreter.hpp) with plain loops that
// accumulate in double (long double for double tensors).

#include "dimsum/backend/reference/interpreter.hpp"
#include "dimsum/evaluation/lower.hpp"

namespace dimsum::backend::reference {

class evaluator {
public:
    // Writes the value of e into dst, a view of e's shape that e does not read.
    template <class E, class T, class... A>
    void run(const E& e, const tensor_view<T, A...>& dst) {
        program<T> steps;
        std::size_t root = evaluation::lower<T>(e, steps);
        interpreter<T>(steps).write(root, to_strided(dst));
    }
};

}  // namespace dimsum::backend::reference

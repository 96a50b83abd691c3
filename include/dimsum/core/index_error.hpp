#pragma once
// The error thrown for an index outside its axis: a gather id past the table, or negative.

#include <stdexcept>

#include "dimsum/core/message.hpp"

namespace dimsum {

class index_error : public std::out_of_range {
public:
    using std::out_of_range::out_of_range;
    explicit index_error(const message& m) : std::out_of_range(m.str()) {}
};

}  // namespace dimsum

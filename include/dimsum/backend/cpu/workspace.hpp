#pragma once
// The CPU kernels' names for the runtime's kept memory (runtime/workspace.hpp).

#include "dimsum/runtime/workspace.hpp"

namespace dimsum::backend::cpu {

using runtime::scratch;
using runtime::scratch_use;
using runtime::temporaries;
using runtime::thread_temporaries;

}  // namespace dimsum::backend::cpu

#pragma once
// dimsum: tensor formulas with shapes the compiler checks. Include this header only.

// First, so that a shape error's "In file included from" trail is as short as it can be.
#include "dimsum/core/static_error.hpp"

#include "dimsum/backend/cpu/bf16_paths.hpp"
#include "dimsum/backend/cpu/prepack.hpp"
#include "dimsum/backend/default.hpp"
#include "dimsum/ops/cast.hpp"
#include "dimsum/ops/elementwise.hpp"
#include "dimsum/ops/gather.hpp"
#include "dimsum/ops/join.hpp"
#include "dimsum/ops/map.hpp"
#include "dimsum/ops/mask.hpp"
#include "dimsum/ops/matmul.hpp"
#include "dimsum/ops/softmax.hpp"
#include "dimsum/ops/transpose.hpp"
#include "dimsum/ops/view.hpp"
#include "dimsum/runtime/threads.hpp"
#include "dimsum/runtime/workspace.hpp"
#include "dimsum/nn/attention.hpp"
#include "dimsum/nn/decoder.hpp"
#include "dimsum/nn/encoder.hpp"
#include "dimsum/nn/layers.hpp"
#include "dimsum/nn/kv_cache.hpp"
#include "dimsum/nn/rotary.hpp"
#include "dimsum/tensor/print.hpp"
#include "dimsum/tensor/random.hpp"

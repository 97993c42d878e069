// cuda_bf16.h for the xtrain CPU emulator: __nv_bfloat16 is defined in xtrain_cuda_compat.h,
// which every kernel gets through g++'s -include, so this file only keeps the include working.
#pragma once
#include "xtrain_cuda_compat.h"

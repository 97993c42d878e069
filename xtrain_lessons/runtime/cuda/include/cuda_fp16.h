// cuda_fp16.h for the xtrain CPU emulator: __half lives in xtrain_half.h, which
// xtrain_cuda_compat.h includes, so this file only keeps the include working.
#pragma once
#include "xtrain_cuda_compat.h"

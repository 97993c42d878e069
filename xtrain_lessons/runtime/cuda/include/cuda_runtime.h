// cuda_runtime.h for the xtrain CPU emulator: everything lives in xtrain_cuda_compat.h.
#pragma once
#include "xtrain_cuda_compat.h"

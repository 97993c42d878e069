// cooperative_groups/reduce.h for the xtrain CPU emulator: reduce lives in cooperative_groups.h.
#pragma once
#include "../cooperative_groups.h"

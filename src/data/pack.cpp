// Packed shards: see pack.h. (Being written.)
#include "crucible/data/pack.h"

// Image decoders: see decode.h. (Being written.)
#include "crucible/data/decode.h"

// Sample sources: see sample_source.h. (Being written.)
#include "crucible/data/sample_source.h"

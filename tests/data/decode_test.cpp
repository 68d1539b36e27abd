// Decoder tests. (Being written.)

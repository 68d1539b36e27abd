// Sample source and pack tests. (Being written.)

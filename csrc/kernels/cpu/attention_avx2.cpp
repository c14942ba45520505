// Attention kernel compiled for the `avx2` CPU capability (flags set in CMakeLists.txt).
#define BLOCKBATCH_CPU_CAPABILITY avx2
#include "kernels/cpu/attention_impl.h"

// Attention kernel compiled for the `avx512` CPU capability (flags set in CMakeLists.txt).
#define BLOCKBATCH_CPU_CAPABILITY avx512
#include "kernels/cpu/attention_impl.h"

// Attention kernel compiled for the portable `generic` CPU capability (no extra -m flags).
#define BLOCKBATCH_CPU_CAPABILITY generic
#include "kernels/cpu/attention_impl.h"

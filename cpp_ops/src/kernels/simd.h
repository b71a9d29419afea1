// Hot elementwise loops get an AVX2 clone next to the baseline x86-64 one, picked at load time:
// the baseline (SSE2) cannot vectorize floor/rint, AVX2 can (vroundps). Both clones compute the same
// IEEE operations (no FMA contraction: the library is built with -ffp-contract=off), so the choice
// never changes a result. TFOPS_NO_CLONES (or a non-x86 target) turns the cloning off.
#pragma once

#if defined(__x86_64__) && defined(__ELF__) && !defined(TFOPS_NO_CLONES)
#define TFOPS_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TFOPS_VECTOR_CLONES
#endif

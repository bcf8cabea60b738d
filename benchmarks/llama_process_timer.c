/* LD_PRELOAD shim: times every llama_process() call of a llama.cpp binary.

   One line per call to the file named by $LLAMA_TIMER_OUT: the llama_context pointer and the
   seconds the call took. Used by vs_llama_cpp.py to split llama-speculative-simple's decode time
   into draft calls, target calls and time outside the model. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int32_t llama_process(void *ctx, int type, void *batch) {
    static int32_t (*real)(void *, int, void *);
    static FILE *out;
    if (!real) real = (int32_t (*)(void *, int, void *))dlsym(RTLD_NEXT, "llama_process");
    if (!out) out = fopen(getenv("LLAMA_TIMER_OUT"), "w");
    double start = now();
    int32_t status = real(ctx, type, batch);
    if (out) fprintf(out, "%p %.6f\n", ctx, now() - start);
    return status;
}

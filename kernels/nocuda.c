/* nocuda.c: what kernels/cuda.h answers in a build without CUDA (make
 * CUDA=0, or no nvcc): no device, and one line saying why. The launchers
 * are not declared usable here: model/gpu.c calls them only after
 * cuda_open succeeded, which it never does in this build. */
#ifndef USE_CUDA
#include <stdio.h>

#include "kernels/cuda.h"

const char *cuda_built(void) { return NULL; }
int cuda_device_count(void) { return 0; }
int cuda_open(CudaInfo *info, char *err, size_t errlen) {
    (void)info;
    snprintf(err, errlen, "-dev cuda: this binary was built without CUDA (make CUDA=0, or no nvcc was found)");
    return -1;
}
#endif

/* cuda.cu: the device, its memory, the stream and graphs (kernels/cuda.h).
 *
 * One device (0) and one stream: run decodes one sequence, so every op
 * depends on the one before it. Errors are CUDA's own strings with the op
 * that raised them: a launcher records the first failed launch
 * (cuda_note), cuda_sync reports it or an error from the running device.
 * The runtime is linked statically, so this binary starts on machines
 * without a driver: cudaGetDeviceCount then fails (35, insufficient
 * driver) and counts as no device.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cuda.h"
#include "kernels/cuda_common.cuh"

#ifndef CUDA_ARCH_LIST
#define CUDA_ARCH_LIST "unknown"
#endif

cudaStream_t g_stream;
int g_pdl;
static char g_failed_op[64];
static cudaError_t g_failed;
static int g_integrated; /* device 0 shares the system's memory (cuda_open) */
static int g_pageable, g_ro_register; /* CudaInfo's pageable and ro_register (cuda_open) */
static size_t g_host_mapped;          /* bytes of host mappings the GPU reads in place (cuda_host_map) */

void cuda_refuse(const char *op) {
    if (g_failed == cudaSuccess) {
        g_failed = cudaErrorInvalidValue;
        snprintf(g_failed_op, sizeof g_failed_op, "%s", op);
    }
}

void cuda_note(const char *op) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess && g_failed == cudaSuccess) {
        g_failed = e;
        snprintf(g_failed_op, sizeof g_failed_op, "%s", op);
    }
}

extern "C" const char *cuda_built(void) { return CUDA_ARCH_LIST; }

extern "C" int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    cudaGetLastError(); /* a failed query leaves a sticky-looking error behind */
    return n;
}

extern "C" int cuda_open(CudaInfo *info, char *err, size_t errlen) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        snprintf(err, errlen, "-dev cuda: no usable CUDA device (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports none");
        return -1;
    }
    cudaDeviceProp p;
    if ((e = cudaSetDevice(0)) != cudaSuccess || (e = cudaGetDeviceProperties(&p, 0)) != cudaSuccess ||
        (!g_stream && (e = cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking)) != cudaSuccess)) {
        snprintf(err, errlen, "-dev cuda: cannot open device 0: %s", cudaGetErrorString(e));
        return -1;
    }
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->sm_count = p.multiProcessorCount;
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->mem_total = p.totalGlobalMem;
    info->integrated = g_integrated = p.integrated;
    int a = 0;
    if (cudaDeviceGetAttribute(&a, cudaDevAttrPageableMemoryAccess, 0) == cudaSuccess) info->pageable = g_pageable = a;
    if (cudaDeviceGetAttribute(&a, cudaDevAttrPageableMemoryAccessUsesHostPageTables, 0) == cudaSuccess)
        info->host_tables = a;
    if (cudaDeviceGetAttribute(&a, cudaDevAttrHostRegisterReadOnlySupported, 0) == cudaSuccess)
        info->ro_register = g_ro_register = a;
    cudaGetLastError(); /* an attribute this driver does not know reads as 0 */
    /* SASS for 8.0 and up, and PTX a later GPU compiles: nothing for older ones */
    if (p.major < 8) {
        snprintf(err, errlen, "-dev cuda: %s has compute capability %d.%d; this build runs on 8.0 and up", p.name,
                 p.major, p.minor);
        return -1;
    }
    const char *pdl = getenv("RUN_CUDA_PDL");
    g_pdl = p.major >= 9 && cuda_pdl_compiled() && !(pdl && strcmp(pdl, "0") == 0);
    return 0;
}

extern "C" int cuda_set_pdl(int on) {
    int major = 0, was = g_pdl;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) major = 0;
    g_pdl = on && major >= 9 && cuda_pdl_compiled();
    return was;
}

extern "C" void cuda_mem(size_t *free_b, size_t *total_b) {
    if (cudaMemGetInfo(free_b, total_b) != cudaSuccess) *free_b = *total_b = 0;
}

/* The system's MemAvailable in bytes, 0 when /proc/meminfo does not say. */
static size_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (size_t)kb * 1024;
}

extern "C" void *cuda_alloc(size_t bytes, const char *what, char *err, size_t errlen) {
    void *d = NULL;
    /* MemAvailable counts the page cache as free, mapped weights included:
     * an allocation that took their pages would have them read from disk
     * again at every step, so they stay out of the budget */
    const size_t sys = g_integrated ? mem_available() : 0; /* 0: a discrete GPU, or not known */
    const size_t avail = sys > g_host_mapped ? sys - g_host_mapped : 0;
    if (sys && bytes > avail) {
        snprintf(err, errlen, "out of memory for %s: %.2f GB needed, %.2f GB available (MemAvailable%s: this GPU "
                              "shares the system's memory)", what, bytes / 1e9, avail / 1e9,
                 g_host_mapped ? " less the weights read where mapped" : "");
        return NULL;
    }
    cudaError_t e = cudaMalloc(&d, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cuda_mem(&fr, &tot);
        if (sys) fr = avail;
        snprintf(err, errlen, "out of GPU memory for %s: %.2f GB needed, %.2f GB of %.2f GB free%s (%s)", what,
                 bytes / 1e9, fr / 1e9, tot / 1e9, sys ? " (MemAvailable)" : "", cudaGetErrorString(e));
        return NULL;
    }
    return d;
}

extern "C" void cuda_free(void *d) {
    if (d) cudaFree(d);
}

/* bytes rounded up to whole pages: a mapping, and so its registration,
 * covers its last page whole */
static size_t whole_pages(size_t bytes) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (bytes + page - 1) / page * page;
}

extern "C" const void *cuda_host_map(const void *p, size_t bytes, char *err, size_t errlen) {
    if (g_pageable) {
        g_host_mapped += bytes;
        return p;
    }
    if (!g_ro_register) {
        snprintf(err, errlen, "-wmem map: this GPU reads neither pageable memory nor registered read-only mappings "
                              "(cudaDevAttrPageableMemoryAccess and HostRegisterReadOnlySupported are 0): use -wmem "
                              "copy");
        return NULL;
    }
    bytes = whole_pages(bytes);
    void *d = NULL;
    cudaError_t e = cudaHostRegister((void *)p, bytes, cudaHostRegisterMapped | cudaHostRegisterReadOnly);
    if (e == cudaSuccess && (e = cudaHostGetDevicePointer(&d, (void *)p, 0)) != cudaSuccess) cudaHostUnregister((void *)p);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "-wmem map: registering %.2f GB of the checkpoint's mapping for the GPU failed: %s (use "
                 "-wmem copy)", bytes / 1e9, cudaGetErrorString(e));
        return NULL;
    }
    g_host_mapped += bytes;
    return d;
}

extern "C" void cuda_host_unmap(const void *p, size_t bytes) {
    if (!p) return;
    if (!g_pageable) {
        bytes = whole_pages(bytes);
        if (cudaHostUnregister((void *)p) != cudaSuccess) cudaGetLastError();
    }
    g_host_mapped -= bytes < g_host_mapped ? bytes : g_host_mapped;
}

static int copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *what, char *err,
                size_t errlen) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, g_stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g_stream);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "CUDA copy of %s %s the device failed: %s", what,
                 kind == cudaMemcpyHostToDevice ? "to" : "from", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

extern "C" int cuda_upload(void *d_dst, const void *src, size_t bytes, const char *what, char *err, size_t errlen) {
    return copy(d_dst, src, bytes, cudaMemcpyHostToDevice, what, err, errlen);
}

extern "C" int cuda_download(void *dst, const void *d_src, size_t bytes, const char *what, char *err, size_t errlen) {
    return copy(dst, d_src, bytes, cudaMemcpyDeviceToHost, what, err, errlen);
}

extern "C" void cuda_copy_rows(void *d_dst, size_t dpitch, const void *d_src, size_t spitch, size_t width, int rows) {
    const cudaError_t e =
        cudaMemcpy2DAsync(d_dst, dpitch, d_src, spitch, width, (size_t)rows, cudaMemcpyDeviceToDevice, g_stream);
    if (e != cudaSuccess && g_failed == cudaSuccess) {
        g_failed = e;
        snprintf(g_failed_op, sizeof g_failed_op, "a copy of rows on the device");
    }
}

extern "C" int cuda_memset(void *d, int v, size_t bytes) {
    return cudaMemsetAsync(d, v, bytes, g_stream) == cudaSuccess ? 0 : -1;
}

extern "C" int cuda_sync(const char *where, char *err, size_t errlen) {
    cudaError_t e = cudaStreamSynchronize(g_stream);
    if (g_failed != cudaSuccess) {
        snprintf(err, errlen, "CUDA error in %s (%s): %s", g_failed_op, where, cudaGetErrorString(g_failed));
        return -1;
    }
    if (e != cudaSuccess) {
        snprintf(err, errlen, "CUDA error in %s: %s", where, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

extern "C" int cuda_graph_begin(char *err, size_t errlen) {
    cudaError_t e = cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "CUDA graph capture could not start: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

extern "C" int cuda_graph_end(void **graph, char *err, size_t errlen) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    cudaError_t e = cudaStreamEndCapture(g_stream, &g);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&x, g, 0);
    if (g) cudaGraphDestroy(g);
    if (e != cudaSuccess || g_failed != cudaSuccess) {
        snprintf(err, errlen, "CUDA graph capture failed: %s%s%s", cudaGetErrorString(e != cudaSuccess ? e : g_failed),
                 g_failed != cudaSuccess ? " in " : "", g_failed != cudaSuccess ? g_failed_op : "");
        if (x) cudaGraphExecDestroy(x);
        return -1;
    }
    *graph = x;
    return 0;
}

extern "C" int cuda_graph_launch(void *graph, char *err, size_t errlen) {
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)graph, g_stream);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "CUDA graph launch failed: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

extern "C" void cuda_graph_free(void *graph) {
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

extern "C" double cuda_copy_gbps(size_t bytes) {
    void *a = NULL, *b = NULL;
    cudaEvent_t e0, e1;
    double best = 0;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) goto done;
    cudaMemsetAsync(a, 1, bytes, g_stream);
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    for (int r = 0; r < 6; r++) {
        float ms = 0;
        cudaEventRecord(e0, g_stream);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g_stream);
        cudaEventRecord(e1, g_stream);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        if (r > 0 && ms > 0 && 2.0 * bytes / (ms * 1e6) > best) best = 2.0 * bytes / (ms * 1e6);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
done:
    cudaGetLastError();
    cudaFree(a), cudaFree(b);
    return best;
}

static cudaEvent_t g_t0, g_t1;

extern "C" void cuda_timer_start(void) {
    if (!g_t0) cudaEventCreate(&g_t0), cudaEventCreate(&g_t1);
    cudaEventRecord(g_t0, g_stream);
}

extern "C" double cuda_timer_stop(void) {
    float ms = 0;
    cudaEventRecord(g_t1, g_stream);
    cudaEventSynchronize(g_t1);
    cudaEventElapsedTime(&ms, g_t0, g_t1);
    return ms / 1e3;
}

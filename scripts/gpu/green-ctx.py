#!/usr/bin/env python3
"""Patch of ggml's CUDA backend source, applied by build-cuda.sh after stream-priority.py:
a backend whose kernels run on a share of the GPU's SMs (a CUDA green context).

Stream priorities did not keep the decode steps' rate while an image encoder ran on
another stream of the same GPU (issue 32, H200, 2026-12-05: 0.841 with priorities,
0.840 without): a priority only orders the queue of blocks waiting for an SM, and
the encoder's long GEMM and attention blocks hold every SM, so each of a decode
step's ~1000 small kernels still waits for one to finish. A green context gives the
encoder's streams a fixed subset of SMs (CUDA 12.4+ driver API); the decode
backend, in the primary context, keeps the whole GPU, and finds most SMs free.

With this patch a backend started with a parameter string containing `sm_share=P`
(1 <= P < 100; ggml_backend_dev_init(dev, "sm_share=25")) creates its streams in a
green context of P% of the device's SMs (rounded up to the partition granularity,
8 SMs on Hopper). Green contexts share the primary context's memory and modules,
so buffers, cuBLAS and CUDA graphs work unchanged. Where the driver cannot make one,
the backend logs a warning and uses every SM. The library reports the feature
GREEN_CTX=1; GGML_CUDA_GREEN_CTX=0 in the environment makes it ignore the
parameter (for A/B runs). Idempotent. Usage: green-ctx.py GGML_SRC_DIR
"""
import sys
from pathlib import Path

root = Path(sys.argv[1]) / "src" / "ggml-cuda"

common = root / "common.cuh"
text = common.read_text()
if "tempo9_green_ctx" in text:
    print("already patched", root)
    sys.exit(0)
# stream-priority.py's stream creation (it runs first).
old = ("            CUDA_CHECK(cudaStreamCreateWithPriority(&streams[device][stream], cudaStreamNonBlocking,\n"
       "                                                    tempo9_stream_priority));\n")
assert text.count(old) == 1, "stream creation anchor (apply stream-priority.py first)"
new = ("#if CUDA_VERSION >= 12050 && !defined(GGML_CUDA_NO_VMM)\n"
       "            if (tempo9_green_ctx != nullptr && device == this->device) {\n"
       "                // Tempo9 patch (scripts/gpu/green-ctx.py): the stream's kernels run on\n"
       "                // the green context's SMs only.\n"
       "                CU_CHECK(cuGreenCtxStreamCreate(reinterpret_cast<CUstream *>(&streams[device][stream]),\n"
       "                                                tempo9_green_ctx, CU_STREAM_NON_BLOCKING,\n"
       "                                                tempo9_stream_priority));\n"
       "            } else\n"
       "#endif\n"
       "            {\n"
       "                CUDA_CHECK(cudaStreamCreateWithPriority(&streams[device][stream], cudaStreamNonBlocking,\n"
       "                                                        tempo9_stream_priority));\n"
       "            }\n")
text = text.replace(old, new, 1)
old = "    int tempo9_stream_priority = 0;\n"
assert text.count(old) == 1, "stream priority member anchor"
text = text.replace(old, old + "#if CUDA_VERSION >= 12050 && !defined(GGML_CUDA_NO_VMM)\n"
                    "    // Tempo9 patch (scripts/gpu/green-ctx.py): a share of the SMs, or null for all.\n"
                    "    CUgreenCtx tempo9_green_ctx = nullptr;\n"
                    "#endif\n", 1)
common.write_text(text)

main = root / "ggml-cuda.cu"
text = main.read_text()
# After stream-priority.py's block in the device's init_backend.
old = "        ((ggml_backend_cuda_context *) backend->context)->tempo9_stream_priority = greatest;\n    }\n    return backend;\n"
assert text.count(old) == 1, "init_backend anchor (apply stream-priority.py first)"
new = """        ((ggml_backend_cuda_context *) backend->context)->tempo9_stream_priority = greatest;
    }
#if CUDA_VERSION >= 12050 && !defined(GGML_CUDA_NO_VMM)
    // Tempo9 patch (scripts/gpu/green-ctx.py): "sm_share=P" runs this backend's streams
    // (created lazily, after this) on P% of the SMs (green contexts: CUDA 12.4, their
    // streams: 12.5).
    const char * share_arg = params ? strstr(params, "sm_share=") : nullptr;
    const char * green_env = getenv("GGML_CUDA_GREEN_CTX");
    if (backend && share_arg && (green_env == nullptr || std::atoi(green_env) != 0)) {
        const int share = std::atoi(share_arg + strlen("sm_share="));
        if (share > 0 && share < 100) {
            ggml_cuda_set_device(ctx->device);
            CUdevice cu_dev;
            CUdevResource all = {};
            CUdevResource part[1] = {};
            CUdevResource rest = {};
            unsigned int n_groups = 1;
            CUdevResourceDesc desc = nullptr;
            CUgreenCtx green = nullptr;
            unsigned int want = 0;
            bool ok = cuDeviceGet(&cu_dev, ctx->device) == CUDA_SUCCESS
                && cuDeviceGetDevResource(cu_dev, &all, CU_DEV_RESOURCE_TYPE_SM) == CUDA_SUCCESS;
            if (ok) {
                want = std::max(1u, (all.sm.smCount * (unsigned int) share + 99) / 100);
                ok = cuDevSmResourceSplitByCount(part, &n_groups, &all, &rest, 0, want) == CUDA_SUCCESS
                    && n_groups == 1
                    && cuDevResourceGenerateDesc(&desc, part, 1) == CUDA_SUCCESS
                    && cuGreenCtxCreate(&green, desc, cu_dev, CU_GREEN_CTX_DEFAULT_STREAM) == CUDA_SUCCESS;
            }
            if (ok) {
                ((ggml_backend_cuda_context *) backend->context)->tempo9_green_ctx = green;
                GGML_LOG_INFO("%s: device %d: streams in a green context of %u of %u SMs (sm_share=%d)\\n",
                              __func__, ctx->device, part[0].sm.smCount, all.sm.smCount, share);
            } else {
                GGML_LOG_WARN("%s: device %d: no green context for sm_share=%d; streams use every SM\\n",
                              __func__, ctx->device, share);
            }
        }
    }
#endif
    return backend;
"""
text = text.replace(old, new, 1)
# The green context goes after the streams made in it.
old = """            if (cublas_workspaces[i][j] != nullptr) {
                CUDA_CHECK(cudaFree(cublas_workspaces[i][j]));
            }
        }
    }
"""
assert text.count(old) == 1, "destructor anchor"
text = text.replace(old, old + """#if CUDA_VERSION >= 12050 && !defined(GGML_CUDA_NO_VMM)
    if (tempo9_green_ctx != nullptr) {
        CU_CHECK(cuGreenCtxDestroy(tempo9_green_ctx));
    }
#endif
""", 1)
old = '        features.push_back({ "STREAM_PRIORITY", "1" });\n'
assert text.count(old) == 1, "features anchor (apply stream-priority.py first)"
text = text.replace(old, old + '#if CUDA_VERSION >= 12050 && !defined(GGML_CUDA_NO_VMM)\n        features.push_back({ "GREEN_CTX", "1" });\n#endif\n', 1)
main.write_text(text)
print("patched", root)

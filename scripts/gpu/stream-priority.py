#!/usr/bin/env python3
"""Patch of ggml's CUDA backend source, applied by build-cuda.sh: stream priority per backend.

ggml-cuda creates its streams without a priority, so every backend on a GPU competes
for SMs on equal terms. When Tempo9's vision encoder runs on its own backend (its own
stream) beside the decode steps, its large GEMMs fill every SM and the small decode
kernels queued on the other stream wait behind whole grids (issue 32, H200: the
running streams keep 0.82 of their rate, against 0.90 for the same prompts as text).
CUDA's block scheduler dispatches a higher-priority stream's blocks first as SMs free
up, so giving the decode backend's stream a high priority lets it interleave.

With this patch a backend started with the parameter string containing
`stream_priority=high` (ggml_backend_dev_init(dev, "stream_priority=high"); ggml
ignores the string unpatched) creates its streams at the device's greatest priority.
CUDA graphs launched into such a stream run at its priority. The library reports
the feature STREAM_PRIORITY=1; GGML_CUDA_STREAM_PRIORITY=0 in the environment makes
it ignore the parameter (for A/B runs). Idempotent. Usage: stream-priority.py GGML_SRC_DIR
"""
import sys
from pathlib import Path

root = Path(sys.argv[1]) / "src" / "ggml-cuda"

common = root / "common.cuh"
text = common.read_text()
if "tempo9_stream_priority" in text:
    print("already patched", root)
    sys.exit(0)
old = "            CUDA_CHECK(cudaStreamCreateWithFlags(&streams[device][stream], cudaStreamNonBlocking));\n"
assert text.count(old) == 1, "stream creation anchor"
new = ("            CUDA_CHECK(cudaStreamCreateWithPriority(&streams[device][stream], cudaStreamNonBlocking,\n"
       "                                                    tempo9_stream_priority));\n")
text = text.replace(old, new, 1)
old = "    ggml_cuda_stream_context concurrent_stream_context;\n"
assert text.count(old) == 1, "context member anchor"
text = text.replace(old, old + "\n    // Tempo9 patch (scripts/gpu/stream-priority.py): 0 is CUDA's default priority.\n"
                    "    int tempo9_stream_priority = 0;\n", 1)
common.write_text(text)

main = root / "ggml-cuda.cu"
text = main.read_text()
old = """    GGML_UNUSED(params);
    ggml_backend_cuda_device_context * ctx = (ggml_backend_cuda_device_context *)dev->context;
    return ggml_backend_cuda_init(ctx->device);
"""
assert text.count(old) == 1, "init_backend anchor"
new = """    ggml_backend_cuda_device_context * ctx = (ggml_backend_cuda_device_context *)dev->context;
    ggml_backend_t backend = ggml_backend_cuda_init(ctx->device);
    // Tempo9 patch (scripts/gpu/stream-priority.py): "stream_priority=high" puts this
    // backend's streams (created lazily, after this) at the device's greatest priority.
    const char * env = getenv("GGML_CUDA_STREAM_PRIORITY");
    const bool honour = env == nullptr || std::atoi(env) != 0;
    if (backend && honour && params && strstr(params, "stream_priority=high")) {
        int least = 0;
        int greatest = 0;
        ggml_cuda_set_device(ctx->device);
        CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
        ((ggml_backend_cuda_context *) backend->context)->tempo9_stream_priority = greatest;
    }
    return backend;
"""
text = text.replace(old, new, 1)
old = '        features.push_back({ "USE_GRAPHS", "1" });\n    #endif\n'
assert text.count(old) == 1, "features anchor"
text = text.replace(old, old + '\n        features.push_back({ "STREAM_PRIORITY", "1" });\n', 1)
text = "#include <cstdlib>\n#include <cstring>\n" + text
main.write_text(text)
print("patched", root)

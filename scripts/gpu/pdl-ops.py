#!/usr/bin/env python3
"""Patch of ggml's CUDA backend source, applied by build-cuda.sh: PDL limitable by op.

ggml-cuda launches every kernel it can with programmatic dependent launch (PDL) when
GGML_CUDA_PDL is on (its default on Hopper). Under CUDA graphs, Tempo9's decode graph
gets wrong numbers from PDL, and only from the flash-attention kernels (found by the
`pdlbisect` step of run-h200.sh on the H200, 2026-12-03: PDL for FLASH_ATTN_EXT alone
wrong, PDL for every op but it right). This patch lets PDL be limited by op:

  GGML_CUDA_PDL_OPS=MUL_MAT,ADD   PDL only for kernels launched while computing these ops
  GGML_CUDA_PDL_NOT_OPS=ROPE      PDL for every op but these

(op names as ggml_op_name prints them; a fused kernel counts as its first node's op),
and reports the feature PDL_OPS=1 through ggml_backend_get_features, so that Tempo9
turns PDL on (but for flash attention) only with a library that honours the filter.
Unset, the library behaves as unpatched (llama.cpp runs on it unchanged).
Idempotent. Usage: pdl-ops.py GGML_SRC_DIR
"""
import sys
from pathlib import Path

root = Path(sys.argv[1]) / "src" / "ggml-cuda"

common = root / "common.cuh"
text = common.read_text()
if "ggml_cuda_pdl_op_allowed" in text:
    print("already patched", root)
    sys.exit(0)
anchor = "template<typename Kernel, typename... Args>\nstatic __inline__ void ggml_cuda_kernel_launch("
assert anchor in text, "ggml_cuda_kernel_launch not found"
helper = r'''
// Tempo9 diagnostic (scripts/gpu/pdl-ops.py): the op whose kernels are being launched.
inline thread_local int ggml_cuda_pdl_cur_op = -1;

static bool ggml_cuda_pdl_op_allowed() {
    static const std::vector<bool> allowed = [] {
        std::vector<bool> a(GGML_OP_COUNT, true);
        const char * only = getenv("GGML_CUDA_PDL_OPS");
        const char * but  = getenv("GGML_CUDA_PDL_NOT_OPS");
        const std::string only_s = std::string(",") + (only ? only : "") + ",";
        const std::string but_s  = std::string(",") + (but ? but : "") + ",";
        for (int op = 0; op < GGML_OP_COUNT; ++op) {
            const std::string name = std::string(",") + ggml_op_name((ggml_op) op) + ",";
            if (only) {
                a[op] = only_s.find(name) != std::string::npos;
            }
            if (but && but_s.find(name) != std::string::npos) {
                a[op] = false;
            }
        }
        return a;
    }();
    const int op = ggml_cuda_pdl_cur_op;
    return op < 0 || op >= (int) allowed.size() || allowed[op];
}

'''
text = text.replace(anchor, helper + anchor, 1)
old = "    if (env_pdl_enabled && ggml_cuda_kernel_can_use_pdl("
assert old in text
text = text.replace(old, "    if (env_pdl_enabled && ggml_cuda_pdl_op_allowed() && ggml_cuda_kernel_can_use_pdl(", 1)
if "#include <string>" not in text:
    text = "#include <string>\n#include <vector>\n" + text
common.write_text(text)

main = root / "ggml-cuda.cu"
text = main.read_text()
old = "                prev_i = i;\n"
assert text.count(old) == 1, "evaluate loop anchor"
text = text.replace(old, old + "                ggml_cuda_pdl_cur_op = node->op;\n", 1)
old = '        features.push_back({ "USE_GRAPHS", "1" });\n    #endif\n'
assert text.count(old) == 1, "features anchor"
text = text.replace(old, old + '\n        features.push_back({ "PDL_OPS", "1" });\n', 1)
main.write_text(text)
print("patched", root)

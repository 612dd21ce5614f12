// Reference only (Tempo9 never calls llama_*): llama.cpp's greedy generations of
// the given prompts, each alone, with the top-two log-probabilities at each step,
// so scripts/gpu/greedy-compare.py can set Tempo9's CPU/GPU differences beside
// llama.cpp's own on the same file and kernels.
//
// Usage: llama-greedy MODEL PROMPTS N_TOKENS N_GPU_LAYERS [batched]
//   PROMPTS: one prompt per line, token ids separated by spaces.
//   batched: all prompts as sequences of one batch, then one token each per step
//   (llama.cpp's own batch-to-alone differences), instead of each prompt alone.
//   Prints one JSON line per prompt: {"tokens": [...], "top": [[[id, lp], [id, lp]], ...]}.
//   For a CPU-only run hide the GPU (CUDA_VISIBLE_DEVICES=) so no op is offloaded.
#include "llama.h"

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL PROMPTS N_TOKENS N_GPU_LAYERS\n", argv[0]);
        return 2;
    }
    const int  n_gen   = atoi(argv[3]);
    const bool batched = argc > 5 && std::string(argv[5]) == "batched";
    ggml_backend_load_all();
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = atoi(argv[4]);
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    std::vector<std::vector<llama_token>> prompts;
    {
        std::ifstream in(argv[2]);
        std::string   line;
        while (std::getline(in, line)) {
            std::vector<llama_token> toks;
            std::istringstream       ss(line);
            for (long id; ss >> id;) {
                toks.push_back((llama_token) id);
            }
            if (!toks.empty()) {
                prompts.push_back(toks);
            }
        }
    }
    const int n_seq = batched ? (int) prompts.size() : 1;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048 * n_seq;
    cp.n_batch = 2048 * n_seq;
    cp.n_seq_max = n_seq;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;  // as Tempo9
    cp.n_threads = cp.n_threads_batch = (int) std::thread::hardware_concurrency();
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot create a context\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    // Top two of one row of logits, as log-probabilities.
    auto top2 = [&](const float * l, int & a, double & lpa, int & b, double & lpb) {
        a = 0;
        b = -1;
        for (int j = 1; j < n_vocab; j++) {
            if (l[j] > l[a]) {
                b = a;
                a = j;
            } else if (b < 0 || l[j] > l[b]) {
                b = j;
            }
        }
        double sum = 0;
        for (int j = 0; j < n_vocab; j++) {
            sum += std::exp((double) l[j] - l[a]);
        }
        const double lse = l[a] + std::log(sum);
        lpa = l[a] - lse;
        lpb = l[b] - lse;
    };
    struct Gen {
        std::string toks, top;
    };
    std::vector<Gen> gens(prompts.size());
    auto record = [&](Gen & g, int i, int a, double lpa, int b, double lpb) {
        char buf[128];
        snprintf(buf, sizeof buf, "%s[[%d,%.7g],[%d,%.7g]]", i ? "," : "", a, lpa, b, lpb);
        g.top += buf;
        snprintf(buf, sizeof buf, "%s%d", i ? "," : "", a);
        g.toks += buf;
    };
    int    a, b;
    double lpa, lpb;
    if (!batched) {
        for (size_t p = 0; p < prompts.size(); p++) {
            llama_memory_clear(llama_get_memory(ctx), true);
            auto & toks = prompts[p];
            if (llama_decode(ctx, llama_batch_get_one(toks.data(), (int32_t) toks.size())) != 0) {
                fprintf(stderr, "decode failed\n");
                return 1;
            }
            for (int i = 0; i < n_gen; i++) {
                top2(llama_get_logits_ith(ctx, -1), a, lpa, b, lpb);
                record(gens[p], i, a, lpa, b, lpb);
                llama_token t = a;
                if (llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0) {
                    fprintf(stderr, "decode failed\n");
                    return 1;
                }
            }
        }
    } else {
        int total = 0;
        for (auto & p : prompts) {
            total += (int) p.size();
        }
        llama_batch      batch = llama_batch_init(std::max(total, n_seq), 0, 1);
        std::vector<int> row(n_seq), pos(n_seq);
        auto add = [&](llama_token t, int p, int s, bool logits) {
            int k = batch.n_tokens++;
            batch.token[k] = t;
            batch.pos[k] = p;
            batch.n_seq_id[k] = 1;
            batch.seq_id[k][0] = s;
            batch.logits[k] = logits;
            return k;
        };
        for (int s = 0; s < n_seq; s++) {
            for (size_t i = 0; i < prompts[s].size(); i++) {
                row[s] = add(prompts[s][i], (int) i, s, i + 1 == prompts[s].size());
            }
            pos[s] = (int) prompts[s].size();
        }
        for (int i = 0; i < n_gen; i++) {
            if (llama_decode(ctx, batch) != 0) {
                fprintf(stderr, "decode failed\n");
                return 1;
            }
            batch.n_tokens = 0;
            std::vector<llama_token> next(n_seq);
            for (int s = 0; s < n_seq; s++) {
                top2(llama_get_logits_ith(ctx, row[s]), a, lpa, b, lpb);
                record(gens[s], i, a, lpa, b, lpb);
                next[s] = a;
            }
            for (int s = 0; s < n_seq; s++) {
                row[s] = add(next[s], pos[s]++, s, true);
            }
        }
        llama_batch_free(batch);
    }
    for (auto & g : gens) {
        printf("{\"tokens\":[%s],\"top\":[%s]}\n", g.toks.c_str(), g.top.c_str());
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}

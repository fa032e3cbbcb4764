/* model/synth.h — random-weight checkpoints of the Qwen3.6-MoE architecture in the
 * exact MLX (mlx-community) layout, written to a directory or built in memory.
 *
 * Why: benchmarking and the GPU tests need the full 35B-A3B shape without the
 * 19 GB download, and the CPU parity tests need small shapes that mlx-lm loads
 * too. `orchid synth` writes a directory; `orchid bench --synth` builds the same
 * bytes in anonymous memory.
 *
 * Shapes: "35b-a3b" (the production shape), and "small" / "tiny", which equal
 * tools/make_test_model.py's CONFIGS. Every shape uses the real vocabulary.
 *
 * What is written (the same tensor names, dtypes and shapes as an mlx-lm/mlx-vlm
 * conversion, MODEL.md §2.3): language_model.* quantized matrices (uint32 codes,
 * bf16 scales/biases, group 64, 4-bit; mlp.gate and mlp.shared_expert_gate 8-bit),
 * bf16 norms/conv/dt_bias, float32 A_log, plus the same 8 small bf16
 * vision_tower.* tensors make_test_model.py writes (loaders must skip them).
 * Shards are model-0000i-of-0000n.safetensors with {"__metadata__":{"format":"mlx"}},
 * ~5 GiB each for 35b-a3b (mlx-lm's limit; 4 shards), total/3 for the test shapes
 * (>= 2 shards, like make_test_model.py); header keys sorted, the header padded
 * with spaces so the data region starts 64-byte aligned, and inside a shard the
 * tensors whose size is a multiple of 64 bytes come first, so every large tensor
 * is 64-byte aligned; the data region is contiguous (no holes).
 *
 * How the weights are made (documented choice, see the brief's "uniform codes"
 * option): for a quantized matrix with target standard deviation sigma, codes are
 * drawn uniformly (raw RNG bits), and each group of 64 gets a scale
 * s = ±sigma/rms(q - 2^(b-1)) × U(0.75, 1.25) (the sign random, so negative
 * scales occur as in MLX output) rounded to bf16, and bias β = -2^(b-1)·s
 * (exact in bf16). That is exactly what MLX's affine quantizer (MODEL.md §3)
 * produces for a group whose larger-magnitude edge is -8s (s > 0) or +8|s|
 * (s < 0): the bias is the edge, 0.0 is code 8, ŵ = s·q + β. Target sigmas
 * follow make_test_model.py (the same constants): embed 1, every projection that
 * reads the residual stream 1/sqrt(in); the residual branch outputs (GDN out_proj,
 * routed and shared down_proj: 1/sqrt(in); attention o_proj: 2.5/sqrt(in)) times
 * RESID_GAIN/sqrt(2·layers) = 2/sqrt(2L) (GPT-2's depth scaling: what the layers add
 * to the stream does not grow with depth); the router 3/sqrt(H) (logits of std ~3,
 * so the experts at the top-k boundary carry little weight and a near-tie there
 * moves the output little); RMSNorm gains 1 + N(0, 0.1), conv taps N(0, 0.5),
 * A_log = log U(1, 16), dt_bias U(-5, 1). lm_head (sigma 2/sqrt(H), logits of std
 * ~2) carries a direct path (embedding -> unembedding, the bigram term of a trained
 * model): row j copies each code of embedding row π(j) with probability
 * a = min(1, 12/sqrt(H)) (else a uniform code) and takes that row's scales times
 * 2/sqrt(H), so it has cos a with that embedding row; π is i -> (A·i + n/3) mod n
 * (A odd, coprime to n) inside each block of rows of one code chunk (n rows, the last
 * block shorter). The token π⁻¹(t) then stands ~8 standard deviations above the
 * vocabulary after token t, clear of the largest of the other 248k logits (~4.7σ),
 * so top-1 survives bf16-sized noise while the logits still depend on every layer
 * (docs/PERFORMANCE.md, "Test models").
 *
 * Determinism: each tensor is cut into fixed chunks; chunk k of tensor "name"
 * draws from xoshiro256** seeded by splitmix64(seed, FNV-1a(module), k), so the
 * bytes depend only on (shape, seed), never on the thread count or order.
 */
#ifndef ORCHID_SYNTH_H
#define ORCHID_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/safetensors.h"

#define SYNTH_SHAPES "35b-a3b|mini|small|tiny"

struct synth_options {
    const char *shape;         /* "35b-a3b", "small" or "tiny" */
    uint64_t seed;
    int threads;               /* 0 = online cores */
    bool quiet;                /* no progress lines on stderr */
    bool sync;                 /* synth_write: fsync every file before closing it */
    const char *tokenizer_dir; /* synth_write: copy tokenizer files from here (NULL = search, see below) */
};

struct synth_result {
    int n_tensors, n_shards;
    size_t total_bytes;        /* tensor bytes (index metadata total_size) */
    uint64_t total_parameters; /* as mlx-lm's get_total_parameters counts them (vision excluded) */
    int tokenizer_files;       /* files copied (synth_write) */
    char tokenizer_from[512];  /* where they came from, "" if none */
    double seconds;
};

/* True when `shape` names a known shape. */
bool synth_shape_valid(const char *shape);

/* Writes the checkpoint into `dir` (created if missing; existing shard/index/config
 * files are overwritten). Tokenizer files (tokenizer*, chat_template.jinja,
 * special_tokens_map.json, vocab.json, merges.txt, generation_config.json) are
 * copied from opt->tokenizer_dir, else $ORCHID_TOKENIZER_DIR, else
 * <binary>/../.cache/tokenizer, else ./.cache/tokenizer, when one has tokenizer.json. */
int synth_write(const char *dir, const struct synth_options *opt, struct synth_result *res, char *err, size_t errlen);

/* Builds the same shards in anonymous memory and returns them as an open
 * checkpoint (every header parsed and checked by safetensors_parse_header; shard
 * paths read "synth:<shape>/model-0000i-of-0000n.safetensors"; safetensors_close
 * unmaps them) plus the config.json text (malloc'd, caller frees). */
int synth_build_memory(const struct synth_options *opt, safetensors **st_out, char **config_json,
                       struct synth_result *res, char *err, size_t errlen);

/* The config.json text of a shape (malloc'd). */
int synth_config_json(const char *shape, uint64_t seed, char **out, char *err, size_t errlen);

#endif

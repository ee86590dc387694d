/* indexer.h: DeepSeek sparse attention (GLM-5, DeepSeek V3.2): the
 * "lightning indexer" that picks the keys each query of the latent
 * attention sees, and the attention over the picked keys.
 *
 * Per row of cols tokens (positions 0..cols-1), for query i and key j <= i:
 *   score(i, j) = sum over heads h of w(i, h) * relu(q(i, h) . k(j)) * hd^-0.5
 * with q(i, h) the indexer's query heads (wq_b of the query latent, the first
 * rope dimensions rotated: on interleaved pairs in GLM-5, as halves in
 * DeepSeek V3.2), k(j) one key per token (LayerNorm of wk x, its first rope
 * dimensions rotated alike), w(i, h) = weights_proj(x)_h *
 * heads^-0.5: Hugging Face's GlmMoeDsaIndexer / DeepseekV32Indexer and
 * DeepSeek's reference Indexer (without its Hadamard rotation, which
 * keeps dot products, and its FP8 rounding). The dot products and the
 * sums are in double. Query i keeps its topk keys of highest score (all of
 * 0..i when i < topk); of equal scores the earlier key. A selection is a
 * bit set per query, (cols + 7) / 8 bytes, bit j of byte j / 8 (j % 8)
 * set when key j is picked. */
#ifndef X3_INDEXER_H
#define X3_INDEXER_H

#include <stdint.h>

/* Bytes of one query's selection */
static inline int64_t x3_sel_stride(int64_t cols) { return (cols + 7) / 8; }

/* LayerNorm over rows of n in place: (x - mean) / sqrt(var + eps) * w + b
 * (var the biased variance; sums in double), as torch's LayerNorm. */
void x3_layernorm(float *x, const float *w, const float *b, int64_t rows, int64_t n, double eps);

/* The selections of nrows rows of cols tokens into sel (nrows * cols
 * queries of x3_sel_stride(cols) bytes): q (nrows * cols, heads, hd), k
 * (nrows * cols, hd), w (nrows * cols, heads), the per-head weights with
 * heads^-0.5 applied; scale: hd^-0.5. X3_OK or X3_ENOMEM. */
int x3_indexer_select(const float *q, const float *k, const float *w, int64_t nrows, int64_t cols,
                      int64_t heads, int64_t hd, int64_t topk, double scale, uint8_t *sel);

/* Causal attention of nrows rows of cols tokens over the keys sel picks
 * (a query's picked keys after it are not read): q, k (ntok, nh, hd), v
 * (ntok, nh, hdv), out (ntok, nh, hdv); scores (q . k) * scale, their
 * softmax over the picked keys, in double. X3_OK. */
int x3_sparse_attention(const float *q, const float *k, const float *v, float *out, int64_t nrows,
                        int64_t cols, int64_t nh, int64_t hd, int64_t hdv, double scale, const uint8_t *sel);

#endif

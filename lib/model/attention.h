/* attention.h: causal multi-head attention of the forward (model_attn.c,
 * model_mla.c), on BLAS products.
 *
 * nrows rows of cols tokens, each row attending within itself from
 * position 0. q: (ntok, nq, hd), k: (ntok, nkv, hd), v: (ntok, nkv, hdv),
 * out: (ntok, nq, hdv), ntok = nrows * cols; query head h reads key/value
 * head h / (nq / nkv) (grouped-query attention). The score of query i and
 * key j <= i is (q_i * scale) . k_j, soft-capped to cap * tanh(s / cap)
 * when softcap > 0 (Gemma2); with window > 0 query i sees keys
 * i - window < j <= i only (Hugging Face's sliding window). The output is
 * the softmax-weighted sum of the values.
 *
 * x3_attention follows the rule of blas.h: a row's output depends on that
 * row's q, k, v and on the BLAS kernel, not on the other rows, the thread
 * count or OpenBLAS's threads. It multiplies blocks of X3_ATT_QB queries
 * (counted from the row's start) by the keys up to the block's last query
 * in one SGEMM, and the block's weights by the values in another, on one
 * BLAS thread per (row, head) task, the tasks spread over OpenMP threads.
 * Returns X3_OK or X3_ENOMEM. The reference, in plain double loops, is
 * the tests' synth_attn_ex (tests/unit/synth.c; t1574 compares them). */
#ifndef X3_ATTENTION_H
#define X3_ATTENTION_H

#include <stdint.h>

#define X3_ATT_QB 64

int x3_attention(const float *q, const float *k, const float *v, float *out, int64_t nrows,
                 int64_t cols, int64_t nq, int64_t nkv, int64_t hd, int64_t hdv, float scale,
                 int64_t window, float softcap);
/* ... with one sink logit per query head (sinks (nq); NULL: none, as
 * x3_attention): the softmax of each query runs over its scores and its
 * head's sink, which has no value (GPT-OSS's learned sinks; Hugging Face's
 * softmax over [scores, sink] with the sink's column dropped). A sink of
 * -inf adds nothing: the same bits as x3_attention. */
int x3_attention_sinks(const float *q, const float *k, const float *v, float *out, int64_t nrows,
                       int64_t cols, int64_t nq, int64_t nkv, int64_t hd, int64_t hdv, float scale,
                       int64_t window, float softcap, const float *sinks);

#endif

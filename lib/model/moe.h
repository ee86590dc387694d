/* moe.h: a mixture-of-experts MLP block on CPU: softmax top-k routing and
 * the experts' SiLU-gated MLPs over the tokens routed to each.
 *
 * Routing (Mixtral, Qwen2-MoE, Qwen3-MoE; DeepSeek V3's below): logits = x · routerᵀ, p =
 * softmax(logits) over all experts, the top k of p (ties: the lower expert
 * first), their weights renormalized to sum 1 when renorm is set (Mixtral
 * always; Qwen: norm_topk_prob). The output of a token is
 * Σ_k w_k · down_e(silu(gate_e(x)) * up_e(x)) over its k experts, summed in
 * the order of the experts' numbers.
 *
 * GPT-OSS routes on the logits plus a bias: the top k, weighted by the
 * softmax over those k; its experts' SwiGLU is clamped (x3_moe_act).
 *
 * The batched form gathers the rows routed to each expert and multiplies
 * them through a callback (the model's linears: dense or EXL3, and the
 * place the per-expert Hessian capture reads the routed rows).
 * tests/t1558 checks it against a reference of its own. */
#ifndef X3_MOE_H
#define X3_MOE_H

#include <stdint.h>

struct x3_moe {
	int64_t n_experts, top_k, hidden, inter;
	int renorm;
	const float *router;    /* (n_experts, hidden) */
	/* y (n, out) = linear j (0 gate, 1 up: inter x hidden; 2 down:
	 * hidden x inter) of expert e applied to x (n, in). Called for experts
	 * with at least one routed row, in expert order, gate then up then
	 * down. Non-zero aborts. */
	int (*apply)(void *ctx, int64_t e, int j, const float *x, int64_t n, float *y);
	void *ctx;
	/* Optional (NULL: not called): the routing weights w (n) of the rows
	 * expert e is about to get, before its gate (the Hessian capture's
	 * weighted mode). Non-zero aborts. */
	int (*weights)(void *ctx, int64_t e, const float *w, int64_t n);
	/* DeepSeek V3 routing (sigmoid set; renorm is norm_topk_prob): scores
	 * s = sigmoid(logits); the choice reads s + score_bias (may be NULL):
	 * the experts split into n_group groups of consecutive numbers, each
	 * group scored by the sum of its best two, the experts outside the best
	 * topk_group groups set to 0 (as Hugging Face's masked_fill), then the
	 * top k; the weights are their s, renormalized (renorm: divided by
	 * their sum + 1e-20), times scale. */
	int sigmoid;
	const float *score_bias;  /* (n_experts) e_score_correction_bias */
	int64_t n_group, topk_group;
	double scale;
	/* GPT-OSS: router_bias (n_experts; may be NULL) added to the logits;
	 * topk_softmax: the top k of the logits, their weights the softmax
	 * over those k (Hugging Face's GptOssTopKRouter); act_limit > 0: the
	 * experts' clamped SwiGLU (x3_moe_act) with act_alpha */
	const float *router_bias;
	int topk_softmax;
	double act_limit, act_alpha;
};

/* The experts' activation in place: g (n) = silu(g) * u, or with
 * act_limit > 0 (GPT-OSS) g' = min(g, limit), u' = clamp(u, -limit,
 * limit), g = (u' + 1) * g' * sigmoid(act_alpha * g'). */
void x3_moe_act(const struct x3_moe *p, float *g, const float *u, int64_t n);

/* The top k experts of each of the nt rows of x (nt, hidden): idx and w
 * (nt, top_k), best first. seg: rows per sequence for the router product
 * (blas.h). */
int x3_moe_route(const struct x3_moe *p, const float *x, int64_t nt, int64_t seg, int32_t *idx, float *w);
/* The batch of expert e among nt routed tokens (idx, w as x3_moe_route):
 * the tokens routed to it in token order, rows (n) their indices and rw
 * (n) their routing weights; returns n (at most nt). x3_moe_forward
 * multiplies exactly these batches, so a caller that runs the experts
 * one at a time over the same tokens (the model's expert-major forward)
 * gets the same products. */
int64_t x3_moe_rows(const struct x3_moe *p, const int32_t *idx, const float *w, int64_t nt, int64_t e,
                    int64_t *rows, float *rw);
/* y (nt, hidden) = the block's output (overwritten). */
int x3_moe_forward(const struct x3_moe *p, const float *x, int64_t nt, int64_t seg, float *y);

#endif

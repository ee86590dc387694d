/* rope.c: rotary position embedding of the forward (model_impl.h): the
 * inverse frequencies with rope_scaling's default, linear, llama3, yarn
 * and longrope rules, the cos/sin tables of a batch's positions, and the
 * rotation of query and key vectors (rotate-half or interleaved pairs). */
#include <math.h>
#include "model_impl.h"

/* The dimensions RoPE rotates: the head's first rot_dim
 * (partial_rotary_factor; all of it by default), or MLA's rope part. */
int64_t x3m_rope_dim(const x3_model_config *c)
{
	return c->mla ? c->qk_rope : c->rot_dim > 0 ? c->rot_dim : c->head_dim;
}

/* YaRN (Hugging Face's _compute_yarn_parameters): the dimension where a
 * wavelength makes ROT turns in the original context */
static double yarn_dim(double rot, double dim, double base, double orig)
{
	return dim * log(orig / (rot * 2 * M_PI)) / (2 * log(base));
}

/* RoPE inverse frequencies (rope_dim/2), with rope_scaling applied, for
 * rows of cols tokens (longrope's factors depend on the row length). */
static void rope_freqs(const x3_model_config *c, int64_t cols, double *f)
{
	int64_t rd = x3m_rope_dim(c), half = rd / 2;
	double lo = 0, hi = 0;
	if (c->rope_type == 3) {
		/* the ramp between extrapolated (fast) and interpolated (slow)
		 * frequencies, its ends truncated to whole dimensions unless
		 * rope_scaling says truncate false */
		double orig = (double)c->rope_orig_max_pos;
		lo = yarn_dim(c->rope_beta_fast, (double)rd, c->rope_theta, orig);
		hi = yarn_dim(c->rope_beta_slow, (double)rd, c->rope_theta, orig);
		if (c->rope_truncate)   /* rope_scaling's truncate (GPT-OSS: false) */
			lo = floor(lo), hi = ceil(hi);
		lo = fmax(lo, 0);
		hi = fmin(hi, (double)rd - 1);
		if (lo == hi)
			hi += 0.001;
	}
	for (int64_t i = 0; i < half; i++) {
		double inv = 1.0 / pow(c->rope_theta, (double)(2 * i) / (double)rd);
		if (c->rope_type == 3) {
			double ramp = fmin(fmax(((double)i - lo) / (hi - lo), 0), 1);
			double ex = 1 - ramp;   /* the extrapolation's share */
			inv = inv / c->rope_factor * (1 - ex) + inv * ex;
		}
		if (c->rope_type == 4) {
			/* longrope: as Hugging Face's dynamic update, the long
			 * factors once a row passes the original context */
			inv /= cols > c->rope_orig_max_pos ? c->rope_long[i] : c->rope_short[i];
		} else if (c->rope_type == 1) {
			inv /= c->rope_factor;
		} else if (c->rope_type == 2) {
			/* Llama 3.1: long wavelengths slowed by factor, short ones
			 * kept, a linear blend in between. */
			double old = (double)c->rope_orig_max_pos;
			double lo_wl = old / c->rope_low_freq, hi_wl = old / c->rope_high_freq;
			double wl = 2.0 * M_PI / inv;
			if (wl > lo_wl) {
				inv /= c->rope_factor;
			} else if (wl >= hi_wl) {
				double s = (old / wl - c->rope_low_freq) /
				           (c->rope_high_freq - c->rope_low_freq);
				inv = (1 - s) * inv / c->rope_factor + s * inv;
			}
		}
		f[i] = inv;
	}
}

/* The cos and sin tables of positions 0..cols-1 (model_impl.h) */
void x3m_rope_table(const x3_model_config *c, int64_t cols, double *fr, float *cosv, float *sinv)
{
	int64_t half = x3m_rope_dim(c) / 2;
	rope_freqs(c, cols, fr);
	/* yarn and longrope scale cos and sin by their attention factor */
	double af = c->rope_type == 3 || c->rope_type == 4 ? c->rope_attn_factor : 1.0;
	for (int64_t p = 0; p < cols; p++)
		for (int64_t i = 0; i < half; i++) {
			double ang = (double)p * fr[i];
			cosv[p * half + i] = (float)(cos(ang) * af);
			sinv[p * half + i] = (float)(sin(ang) * af);
		}
}

/* RoPE in place on the rd dimensions at offset off of (ntok, nh, stride)
 * vectors; position of token t is t % cols. cosv, sinv: (cols, rd/2).
 * Rotate-half pairs (i, i + rd/2), or with interleave the pairs (2i, 2i+1)
 * (DeepSeek's rope_interleave: Hugging Face de-interleaves q and k alike
 * before its rotate-half, the same scores). */
void x3m_rope_part(float *x, int64_t ntok, int64_t nh, int64_t stride, int64_t off, int64_t rd,
                   int interleave, int64_t cols, const float *cosv, const float *sinv)
{
	int64_t half = rd / 2, ia = interleave ? 2 : 1, ib = interleave ? 1 : half;
	#pragma omp parallel for if(ntok * nh * rd > (1 << 16)) schedule(static)
	for (int64_t t = 0; t < ntok; t++) {
		const float *cp = cosv + (t % cols) * half, *sp = sinv + (t % cols) * half;
		for (int64_t h = 0; h < nh; h++) {
			float *v = x + (t * nh + h) * stride + off;
			for (int64_t i = 0; i < half; i++) {
				float a = v[i * ia], b = v[i * ia + ib];
				v[i * ia] = a * cp[i] - b * sp[i];
				v[i * ia + ib] = b * cp[i] + a * sp[i];
			}
		}
	}
}

/* Rotate-half RoPE in place on the first rd dimensions of (ntok, nh, hd)
 * vectors (rd < hd: partial_rotary_factor, the rest unrotated). */
void x3m_rope_apply(float *x, int64_t ntok, int64_t nh, int64_t hd, int64_t rd, int64_t cols,
                    const float *cosv, const float *sinv)
{
	x3m_rope_part(x, ntok, nh, hd, 0, rd, 0, cols, cosv, sinv);
}


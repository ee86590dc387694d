/* codec.h: the EXL3 codec (exl3(5) §3-§9).
 * Contract between the codec pieces; each piece lives in its own .c file:
 *   codebook.c  - 3inst / mcg / mul1: 16-bit state -> fp16 value (exl3(5) §5)
 *   trellis.c   - tile permutation (exl3(5) §4.2), pack/unpack of
 *                 16x16 tiles (exl3(5) §3),
 *                 decode of a trellis tensor to W~ (exl3(5) §7)
 *   viterbi.c   - tail-biting Viterbi encoder of 256-value tiles (exl3(5) §9.6):
 *                 plain C reference and the fast path's driver, with its
 *                 kernels per instruction set in viterbi_scalar.c,
 *                 viterbi_avx2.c and viterbi_avx512.c
 *   hadamard.c  - blockwise Hadamard-128 (exl3(5) §6.1)
 *   exl3.c, exl3mm.c - the EXL3 linear (exl3.h)
 * The quantizer that uses them is lib/quant/ (quant.h). */
#ifndef X3_CODEC_H
#define X3_CODEC_H

#include "x3.h"

/* Codebook ids as in ExLlamaV3 (cb = 0/1/2). */
enum { X3_CB_3INST = 0, X3_CB_MCG = 1, X3_CB_MUL1 = 2, X3_CB_COUNT };
#define X3_MCG_MULT  0xCBAC1FEDu
#define X3_MUL1_MULT 0x83DCD12Du
/* RMS the regularizer normalizes rows to (exl3(5) §9.2 step 7) */
#define X3_CODEBOOK_SCALE 1.24371088f

int x3_codebook_parse(const char *s, int *cb);   /* "mul1","mcg","3inst" */
const char *x3_codebook_name(int cb);
/* fp16 bits of the codebook value of a 16-bit state (bit-exact, exl3(5) §5). */
uint16_t x3_codebook_f16(int cb, uint32_t state);
float x3_codebook(int cb, uint32_t state);
/* Table of all 65536 values as float (static, built once, thread-safe). */
const float *x3_codebook_table(int cb);

/* ---- tiles ------------------------------------------------------------ */
/* trellis position i (0..255) -> row-major index 16*r + c in a tile */
extern const uint8_t x3_tile_perm[256];
/* row-major index -> trellis position */
extern const uint8_t x3_tile_iperm[256];

/* Pack 256 states (trellis order) of one tile at K bits into 16*K words
 * (stored layout of exl3(5) §3.2). Only the low K bits of each state are used. */
void x3_trellis_pack(int K, const uint16_t *states, uint16_t *words);
/* Unpack 16*K words into 256 states (exl3(5) §3.3, circular windows). */
void x3_trellis_unpack(int K, const uint16_t *words, uint16_t *states);
/* Decode a trellis tensor (k/16, n/16, 16K) int16 to W~ (k x n row-major
 * float, fp16-exact values). */
int x3_trellis_decode(int K, int cb, const uint16_t *trellis, int64_t k,
                      int64_t n, float *w /* (k, n) */);

/* ---- Viterbi ---------------------------------------------------------- */
/* Encode ntiles tiles of 256 target values each (trellis order) at K bits
 * with codebook cb: tail-biting two-pass Viterbi (exl3(5) §9.6). Writes states
 * (ntiles x 256, may be NULL) and decoded values (ntiles x 256, may be
 * NULL). threads <= 0: OpenMP default. Returns X3_OK or an error
 * (bad K/cb, allocation). x3_viterbi_ref is the plain C reference; the
 * fast path gives bit-identical output.
 * Definition (viterbi.c has the details): fp32 costs c = fmaf(d, d, prev)
 * with d = cb[s] - x (targets used as given, not rounded to fp16), strict
 * < so the smallest k wins ties; pass 1 from position 128 unconstrained,
 * anchor = trace-back from the argmin of the FINAL costs (lowest edge on
 * ties; ExLlamaV3's penultimate-buffer quirk is not reproduced); pass 2
 * constrained to start and end at that edge, so every tile is tail-biting.
 * Targets must be finite with |x| <= 1e16 (else X3_ENUM naming the tile).
 * Each OpenMP thread keeps a workspace between calls (0.5-8.5 MB, the most
 * at K = 4), and the codebook re-laid-out per (K, codebook) is kept. */
int x3_viterbi_encode(int K, int cb, const float *x, int64_t ntiles,
                      uint16_t *states, float *values, int threads);
int x3_viterbi_encode_ref(int K, int cb, const float *x, int64_t ntiles,
                          uint16_t *states, float *values);
/* Optional replacement of x3_viterbi_encode, e.g. the bit-identical GPU
 * encoder of the GPU backend (device.h viterbi_encode): while set, x3_viterbi_encode
 * (and with it everything in quant.h) calls fn after checking its
 * arguments; NULL restores the CPU encoder. Set it once, before encoding.
 * (Added by the cuda branch.) */
typedef int (*x3_viterbi_backend_fn)(int K, int cb, const float *x, int64_t ntiles,
                                     uint16_t *states, float *values);
void x3_viterbi_set_backend(x3_viterbi_backend_fn fn);
/* Instruction set of the fast path: chosen at run time from the CPU
 * (AVX-512 F/BW/VL, else AVX2+FMA, else portable scalar). set_isa forces
 * one (X3_ISA_AUTO restores the automatic choice; X3_EUNSUP if the CPU
 * lacks it); for tests and benchmarks, not to be called while encoding. */
enum { X3_ISA_AUTO = 0, X3_ISA_SCALAR = 1, X3_ISA_AVX2 = 2, X3_ISA_AVX512 = 3 };
int x3_viterbi_isa(void);
int x3_viterbi_set_isa(int isa);
const char *x3_viterbi_isa_name(int isa);

/* ---- Hadamard --------------------------------------------------------- */
/* In-place normalized (1/sqrt(128)) Sylvester H128 over each 128-chunk of
 * each row: x is (rows, cols) row-major, cols % 128 == 0. */
void x3_had128_rows(float *x, int64_t rows, int64_t cols);
/* Same along columns: each column's 128-chunks of rows, rows % 128 == 0. */
void x3_had128_cols(float *x, int64_t rows, int64_t cols);

#endif

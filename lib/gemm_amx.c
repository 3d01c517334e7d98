/* BF16 GEMM on Intel AMX: C = A B^T with B stored (N,K). See gemm_amx.h. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "gemm_amx.h"
#include "grow.h"
#include "lrmoe.h"

#if defined(__x86_64__) && defined(__GNUC__) && __GNUC__ >= 11
#define HAVE_AMX_BUILD 1
#include <cpuid.h>
#include <immintrin.h>
#include "simd_bf16.h"
#include "simd_tr16.h"
#endif

struct lrmoe_amx {
    int64_t M, K, MB;     /* packed operand: rows, depth, 16-row blocks */
    uint32_t *P;          /* MB * (K/2) * 16 pairs */
    size_t cap;
    uint16_t *row;        /* 16 rows of K: F32 rows rounded to BF16 */
    size_t rcap;
    uint16_t *W;          /* B in tile order: amx_kernel's copy of 32 rows, or the nn kernel's
                             pair-interleaved rows */
    size_t wcap;
    float *Cs;            /* partial C tiles between K chunks: (MB+1)/2 x 4 x 256 */
    size_t ccap;
    uint16_t *PA;         /* lrmoe_amx_gemm_nn: A as 16x32 tiles, MB x (K/32) x 512 */
    size_t pacap;
};

static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static int amx_ok;

static void amx_probe(void)
{
#ifdef HAVE_AMX_BUILD
    const char *e = getenv("LRMOE_AMX");
    if (e && !strcmp(e, "0")) return;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    if (!(d & (1u << 24)) || !(d & (1u << 22))) return;   /* AMX-TILE, AMX-BF16 */
    /* Linux: ask for the tile data state (ARCH_REQ_XCOMP_PERM, XTILEDATA) */
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return;
    amx_ok = 1;
#endif
}

int lrmoe_amx_available(void)
{
    pthread_once(&amx_once, amx_probe);
    return amx_ok;
}

int lrmoe_amx_shape_ok(int64_t N, int64_t K)
{
    return N > 0 && K > 0 && N % 16 == 0 && K % 32 == 0;
}

lrmoe_amx_t *lrmoe_amx_new(void)
{
    lrmoe_amx_t *x = calloc(1, sizeof *x);
    if (!x) lrmoe_err("gemm: out of memory");
    return x;
}

void lrmoe_amx_free(lrmoe_amx_t *x)
{
    if (!x) return;
    free(x->P);
    free(x->row);
    free(x->W);
    free(x->Cs);
    free(x->PA);
    free(x);
}


#ifdef HAVE_AMX_BUILD

/* one 16-row block of A (mv valid rows, src[j] as 32-bit pairs) into the
 * pair-interleaved tile layout: d[r][j] = src[j][r] */
__attribute__((target("avx512f")))
static void pack_block(const uint32_t *const *src, int64_t mv, int64_t K2, uint32_t *d)
{
    __m512i r[16];
    for (int64_t r0 = 0; r0 < K2; r0 += 16) {
        for (int j = 0; j < 16; j++)
            r[j] = j < mv ? _mm512_loadu_si512((const void *)(src[j] + r0)) : _mm512_setzero_si512();
        lrmoe_tr16(r);
        for (int i = 0; i < 16; i++) _mm512_store_si512((void *)(d + (r0 + i) * 16), r[i]);
    }
}
#endif

int lrmoe_amx_pack(lrmoe_amx_t *x, int64_t M, int64_t K, const void *A, int a_f32, int64_t lda)
{
    const int64_t MB = (M + 15) / 16, K2 = K / 2;
    uint32_t *P = lrmoe_grow64((void **)&x->P, &x->cap, (size_t)(MB * K2 * 16) * sizeof *P);
    if (!P) return -1;
    uint16_t *rows = NULL;
    if (a_f32 && !(rows = lrmoe_grow64((void **)&x->row, &x->rcap, (size_t)(16 * K) * 2))) return -1;
    if (!lrmoe_grow64((void **)&x->W, &x->wcap, (size_t)(32 * K) * 2) ||
        !lrmoe_grow64((void **)&x->Cs, &x->ccap, (size_t)((MB + 1) / 2 * 4 * 256) * sizeof(float)))
        return -1;
    x->M = M; x->K = K; x->MB = MB;
    for (int64_t mb = 0; mb < MB; mb++) {
        const int64_t m0 = mb * 16, mv = M - m0 < 16 ? M - m0 : 16;
        const uint32_t *src[16];
        for (int64_t j = 0; j < mv; j++) {
            if (a_f32) {
                lrmoe_convert_from_f32(LRMOE_BF16, (const float *)A + (m0 + j) * lda,
                                       rows + j * K, (size_t)K);
                src[j] = (const uint32_t *)(rows + j * K);
            } else {
                src[j] = (const uint32_t *)((const uint16_t *)A + (m0 + j) * lda);
            }
        }
#ifdef HAVE_AMX_BUILD
        pack_block(src, mv, K2, P + mb * K2 * 16);
#endif
    }
    return 0;
}

#ifdef HAVE_AMX_BUILD
typedef struct {
    uint8_t palette, start_row, res[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg_t;

#ifndef KC
#define KC 256   /* K chunk (partial C tiles kept in Cs between chunks): the nn kernel's
                    32-column panel chunk of W (16 KiB) stays in L1 across the rows of A */
#endif

/* The accumulator tiles 4..7, kept across K chunks in cs (4 x 16x16 F32):
 * acc_begin zeroes them on the first chunk and loads them back after, acc_spill
 * stores them for the next chunk, tile_out copies tile 4+t to tmp. */
__attribute__((target("amx-tile")))
static inline void acc_begin(const float *cs, int first)
{
    if (first) {
        _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7);
    } else {
        _tile_loadd(4, cs, 64); _tile_loadd(5, cs + 256, 64);
        _tile_loadd(6, cs + 512, 64); _tile_loadd(7, cs + 768, 64);
    }
}

__attribute__((target("amx-tile")))
static inline void acc_spill(float *cs)
{
    _tile_stored(4, cs, 64); _tile_stored(5, cs + 256, 64);
    _tile_stored(6, cs + 512, 64); _tile_stored(7, cs + 768, 64);
}

__attribute__((target("amx-tile")))
static inline void tile_out(int t, float tmp[16][16])
{
    switch (t) {
    case 0: _tile_stored(4, tmp, 64); break;
    case 1: _tile_stored(5, tmp, 64); break;
    case 2: _tile_stored(6, tmp, 64); break;
    default: _tile_stored(7, tmp, 64); break;
    }
}

/* tiles 4..7 (C^T of rows m0.. and m0+16.. of A, columns n0.. and n0+16..)
 * out to C, transposed: F32, added when acc, or rounded to BF16 (obf) */
__attribute__((target("amx-tile,avx512f")))
static void store_c(void *C, int64_t ldc, int64_t M, int64_t m0, int64_t n0, int two_m,
                    int two_n, int acc, int obf)
{
    float tmp[16][16] __attribute__((aligned(64)));
    for (int t = 0; t < 4; t++) {
        if (((t & 1) && !two_m) || ((t & 2) && !two_n)) continue;
        tile_out(t, tmp);
        __m512i r[16];
        for (int i = 0; i < 16; i++) r[i] = _mm512_load_si512((const void *)tmp[i]);
        lrmoe_tr16(r);                                  /* r[j]: C row m, columns nn.. */
        const int64_t mm = m0 + (t & 1 ? 16 : 0), nn = n0 + (t & 2 ? 16 : 0);
        const int64_t mv = M - mm < 16 ? M - mm : 16;
        for (int64_t j = 0; j < mv && obf; j++)
            _mm256_storeu_si256((void *)((uint16_t *)C + (mm + j) * ldc + nn), lrmoe_bf16_16(r[j]));
        for (int64_t j = 0; j < mv && !obf; j++) {
            float *c = (float *)C + (mm + j) * ldc + nn;
            __m512 v = _mm512_castsi512_ps(r[j]);
            if (acc) v = _mm512_add_ps(_mm512_loadu_ps(c), v);
            _mm512_storeu_ps(c, v);
        }
    }
}

/* tile registers: 0,1 B rows (n blocks), 2,3 packed A (m blocks), 4..7 C.
 * Two ways to feed the B tiles, the same arithmetic (the same bits):
 * - direct: tile loads straight from B's rows (row stride ldb), no software
 *   prefetch: a tile load reads one line from each of 16 rows, so the 32
 *   rows of a block are 32 sequential streams the hardware prefetcher
 *   follows. Taken when B's rows are 64-byte aligned, or for few rows of A
 *   (MB <= DIRECT_MB) whatever the alignment;
 * - copy: each 32-row block copied into tile order in W (contiguous 1 KiB
 *   tiles, reused from L1 by every row pair of a K chunk), the next block
 *   prefetched into L2 over this block's steps.
 * Measured (128 experts streamed, the forward's three GEMMs, rows at 48
 * bytes past a line as in a weights file): M=64 0.149 s direct against
 * 0.226 s copy, M=96 0.199 / 0.251, M=128 0.254 / 0.245, M=256 0.445 /
 * 0.415; with 64-byte aligned rows direct won at M=64-256 (M=128 0.19 /
 * 0.23-0.25, M=256 0.34 / 0.36). Weights files are written 64-byte aligned
 * (lrmoe-stream(5)), so direct is the common case; copy stays for older
 * files (rows 48 bytes past a line) at M > 96: in the forward at 4096 tokens
 * (M=256 per expert, 3 rounds, the gemm stage) direct on such rows took
 * 524-544 ms against copy's 433-444 ms, and 392-425 ms on aligned rows
 * (copy on aligned rows 406-422 ms); at 2048 (M=128) aligned direct
 * 215-219 ms, copy 244-264 ms aligned or not. */
#ifndef DIRECT_MB
#define DIRECT_MB 6
#endif
__attribute__((target("amx-tile,amx-bf16,avx512f")))
static void amx_kernel(const lrmoe_amx_t *x, int64_t N, const uint16_t *B, int64_t ldb,
                       void *C, int64_t ldc, int acc, int obf)
{
    tilecfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
    _tile_loadconfig(&cfg);
    const int64_t K = x->K, K2 = K / 2, MB = x->MB, M = x->M;
    const int direct = ((uintptr_t)B % 64 == 0 && (ldb * 2) % 64 == 0) || MB <= DIRECT_MB;
    uint16_t *W = x->W;
    float *Cs = x->Cs;
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
        const int two_n = n0 + 16 < N;
        /* tile of rows n0.. (B0) and n0+16.. (B1) at k: B0 + k * kx, row stride bs */
        const uint16_t *B0 = W, *B1 = W + 512;
        int64_t kx = 32, bs = 64, lines = 0, per = 0, pl = 0, pc = 0;
        const uint16_t *pr = B + (n0 + 32) * ldb;
        if (direct) {
            B0 = B + n0 * ldb; B1 = B0 + 16 * ldb; kx = 1; bs = ldb * 2;
        } else {
            for (int64_t i = 0; i < (two_n ? 32 : 16); i++) {
                const uint16_t *src = B + (n0 + i) * ldb;
                uint16_t *dst = W + ((i >> 4) * 16 + (i & 15)) * 32;
                for (int64_t k = 0; k < K; k += 32)
                    _mm512_store_si512((void *)(dst + k * 32), _mm512_loadu_si512((const void *)(src + k)));
            }
            /* prefetch of the next 32 rows of B into L2, spread over this block */
            const int64_t pn = N - (n0 + 32) < 32 ? N - (n0 + 32) : 32;
            const int64_t iters = (MB + 1) / 2 * (K / 32);
            lines = pn > 0 ? pn * (K / 32) : 0;
            per = iters ? (lines + iters - 1) / iters : 0;
        }
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
            const int64_t k1 = k0 + KC < K ? k0 + KC : K;
            for (int64_t mb = 0; mb < MB; mb += 2) {
                const int two_m = mb + 1 < MB;
                const uint32_t *p0 = x->P + mb * K2 * 16, *p1 = p0 + K2 * 16;
                float *cs = Cs + (mb / 2) * 4 * 256;
                acc_begin(cs, k0 == 0);
                for (int64_t k = k0; k < k1; k += 32) {
                    for (int64_t q = 0; q < per && pl < lines; q++, pl++) {
                        _mm_prefetch((const char *)(pr + pc), _MM_HINT_T1);
                        if ((pc += 32) == K) { pc = 0; pr += ldb; }
                    }
                    _tile_loadd(0, B0 + k * kx, bs);
                    _tile_loadd(2, p0 + (k / 2) * 16, 64);
                    _tile_dpbf16ps(4, 0, 2);
                    if (two_m) { _tile_loadd(3, p1 + (k / 2) * 16, 64); _tile_dpbf16ps(5, 0, 3); }
                    if (two_n) {
                        _tile_loadd(1, B1 + k * kx, bs);
                        _tile_dpbf16ps(6, 1, 2);
                        if (two_m) _tile_dpbf16ps(7, 1, 3);
                    }
                }
                if (k1 == K) {
                    store_c(C, ldc, M, mb * 16, n0, two_m, two_n, acc, obf);
                } else {
                    acc_spill(cs);
                }
            }
        }
    }
    _tile_release();
}
#endif

#ifndef NG
#define NG 2048  /* lrmoe_amx_gemm_nn: columns of B interleaved at a time (whole rows of
                    the layer's matrices: rows read contiguously, measured 1.4-1.5x
                    faster than 128 columns at a time) */
#endif
/* The nn kernel's blocking (the same in the kernel and in its callers'
 * buffer sizes). B is pair-interleaved into W kh rows by ng columns at a
 * time, in one of two ways:
 * - when K > KH, A has at most CHUNK_PAIRS row pairs (M <= 64: where it was
 *   measured to win) and the partial C tiles of whole rows fit in CSB
 *   blocks of 4 tiles (N/32 panels x (MB+1)/2 row pairs, 512 KiB): whole
 *   rows, KH rows at a time (W stays in L2), each chunk's (row pair, panel)
 *   blocks with row pairs outermost, the partial C tiles kept in Cs between
 *   chunks (*chunked = 1);
 * - else whole K, NG columns at a time, panels outermost and, per panel,
 *   K in KC-deep chunks across every row pair (the chunk of the panel stays
 *   in L1), the row pairs' partial C tiles kept in Cs.
 * Measured at M=64 (the 1024-token layer, 128 experts streamed, the dx
 * GEMMs): 0.124-0.126 s the first way against 0.163 s with 1024-column
 * groups and whole K interleaved (3 MiB of W: out of L2) for the second. */
#ifndef KH
#define KH 256
#endif
#ifndef CSB
#define CSB 128
#endif
#ifndef RG
#define RG 4     /* K of one KC chunk (the weight gradients, K = a segment's rows): row
                    pairs of A taken RG at a time (their 16 KiB of A tiles stay in L1), all
                    panels per group; measured 0.162-0.168 s against 0.174-0.182 s with
                    panels outermost (the three weight gradients, M=64, 128 experts) */
#endif
#ifndef CHUNK_PAIRS
#define CHUNK_PAIRS 2
#endif
static void nn_geom(int64_t M, int64_t N, int64_t K, int64_t *ng, int64_t *kh, int *chunked)
{
    const int64_t pairs = ((M + 15) / 16 + 1) / 2, n32 = (N + 31) / 32 * 32;
    *chunked = K > KH && pairs <= CHUNK_PAIRS && pairs * (n32 / 32) <= CSB;
    *ng = *chunked || n32 < NG ? n32 : NG;
    *kh = *chunked ? KH : K;
}

static size_t nn_cs_floats(int64_t M, int64_t N, int64_t K)
{
    int64_t ng, kh;
    int ch;
    nn_geom(M, N, K, &ng, &kh, &ch);
    return (size_t)((ch ? ng / 32 : 1) * (((M + 15) / 16 + 1) / 2) * 4 * 256);
}

#ifdef HAVE_AMX_BUILD
/* rows [k0, k1) of B (rows Kr.. read as zero), columns [g0, g1), pair-
 * interleaved into W: panel p (columns g0 + 32p..) at W + p * 32 * (k1-k0),
 * k step s of the chunk at + s * 1024: the two 16-column tiles, row r =
 * (row 2r, row 2r+1) of the step's 32 rows */
__attribute__((target("avx512f,avx512bw")))
static void nn_interleave(uint16_t *W, const uint16_t *B, int64_t ldb, int64_t N, int64_t Kr,
                          int64_t k0, int64_t k1, int64_t g0, int64_t g1)
{
    uint16_t i0[32], i1[32];
    for (int i = 0; i < 16; i++) {
        i0[2 * i] = (uint16_t)i; i0[2 * i + 1] = (uint16_t)(32 + i);
        i1[2 * i] = (uint16_t)(16 + i); i1[2 * i + 1] = (uint16_t)(48 + i);
    }
    const __m512i x0 = _mm512_loadu_si512((const void *)i0), x1 = _mm512_loadu_si512((const void *)i1);
    const int64_t ps = 32 * (k1 - k0);
    for (int64_t k = k0; k < k1; k += 2)
        for (int64_t n0 = g0; n0 < g1; n0 += 32) {
            const __mmask32 lm = n0 + 16 < N ? 0xffffffffu : 0xffffu;
            __m512i e = k < Kr ? _mm512_maskz_loadu_epi16(lm, (const void *)(B + k * ldb + n0))
                               : _mm512_setzero_si512();
            __m512i o = k + 1 < Kr ? _mm512_maskz_loadu_epi16(lm, (const void *)(B + (k + 1) * ldb + n0))
                                   : _mm512_setzero_si512();
            uint16_t *d = W + ((n0 - g0) / 32) * ps + ((k - k0) / 32) * 1024 + ((k % 32) / 2) * 32;
            _mm512_store_si512((void *)d, _mm512_permutex2var_epi16(e, x0, o));
            _mm512_store_si512((void *)(d + 512), _mm512_permutex2var_epi16(e, x1, o));
        }
}

/* One block of C = A B: rows m0 = mb*16.. (and m0+16.. when two_m), columns
 * n0.. (and n0+16.. when two_n), k steps [ks0, ks1) of W's panel Wp (indexed
 * by the absolute k step). Tiles 0,1 A (a0, a1), 2,3 B pair-interleaved,
 * 4..7 C (m0,n0) (m0,n1) (m1,n0) (m1,n1): zero (first) or loaded from cs,
 * then spilled back to cs, or written to C when the chunk ends K (last;
 * + C when acc; non-temporal stores where 64-byte aligned when nt). Each C
 * tile sums its k steps in ascending k. */
__attribute__((target("amx-tile,amx-bf16,avx512f")))
static inline void nn_block(const uint16_t *a0, const uint16_t *a1, const uint16_t *Wp,
                            int64_t ks0, int64_t ks1, float *cs, int first, int last, int two_m,
                            int two_n, float *C, int64_t ldc, int64_t M, int64_t mb, int64_t n0,
                            int acc, int nt)
{
    acc_begin(cs, first);
    for (int64_t ks = ks0; ks < ks1; ks++) {
        _tile_loadd(2, Wp + ks * 1024, 64);
        _tile_loadd(0, a0 + ks * 512, 64);
        _tile_dpbf16ps(4, 0, 2);
        if (two_n) { _tile_loadd(3, Wp + ks * 1024 + 512, 64); _tile_dpbf16ps(5, 0, 3); }
        if (two_m) {
            _tile_loadd(1, a1 + ks * 512, 64);
            _tile_dpbf16ps(6, 1, 2);
            if (two_n) _tile_dpbf16ps(7, 1, 3);
        }
    }
    if (!last) {
        acc_spill(cs);
        return;
    }
    float tmp[16][16] __attribute__((aligned(64)));
    for (int t = 0; t < 4; t++) {
        if (((t & 1) && !two_n) || ((t & 2) && !two_m)) continue;
        tile_out(t, tmp);
        const int64_t mm = (mb + (t & 2 ? 1 : 0)) * 16, nn = n0 + (t & 1 ? 16 : 0);
        const int64_t mv = M - mm < 16 ? M - mm : 16;
        for (int64_t j = 0; j < mv; j++) {
            float *c = C + (mm + j) * ldc + nn;
            __m512 v = _mm512_load_ps(tmp[j]);
            if (acc) v = _mm512_add_ps(_mm512_loadu_ps(c), v);
            if (nt && !((uintptr_t)c & 63)) _mm512_stream_ps(c, v);
            else _mm512_storeu_ps(c, v);
        }
    }
}

/* C = A B, blocked as nn_geom says: per group of ng columns and chunk of kh
 * rows of B, the chunk is interleaved into W (nn_interleave), then the
 * (row pair of A, panel, K chunk) blocks run (nn_block). */
__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw")))
static void amx_kernel_nn(const lrmoe_amx_t *x, int64_t M, int64_t N, int64_t K, int64_t Kr,
                          const uint16_t *B, int64_t ldb, float *C, int64_t ldc, int acc, int nt)
{
    tilecfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
    _tile_loadconfig(&cfg);
    const int64_t MB = (M + 15) / 16, KS = K / 32, pairs = (MB + 1) / 2;
    int64_t ng, kh;
    int chunked;
    nn_geom(M, N, K, &ng, &kh, &chunked);
    uint16_t *W = x->W;
    for (int64_t g0 = 0; g0 < N; g0 += ng) {
        const int64_t g1 = g0 + ng < N ? g0 + ng : N, np = (g1 - g0 + 31) / 32;
        for (int64_t k0 = 0; k0 < K; k0 += kh) {
            const int64_t k1 = k0 + kh < K ? k0 + kh : K, ks0 = k0 / 32, ks1 = k1 / 32;
            nn_interleave(W, B, ldb, N, Kr, k0, k1, g0, g1);
            for (int64_t i = 0; chunked && i < pairs * np; i++) {
                const int64_t pr = i / np, p = i % np, mb = 2 * pr, n0 = g0 + 32 * p;
                const uint16_t *a0 = x->PA + mb * KS * 512;
                nn_block(a0, a0 + KS * 512, W + p * 32 * (k1 - k0) - ks0 * 1024, ks0, ks1,
                         x->Cs + (p * pairs + pr) * 4 * 256, k0 == 0, k1 == K, mb + 1 < MB,
                         n0 + 16 < N, C, ldc, M, mb, n0, acc, nt);
            }
            /* one K chunk: groups of RG row pairs outermost, so their A tiles
             * stay in L1 across the panels (each panel's W read once a group);
             * the same blocks, each of whole K, as the loop below */
            const int grouped = !chunked && KS <= KC / 32 && RG > 1;
            for (int64_t mg = 0; grouped && mg < MB; mg += 2 * RG)
                for (int64_t p = 0; p < np; p++)
                    for (int64_t mb = mg; mb < MB && mb < mg + 2 * RG; mb += 2) {
                        const int64_t n0 = g0 + 32 * p;
                        const uint16_t *a0 = x->PA + mb * KS * 512;
                        nn_block(a0, a0 + KS * 512, W + p * 32 * K, 0, KS,
                                 x->Cs + (mb / 2) * 4 * 256, 1, 1, mb + 1 < MB,
                                 n0 + 16 < N, C, ldc, M, mb, n0, acc, nt);
                    }
            for (int64_t p = 0; !chunked && !grouped && p < np; p++) {
                const int64_t n0 = g0 + 32 * p;
                for (int64_t c0 = 0; c0 < KS; c0 += KC / 32) {
                    const int64_t c1 = c0 + KC / 32 < KS ? c0 + KC / 32 : KS;
                    for (int64_t mb = 0; mb < MB; mb += 2) {
                        const uint16_t *a0 = x->PA + mb * KS * 512;
                        nn_block(a0, a0 + KS * 512, W + p * 32 * K, c0, c1,
                                 x->Cs + (mb / 2) * 4 * 256, c0 == 0, c1 == KS, mb + 1 < MB,
                                 n0 + 16 < N, C, ldc, M, mb, n0, acc, nt);
                    }
                }
            }
        }
    }
    if (nt) _mm_sfence();
    _tile_release();
}

/* A^T of A (Kr,M) (row stride lda) into PA as the nn kernel's A tiles for
 * K (Kr rounded up to 32): PA[m/16][k/32][m%16][k%32] = A[k][m], zero past
 * M and Kr. Per 32x16 block: row pairs interleaved into 32-bit pairs, then
 * a 16x16 transpose of the pairs. */
__attribute__((target("avx512f,avx512bw")))
static void pack_at(uint16_t *PA, int64_t M, int64_t K, int64_t Kr, const uint16_t *A, int64_t lda)
{
    const int64_t MB = (M + 15) / 16, KS = K / 32;
    uint16_t i0[32];
    for (int i = 0; i < 16; i++) { i0[2 * i] = (uint16_t)i; i0[2 * i + 1] = (uint16_t)(32 + i); }
    const __m512i x0 = _mm512_loadu_si512((const void *)i0);
    __m512i r[16];
    for (int64_t mb = 0; mb < MB; mb++) {
        const int64_t m0 = mb * 16, mv = M - m0 < 16 ? M - m0 : 16;
        const __mmask32 lm = (__mmask32)((1u << mv) - 1u) | (mv == 16 ? 0xffffu : 0u);
        for (int64_t ks = 0; ks < KS; ks++) {
            for (int q = 0; q < 16; q++) {
                const int64_t k = ks * 32 + 2 * q;
                __m512i e = k < Kr ? _mm512_maskz_loadu_epi16(lm, (const void *)(A + k * lda + m0))
                                   : _mm512_setzero_si512();
                __m512i o = k + 1 < Kr ? _mm512_maskz_loadu_epi16(lm, (const void *)(A + (k + 1) * lda + m0))
                                       : _mm512_setzero_si512();
                r[q] = _mm512_permutex2var_epi16(e, x0, o);
            }
            lrmoe_tr16(r);
            uint16_t *d = PA + mb * KS * 512 + ks * 512;
            for (int j = 0; j < 16; j++) _mm512_store_si512((void *)(d + j * 32), r[j]);
        }
    }
}
#endif

/* The A B kernel's scratch, grown to M x N x K (K a multiple of 32): A packed
 * in tile order (returned; NULL when out of memory), the interleaved W block
 * and the partial C tiles, sized by nn_geom / nn_cs_floats as the kernel
 * uses them. */
static uint16_t *nn_scratch(lrmoe_amx_t *x, int64_t M, int64_t N, int64_t K)
{
    const int64_t MB = (M + 15) / 16;
    uint16_t *PA = lrmoe_grow64((void **)&x->PA, &x->pacap, (size_t)(MB * (K / 32) * 512) * 2);
    int64_t ng, kh;
    int ch;
    nn_geom(M, N, K, &ng, &kh, &ch);
    if (!PA || !lrmoe_grow64((void **)&x->W, &x->wcap, (size_t)(ng * kh) * 2) ||
        !lrmoe_grow64((void **)&x->Cs, &x->ccap, nn_cs_floats(M, N, K) * sizeof(float)))
        return NULL;
    return PA;
}

int lrmoe_amx_gemm_tn(lrmoe_amx_t *x, int64_t M, int64_t N, int64_t Kr, const uint16_t *A,
                      int64_t lda, const uint16_t *B, int64_t ldb, float *C, int64_t ldc)
{
    const int64_t K = (Kr + 31) / 32 * 32;
    uint16_t *PA = nn_scratch(x, M, N, K);
    if (!PA) return -1;
#ifdef HAVE_AMX_BUILD
    pack_at(PA, M, K, Kr, A, lda);
    amx_kernel_nn(x, M, N, K, Kr, B, ldb, C, ldc, 0, 1);
#else
    (void)A; (void)lda; (void)B; (void)ldb; (void)C; (void)ldc;
#endif
    return 0;
}

int lrmoe_amx_gemm_nn(lrmoe_amx_t *x, int64_t M, int64_t N, int64_t K, const void *A, int a_f32,
                      int64_t lda, const uint16_t *B, int64_t ldb, float *C, int64_t ldc, int acc)
{
    const int64_t MB = (M + 15) / 16, KS = K / 32;
    uint16_t *PA = nn_scratch(x, M, N, K);
    if (!PA) return -1;
    uint16_t *rows = NULL;
    if (a_f32 && !(rows = lrmoe_grow64((void **)&x->row, &x->rcap, (size_t)K * 2))) return -1;
    for (int64_t m = 0; m < MB * 16; m++) {
        /* row m of A into its tiles: PA[m/16][k/32][m%16][k%32] */
        uint16_t *d = PA + (m / 16) * KS * 512 + (m % 16) * 32;
        const uint16_t *src = rows;
        if (m >= M) {
            for (int64_t ks = 0; ks < KS; ks++) memset(d + ks * 512, 0, 64);
            continue;
        }
        if (a_f32) lrmoe_convert_from_f32(LRMOE_BF16, (const float *)A + m * lda, rows, (size_t)K);
        else src = (const uint16_t *)A + m * lda;
        for (int64_t ks = 0; ks < KS; ks++) memcpy(d + ks * 512, src + ks * 32, 64);
    }
#ifdef HAVE_AMX_BUILD
    amx_kernel_nn(x, M, N, K, K, B, ldb, C, ldc, acc, 0);
#else
    (void)N; (void)B; (void)ldb; (void)C; (void)ldc; (void)acc;
#endif
    return 0;
}

int lrmoe_amx_gemm(lrmoe_amx_t *x, int64_t N, const uint16_t *B, int64_t ldb, float *C,
                   int64_t ldc, int acc)
{
#ifdef HAVE_AMX_BUILD
    amx_kernel(x, N, B, ldb, C, ldc, acc, 0);
#else
    (void)x; (void)N; (void)B; (void)ldb; (void)C; (void)ldc; (void)acc;
#endif
    return 0;
}

int lrmoe_amx_gemm_bf16(lrmoe_amx_t *x, int64_t N, const uint16_t *B, int64_t ldb, uint16_t *C,
                        int64_t ldc)
{
#ifdef HAVE_AMX_BUILD
    amx_kernel(x, N, B, ldb, C, ldc, 0, 1);
#else
    (void)x; (void)N; (void)B; (void)ldb; (void)C; (void)ldc;
#endif
    return 0;
}

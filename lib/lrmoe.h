/* liblrmoe: tensors, frames and streams.
 *
 * The library never prints and never exits: a failing call returns <0 (or
 * NULL) and leaves a message in lrmoe_errmsg(). Only the tools in src/ decide
 * what to print and the exit code.
 */
#ifndef LRMOE_H
#define LRMOE_H

/* Only what the installed headers declare is exported (the library is
 * built with -fvisibility=hidden, lrmoe(3)). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define LRMOE_VERSION "0.8.0"
/* the same as numbers, and as one comparable number (MAJOR*10000 +
 * MINOR*100 + PATCH): #if LRMOE_VERSION_NUMBER >= 600 ... */
#define LRMOE_VERSION_MAJOR 0
#define LRMOE_VERSION_MINOR 8
#define LRMOE_VERSION_PATCH 0
#define LRMOE_VERSION_NUMBER \
    (LRMOE_VERSION_MAJOR * 10000 + LRMOE_VERSION_MINOR * 100 + LRMOE_VERSION_PATCH)
#define LRMOE_MAX_DIMS 8
#define LRMOE_MAX_HEADER (100u << 20) /* safetensors' own limit: 100 MB */
/* What one frame may declare (lrmoe-stream(5), SECURITY): readers refuse more. */
#define LRMOE_MAX_TENSORS (1 << 17)
#define LRMOE_MAX_ATTRS (1 << 17)
/* experts a frame's routed ids may name when no tensor says how many */
#define LRMOE_MAX_EXPERTS (1 << 20)

/* ---------------------------------------------------------------- errors */

/* Set the thread's error message (printf format). Always returns -1. */
int lrmoe_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prefix the current message: "what: <old message>". Returns -1. */
int lrmoe_err_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *lrmoe_errmsg(void);

/* ---------------------------------------------------------------- dtypes */

typedef enum {
    LRMOE_BOOL, LRMOE_U8, LRMOE_I8, LRMOE_U16, LRMOE_I16, LRMOE_U32,
    LRMOE_I32, LRMOE_U64, LRMOE_I64, LRMOE_F16, LRMOE_BF16, LRMOE_F32,
    LRMOE_F64, LRMOE_NDTYPES
} lrmoe_dtype_t;

size_t lrmoe_dtype_size(lrmoe_dtype_t d);
const char *lrmoe_dtype_name(lrmoe_dtype_t d);       /* "BF16" */
int lrmoe_dtype_parse(const char *s, lrmoe_dtype_t *d); /* "BF16"/"bf16" -> 0 */
int lrmoe_dtype_is_float(lrmoe_dtype_t d);

/* Exact scalar conversions; f32->bf16/f16 round to nearest even, NaN and Inf
 * preserved (NaN stays a quiet NaN). */
float lrmoe_bf16_to_f32(uint16_t h);
uint16_t lrmoe_f32_to_bf16(float f);
float lrmoe_f16_to_f32(uint16_t h);
uint16_t lrmoe_f32_to_f16(float f);

/* Convert n elements of src (dtype d) to f32 / from f32. A float to an
 * integer dtype truncates toward zero and saturates at the integer type's
 * range, NaN giving 0 (no undefined conversion). */
void lrmoe_convert_to_f32(lrmoe_dtype_t d, const void *src, float *dst, size_t n);
void lrmoe_convert_from_f32(lrmoe_dtype_t d, const float *src, void *dst, size_t n);
/* Same for f64 and i64 views (integers are exact in i64; u64 > INT64_MAX wraps). */
void lrmoe_convert_to_f64(lrmoe_dtype_t d, const void *src, double *dst, size_t n);
void lrmoe_convert_to_i64(lrmoe_dtype_t d, const void *src, int64_t *dst, size_t n);

/* ---------------------------------------------------------------- tensors */

typedef struct {
    char *name;
    lrmoe_dtype_t dtype;
    int ndim;
    int64_t shape[LRMOE_MAX_DIMS];
    size_t nbytes;   /* numel * dtype size */
    void *data;      /* owned, malloc'd (NULL when nbytes == 0) */
} lrmoe_tensor_t;

int64_t lrmoe_tensor_numel(const lrmoe_tensor_t *t);
/* Shape as text: "[4096,2048]" into buf (always NUL-terminated). */
const char *lrmoe_shape_str(const lrmoe_tensor_t *t, char *buf, size_t len);
/* 0 if t has exactly this rank and these dims (a dim < 0 matches anything);
 * otherwise -1 with "tensor NAME: shape [..], expected [..]". */
int lrmoe_tensor_check(const lrmoe_tensor_t *t, int ndim, const int64_t *dims);
/* Dimension d of t as an int (top-k, experts, ranks): 0, or -1 with
 * "tensor NAME: dimension d is N, more than 2147483647" (never truncated). */
int lrmoe_tensor_dim_int(const lrmoe_tensor_t *t, int d, int *out);
/* The same for a dimension that counts experts or ranks, which must be at
 * least 1: else -1 with "tensor NAME: dimension d is 0 (... at least 1)". */
int lrmoe_tensor_dim_count(const lrmoe_tensor_t *t, int d, int *out);
/* The number of experts n routed ids name when no tensor says it: the
 * largest id + 1, 0 when there is none (negative ids are left to the
 * caller's range check); -1 with "topk_ids: expert N at pair u: more than
 * LRMOE_MAX_EXPERTS experts" past that. */
int lrmoe_experts_from_ids(const int32_t *ids, int64_t n, int *E);
/* A malloc'd f32 / i64 copy of the whole tensor; NULL (with error) on OOM. */
float *lrmoe_tensor_f32(const lrmoe_tensor_t *t);
int64_t *lrmoe_tensor_i64(const lrmoe_tensor_t *t);

/* ---------------------------------------------------------------- frames */

/* One frame: an ordered set of named tensors plus string attributes
 * (safetensors __metadata__). Lookups by name (get, need, put, adopt, del,
 * attr, set_attr) scan the frame: O(n) each; the readers build frames with
 * the _new calls below, O(1) each. Tensor pointers stay valid until the tensor is
 * deleted or replaced, or the frame is cleared. */
typedef struct {
    int ntensors, tcap;
    lrmoe_tensor_t **tensors;
    int nattrs, acap;
    char **keys, **vals;
} lrmoe_frame_t;

/* Memory for tensor data: buffers of 4 MiB and more are 2 MiB aligned and
 * advised as transparent huge pages, so that filling a fresh one costs one
 * page fault per 2 MiB instead of one per 4 KiB, except where the kernel's
 * THP is "never" or a virtio balloon reports free memory to a hypervisor
 * (there huge pages cost more, and the buffers are advised to stay on
 * 4 KiB pages); LRMOE_THP=1 or 0 in the environment forces either.
 * Smaller ones are malloc's. Not zeroed; free() releases either kind.
 * NULL when out of memory. */
void *lrmoe_alloc_big(size_t n);

void lrmoe_frame_init(lrmoe_frame_t *f);
void lrmoe_frame_clear(lrmoe_frame_t *f);  /* frees everything; f reusable */
lrmoe_tensor_t *lrmoe_frame_get(const lrmoe_frame_t *f, const char *name);
/* get, or an error "missing tensor NAME" when absent. */
lrmoe_tensor_t *lrmoe_frame_need(const lrmoe_frame_t *f, const char *name);
/* Which stage writes a stream tensor ("lrmoe-route", ...), NULL if none of
 * lrmoe's; _at(i) walks the table (NULL past its end). */
const char *lrmoe_producer(const char *tensor);
const char *lrmoe_producer_at(int i, const char **tensor);
/* Create (or replace, keeping its position) a zero-filled tensor. */
lrmoe_tensor_t *lrmoe_frame_put(lrmoe_frame_t *f, const char *name,
                                lrmoe_dtype_t dtype, int ndim, const int64_t *shape);
/* Create from f32 values, stored as dtype (converted). */
lrmoe_tensor_t *lrmoe_frame_put_f32(lrmoe_frame_t *f, const char *name,
                                    lrmoe_dtype_t dtype, int ndim,
                                    const int64_t *shape, const float *src);
/* Take ownership of data (malloc'd, nbytes must match). */
lrmoe_tensor_t *lrmoe_frame_adopt(lrmoe_frame_t *f, const char *name,
                                  lrmoe_dtype_t dtype, int ndim,
                                  const int64_t *shape, void *data);
/* adopt for a name known NOT to be in f yet (the parsers: their names are
 * unique already): appends without looking, so building a frame of n tensors
 * costs O(n), not O(n^2). A duplicate name here is the caller's bug. */
lrmoe_tensor_t *lrmoe_frame_adopt_new(lrmoe_frame_t *f, const char *name,
                                      lrmoe_dtype_t dtype, int ndim,
                                      const int64_t *shape, void *data);
int lrmoe_frame_del(lrmoe_frame_t *f, const char *name); /* 1 deleted, 0 absent */
/* The routing weights a dropping backward scales its gradient rows by: a
 * malloc'd F32 copy of tw (topk_weights, (T,K)) times the frame's
 * pair_weight (T,K) F32 (lrmoe-score --select sample: 1/p of each kept
 * pair) when it has one, product rounded to F32; NULL with the error set
 * when pair_weight has another shape or dtype or a value that is not finite
 * and positive, or on OOM. */
float *lrmoe_frame_bwd_alpha(const lrmoe_frame_t *f, const lrmoe_tensor_t *tw, int64_t T,
                             int64_t K);
/* Delete every tensor not named in names[0..n) (keep_only) or named there
 * (drop); attributes stay. The number deleted, or -1. */
int lrmoe_frame_keep_only(lrmoe_frame_t *f, const char *const *names, int n);
int lrmoe_frame_drop(lrmoe_frame_t *f, const char *const *names, int n);
/* Both, with shell globs: a tensor matches pats[k] when its name equals it
 * or fnmatch(3) matches it ("grad_*", "w_[gu]*"); keep != 0 deletes the
 * tensors that match none, keep == 0 those that match one. hits (may be
 * NULL) counts per pattern the tensors that matched it first. The number
 * deleted, or -1. */
int lrmoe_frame_thin(lrmoe_frame_t *f, const char *const *pats, int n, int keep, int64_t *hits);
/* A list of names or globs from options like --keep a,b --keep 'c*', with
 * a hit count per entry (pass v, n, hits to lrmoe_frame_thin). */
typedef struct {
    char **v;
    int n;
    int64_t *hits;
} lrmoe_names_t;
/* Append the comma-separated names of list; -1 on an empty name. */
int lrmoe_names_add(lrmoe_names_t *l, const char *list);
/* -1 with "OPT NAME: no tensor of that name in any frame" for the first
 * entry nothing matched, else 0. */
int lrmoe_names_unmatched(const lrmoe_names_t *l, const char *opt);
void lrmoe_names_free(lrmoe_names_t *l);

const char *lrmoe_frame_attr(const lrmoe_frame_t *f, const char *key); /* NULL if absent */
int lrmoe_frame_set_attr(lrmoe_frame_t *f, const char *key, const char *val);
/* set_attr for a key known NOT to be in f yet (appends, O(1)). */
int lrmoe_frame_set_attr_new(lrmoe_frame_t *f, const char *key, const char *val);
int lrmoe_frame_set_attrf(lrmoe_frame_t *f, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Parse attribute as integer/double; returns 1 found, 0 absent, -1 malformed. */
int lrmoe_frame_attr_i64(const lrmoe_frame_t *f, const char *key, int64_t *out);
int lrmoe_frame_attr_f64(const lrmoe_frame_t *f, const char *key, double *out);

/* ---------------------------------------------------------------- streams */

/* A stream is frames followed by a trailer (see lrmoe-stream(5)); zstd
 * compressed on write by default, auto-detected on read. */
typedef struct lrmoe_reader lrmoe_reader_t;
typedef struct lrmoe_writer lrmoe_writer_t;

/* path "-" or NULL is stdin. */
lrmoe_reader_t *lrmoe_reader_open(const char *path);
/* Does not own fp. Reads fp's descriptor directly (read(2): a live pipe's
 * frame is returned as soon as it is complete), so bytes already in fp's
 * stdio buffer are not seen: pass a FILE nothing has read from. */
lrmoe_reader_t *lrmoe_reader_fdopen(FILE *fp, const char *label);
/* Read the next frame into f (cleared first). 1: a frame; 0: clean end (the
 * trailer was read and its count matched); <0: error (truncated, malformed).
 * Errors name the stream and the frame index. */
int lrmoe_reader_next(lrmoe_reader_t *r, lrmoe_frame_t *f);
int64_t lrmoe_reader_index(const lrmoe_reader_t *r); /* frames read so far */
int lrmoe_reader_compressed(const lrmoe_reader_t *r);
/* 1 after the clean end of a plain safetensors file: one raw frame that
 * fills a regular file, with no trailer, read as a one-frame stream
 * (lrmoe-stream(5)); through a pipe that is an error. */
int lrmoe_reader_plain(const lrmoe_reader_t *r);
/* The digest record of the frame last returned: 0 none, LRMOE_DIGEST_CRC64
 * (one CRC-64 of the frame), LRMOE_DIGEST_XXH64 or
 * LRMOE_DIGEST_CRC64_TENSORS (by parts) (lrmoe-stream(5), Integrity). */
int lrmoe_reader_digest(const lrmoe_reader_t *r);
void lrmoe_reader_close(lrmoe_reader_t *r);

/* The default level: zstd level 1 on a regular file, raw (no compression) on
 * a pipe, socket, terminal or device (lrmoe(7), COMPRESSION). */
#define LRMOE_LEVEL_AUTO 1000
typedef struct {
    int compress;  /* 1 zstd (default), 0 raw */
    int level;     /* zstd level -7..22, default LRMOE_LEVEL_AUTO */
    int threads;   /* zstd worker threads, 0 = single-threaded */
} lrmoe_wopts_t;
void lrmoe_wopts_default(lrmoe_wopts_t *o);

/* path "-" or NULL is stdout. */
lrmoe_writer_t *lrmoe_writer_open(const char *path, const lrmoe_wopts_t *o);
/* Digest records (lrmoe-stream(5), Integrity): on by default, a 16-byte
 * record with the CRC-64/NVME of the frame's bytes before each frame, or,
 * for a frame of 64 MiB of data or more, a record of its header's and each
 * tensor's CRC-64 (which combine into the frame's; a mapped reader checks
 * only the parts it reads) (kind LRMOE_DIGEST_CRC64, or any nonzero kind
 * but the next three);
 * LRMOE_DIGEST_XXH64: records with the XXH64 instead, as earlier writers
 * wrote them;
 * LRMOE_DIGEST_CRC64_TENSORS: the record by parts before every frame;
 * LRMOE_DIGEST_CRC64_FRAME: the 16-byte CRC-64 record before every frame,
 * large ones too (what readers before the records by parts take).
 * 0, off (call before the first write): the format before the records,
 * which readers still take, e.g. to write a frame alone as a .safetensors
 * file. Readers verify every kind. */
enum { LRMOE_DIGEST_CRC64 = 1, LRMOE_DIGEST_XXH64 = 2, LRMOE_DIGEST_CRC64_TENSORS = 3,
       LRMOE_DIGEST_CRC64_FRAME = 4 };
void lrmoe_writer_set_digests(lrmoe_writer_t *w, int kind);
/* Writes the frame and flushes it (a zstd flush and fflush): it is
 * complete on the wire when the call returns. */
int lrmoe_writer_write(lrmoe_writer_t *w, const lrmoe_frame_t *f);
/* Write the trailer, flush and close (fclose checked). Frees w. */
int lrmoe_writer_close(lrmoe_writer_t *w);
/* Close without a trailer (the stream stays truncated on purpose). Frees w. */
void lrmoe_writer_abort(lrmoe_writer_t *w);
int64_t lrmoe_writer_count(const lrmoe_writer_t *w);

/* One frame as a standalone safetensors blob (no trailer, no compression).
 * Encode returns a malloc'd buffer; decode validates it fully. */
int lrmoe_frame_encode(const lrmoe_frame_t *f, uint8_t **buf, size_t *len);
int lrmoe_frame_decode(const uint8_t *buf, size_t len, lrmoe_frame_t *f);
/* The next of a sequence of safetensors blobs read from fp (what
 * safetensors.torch.save() returns, written back to back), validated like
 * decode: 1 with the frame in f, 0 at a clean end of input (no byte of a
 * next blob), -1 with the error set (a truncated blob, or input that is
 * not safetensors: an lrmoe stream, zstd data, an .npy array). */
int lrmoe_frame_fread(FILE *fp, lrmoe_frame_t *f);

/* Read a whole weights stream: per-layer frames, keyed by attribute "layer"
 * (frame index when absent). Returns the frame for layer L, or NULL. */
typedef struct {
    int n;
    int64_t *layer;
    lrmoe_frame_t *frames;
} lrmoe_weights_t;
int lrmoe_weights_load(const char *path, lrmoe_weights_t *w);
const lrmoe_frame_t *lrmoe_weights_layer(const lrmoe_weights_t *w, int64_t layer);
void lrmoe_weights_free(lrmoe_weights_t *w);

/* ---------------------------------------------------------------- utilities */

/* A callback over the frames of a stream (the importers, the tools' frame
 * loop): <0 stops with its error. */
typedef int (*lrmoe_frame_fn)(lrmoe_frame_t *f, int64_t index, void *ctx);

/* A byte size or rate (BYTES, lrmoe(7)): a number, optional spaces, an
 * optional unit in any case: K, M, G, T, P alone or with iB are powers of
 * 1024 (16g = 16G = 16GiB = 16 * 2^30); with B alone powers of 1000 (16GB =
 * 16gb = 16e9); B is bytes ("1.5G", "100e9", "512 MiB"). Must be >= 0 and
 * <= 1e18. 0 ok, -1 with error naming opt. */
int lrmoe_parse_bytes(const char *opt, const char *s, double *out);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif

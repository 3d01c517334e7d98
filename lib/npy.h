/* NumPy .npy files (format versions 1.0, 2.0 and 3.0) as library calls.
 *
 * Supported: plain numeric dtypes ('|b1', '|u1', '|i1', '<u2', '<i2', '<u4',
 * '<i4', '<u8', '<i8', '<f2', '<f4', '<f8'), C order. Big-endian arrays
 * ('>') are byte-swapped on read; Fortran order, structured, complex, string
 * and object arrays are refused. NumPy has no bfloat16: a BF16 tensor is
 * written as '<u2' (its raw bits) or, on request, converted to '<f4'.
 * Like the rest of liblrmoe these calls never print: they return <0 and set
 * lrmoe_errmsg().
 */
#ifndef LRMOE_NPY_H
#define LRMOE_NPY_H

#include <stddef.h>
#include <stdint.h>
#include "lrmoe.h"

#define LRMOE_NPY_MAX_HEADER (1u << 20) /* refuse .npy headers above 1 MiB */

typedef struct {
    int version;                     /* major format version: 1, 2 or 3 */
    lrmoe_dtype_t dtype;
    int ndim;                        /* 0 for a scalar */
    int64_t shape[LRMOE_MAX_DIMS];
    size_t data_offset;              /* bytes before the array data */
    size_t nbytes;                   /* numel * dtype size */
    int byteswap;                    /* data is big-endian */
} lrmoe_npy_info_t;

/* Parse the preamble and header at the start of buf (len bytes available).
 * Returns 0 when complete; 1 when more bytes are needed (info->data_offset
 * then holds how many); -1 with an error for a malformed header. */
int lrmoe_npy_parse(const uint8_t *buf, size_t len, lrmoe_npy_info_t *info);

/* Read the .npy file at path (or from fp, label naming it in errors) and add
 * it to f as tensor `name`. The file must hold exactly the data its header
 * announces. Returns 0, or -1 with "why" (the caller prefixes the path). */
int lrmoe_npy_load(const char *path, lrmoe_frame_t *f, const char *name);
int lrmoe_npy_fload(FILE *fp, lrmoe_frame_t *f, const char *name);

/* The .npy header NumPy itself writes for (dtype, shape): the version 1.0
 * preamble (2.0 when the header does not fit), the dict with the same spacing
 * and growth padding, aligned to 64 bytes. buf holds at least
 * LRMOE_NPY_HEADER_CAP bytes; *len receives the length. BF16 cannot be
 * described (-1). */
#define LRMOE_NPY_HEADER_CAP 512
int lrmoe_npy_header(lrmoe_dtype_t d, int ndim, const int64_t *shape,
                     char *buf, size_t *len);

/* Write tensor t as a .npy file. BF16 is written as '<u2' (raw bits), or
 * converted exactly to '<f4' when bf16_as_f32 is set. Returns 0 or -1. */
int lrmoe_npy_save(const char *path, const lrmoe_tensor_t *t, int bf16_as_f32);
int lrmoe_npy_fsave(FILE *fp, const lrmoe_tensor_t *t, int bf16_as_f32);

/* File names for a stream of .npy files (lrmoe-import(1), lrmoe-export(1)).
 * A base name (directory stripped, ending in ".npy") maps to a frame and a
 * tensor by the first rule that matches:
 *   fN.NAME.npy   frame N, tensor NAME   (what lrmoe-export writes)
 *   NAME.N.npy    frame N, tensor NAME   (per-step dumps: hidden.3.npy)
 *   NAME.npy      frame 0, tensor NAME
 * N is one or more decimal digits. Returns 0, or -1 for a name that is not
 * a .npy name or leaves an empty tensor name. */
int lrmoe_npy_name_parse(const char *base, int64_t *frame, char *name, size_t cap);
/* "f%03d.NAME.npy" for frame and tensor into buf; -1 when the tensor name
 * cannot be a file name (empty, ".", "..", or holds '/'). */
int lrmoe_npy_name_make(int64_t frame, const char *tensor, char *buf, size_t cap);

/* The frame sidecar fN.frame.json that lrmoe-export writes beside the .npy
 * files of frame N: what .npy cannot hold, so that lrmoe-import rebuilds the
 * frame exactly:
 *   {"attrs":{"layer":"0",...},"tensors":[{"name":"hidden","dtype":"BF16"},...]}
 * (attributes, tensor order, lrmoe dtypes). Write it for f; apply it to a
 * frame loaded from .npy files: set the attributes, put the listed tensors
 * first in the listed order, and restore each listed dtype (bits
 * reinterpreted when the element sizes match and the .npy dtype is an
 * integer, converted from F32 for BF16/F16 exported with --bf16-as f32).
 * Listed tensors that are absent are skipped. */
int lrmoe_npy_sidecar_write(const char *path, const lrmoe_frame_t *f);
int lrmoe_npy_sidecar_apply(const char *path, lrmoe_frame_t *f);
/* 1 when base is a sidecar name "fN.frame.json" (*frame gets N), else 0. */
int lrmoe_npy_sidecar_name(const char *base, int64_t *frame);

#endif

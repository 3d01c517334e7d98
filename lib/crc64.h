/* crc64: CRC-64/NVME (the 64-bit CRC of NVMe and of S3's checksums:
 * polynomial 0xAD93D23594C93659, reflected, initial value and final XOR
 * all ones; check value 0xAE8B14860A799888 for "123456789"), the frames'
 * digest records of lrmoe-stream(5) (Integrity). Internal to liblrmoe.
 *
 * One function over four paths, chosen once per process from what the CPU
 * and the OS support (CPUID through __builtin_cpu_supports): carry-less
 * multiply folding with VPCLMULQDQ on 512-bit registers (AVX-512F), on
 * 256-bit ones (AVX2), PCLMULQDQ on 128-bit ones, and a table (slice-by-8)
 * anywhere else, for short pieces and for the tail of every piece. The fold
 * constants (x^n mod P) are computed at first use, not written down.
 * LRMOE_NO_SIMD set (not "0") picks the table, as for the routers. */
#ifndef LRMOE_CRC64_H
#define LRMOE_CRC64_H

#include <stddef.h>
#include <stdint.h>

/* The CRC of crc's message followed by p[0..n): start with crc = 0; the
 * result after the last piece is the CRC (zlib's crc32() convention), so a
 * message may be fed in any pieces. */
uint64_t lrmoe_crc64_update(uint64_t crc, const void *p, size_t n);

/* The CRC of a message A followed by B from crc_a = lrmoe_crc64_update(0,
 * A, |A|), crc_b = lrmoe_crc64_update(0, B, len_b) and len_b: a message cut
 * into pieces hashed apart (on several threads) is hashed whole by
 * combining the pieces' CRCs in order. O(log len_b) multiplications. */
uint64_t lrmoe_crc64_combine(uint64_t crc_a, uint64_t crc_b, uint64_t len_b);

/* memcpy(dst, src, n) and lrmoe_crc64_update(crc, src, n) in one pass
 * where the path allows (AVX-512, AVX2: the bytes are stored as they are
 * loaded for the CRC, so the copy costs little beside it); the regions
 * must not overlap. */
uint64_t lrmoe_crc64_copy(uint64_t crc, void *dst, const void *src, size_t n);

/* The paths, slowest first; the name of the one in use. */
enum { LRMOE_CRC64_TABLE, LRMOE_CRC64_PCLMUL, LRMOE_CRC64_AVX2, LRMOE_CRC64_AVX512,
       LRMOE_CRC64_NPATHS };
const char *lrmoe_crc64_path_name(int path);
int lrmoe_crc64_path(void);
/* Whether this CPU (and OS) can run path. */
int lrmoe_crc64_path_ok(int path);
/* For tests and benchmarks: use path from now on (-1 with lrmoe_err when
 * this CPU cannot run it). Not for use while other threads hash. */
int lrmoe_crc64_path_set(int path);

#endif

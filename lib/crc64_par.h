/* crc64_par: the CRC-64/NVME of a buffer (crc64.h) on several threads: cut
 * into equal pieces, one per thread (par.h), each piece's CRC computed
 * apart and the CRCs combined in order (lrmoe_crc64_combine). The pass is
 * memory bound (about 12 GB/s on one core of this project's VMs, 20 on
 * two), so it pays on large buffers: the mapped weights' digest records
 * (weights_map.c) and the weights digest of an MPI job (exec_mpi.c).
 * Internal to liblrmoe. */
#ifndef LRMOE_CRC64_PAR_H
#define LRMOE_CRC64_PAR_H

#include <stddef.h>
#include <stdint.h>

/* The smallest piece worth a thread. */
#define LRMOE_CRC64_PIECE ((size_t)8 << 20)

/* lrmoe_crc64_update(crc, p, n), the same value, on up to `threads`
 * threads (<= 0: the CPUs this process may run on, lrmoe_parallel_cpus;
 * at most 64), each hashing a piece of at least `piece` bytes (fewer
 * threads where n is short; one pass here where a single piece). */
uint64_t lrmoe_crc64_par(uint64_t crc, const void *p, size_t n, int threads, size_t piece);

#endif

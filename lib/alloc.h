/* Page policy of lrmoe_alloc_big's buffers (lib/frame.c; lrmoe.h declares
 * lrmoe_alloc_big). Internal to liblrmoe. */
#ifndef LRMOE_ALLOC_H
#define LRMOE_ALLOC_H
#include <stddef.h>

/* 1 when lrmoe_alloc_big advises its buffers (4 MiB and more) as transparent
 * huge pages, 0 when it keeps them on 4 KiB pages (MADV_NOHUGEPAGE).
 * Decided once per process: the environment variable LRMOE_THP=1 or 0 when
 * set; else 0 where the kernel's THP is "never" or where a virtio balloon
 * reports free memory to the hypervisor (free page reporting: the host
 * discards reported 2 MiB blocks, and every huge page taken from one then
 * faults in the host 4 KiB at a time, 3 to 5 times the cost of 4 KiB pages
 * on the VM measured), else 1. why (may be NULL) gets a static phrase
 * naming the reason. */
int lrmoe_alloc_thp(const char **why);

/* Fault [p, p+n) in for writing with one call (MADV_POPULATE_WRITE) when
 * the first whole page of it has never been touched (mincore: not
 * resident): batch faulting skips one exception per page. Leaves contents
 * and already resident ranges alone; no effect where the kernel lacks it.
 * Returns 1 when it populated, else 0. */
int lrmoe_alloc_prefault(void *p, size_t n);

/* A buffer of n bytes for an output that its producer overwrites whole
 * (the CPU backend's outputs, lib/exec_frame.c): lrmoe_alloc_big's, or,
 * where the environment variable LRMOE_POOL names a directory and n is
 * 4 MiB or more, a shared mapping of a file there, lrmoe-pool-UID-I (I < 32),
 * locked with flock for as long as this process uses it: first a file of
 * exactly this size (rounded to pages) that no process holds, else a free
 * one resized. The file and its pages outlive the process, so the next
 * process that asks for that size maps resident pages (MAP_POPULATE: no
 * fault, no zeroing: a one-frame process' outputs then cost what a warm
 * frame's do) instead of faulting fresh ones. The contents are whatever the
 * last user left. Falls back to lrmoe_alloc_big when no file can be had.
 * Freed by lrmoe_pool_free (tensor_free calls it). */
void *lrmoe_alloc_out(size_t n);
/* 1 when p is a pool buffer of lrmoe_alloc_out, now unmapped and its file
 * unlocked; 0 otherwise (p is the caller's to free). */
int lrmoe_pool_free(void *p);

#endif

/* mock-cuda: the CUDA runtime, cuBLAS and NCCL entry points that
 * kernels/kcu.cu, gemm.cu and comm_nccl.cu call, as a host-only recorder,
 * so their host logic (stream forks and joins, staging, pool settings,
 * context teardown) runs and is checked without a GPU (tests/cuda-mock.bats,
 * driven by tests/gpu/mock-run.c). Linked in place of libcudart, libcublas
 * and libnccl; nothing runs on a device: "device memory" is malloc'd host
 * memory, copies and memsets happen at once, kernels are only recorded.
 *
 * Every call of interest appends one line to the file $MOCK_CUDA_LOG
 * (streams, events and handles are named s1.., e1.., h1.., pools pool<dev>):
 *   stream_create s2 dev0 | stream_sync s2 | stream_destroy s2
 *   event_create e3 | event_record e3 s2 | event_sync e3 | wait_event s1 e3
 *   host_alloc p1 | host_free p1 | memcpy H2D|D2H pinned|pageable s2
 *   device_sync dev0
 * Host synchronisations (tests/cuda-mock.bats counts them): stream_sync,
 * event_sync, device_sync, and every copy from or to pageable memory.
 *   pool_attr pool0 attr=4 value=N | pool_access pool0 dev=1 type=1 flags=3
 *   pool_trim pool0 0 | blas_create h1 | blas_stream h1 s2 | blas_destroy h1
 *   gemm h1 s2 [FAIL] | gemm_grouped h1 s2 n=4 [FAIL] | launch block=256 s2
 * Failures on demand: MOCK_GEMM_FAIL=N fails the Nth cublasGemmEx,
 * MOCK_GROUPED_FAIL=1 every grouped call; MOCK_NDEV devices (default 2);
 * MOCK_NOPEER=a:b makes cudaDeviceCanAccessPeer(a, b) say no.
 * Not part of liblrmoe.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned x, y, z; } mdim3;

static FILE *logf_;
static int cur_dev, nstream, nevent, nblas, nhost, ngemm;

static void mlog(const char *fmt, ...)
{
    if (!logf_) {
        const char *p = getenv("MOCK_CUDA_LOG");
        logf_ = fopen(p ? p : "/dev/null", "a");
        if (!logf_) return;
        setvbuf(logf_, NULL, _IOLBF, 0);
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(logf_, fmt, ap);
    va_end(ap);
    fputc('\n', logf_);
}

/* the driver marks phases in the log */
void mock_mark(const char *what) { mlog("mark %s", what); }

/* handles are small integers disguised as pointers */
static void *mk(int id, int kind) { return (void *)(uintptr_t)((unsigned)id << 4 | (unsigned)kind); }
static int id_of(const void *p) { return (int)((uintptr_t)p >> 4); }

/* pinned blocks: [base, base+len) */
#define MAXHOST 256
static struct { char *p; size_t n; int id; } host[MAXHOST];

static int pinned(const void *src)
{
    for (int i = 0; i < MAXHOST; i++)
        if (host[i].p && (const char *)src >= host[i].p && (const char *)src < host[i].p + host[i].n)
            return host[i].id;
    return 0;
}

/* events: record order, stream, and whether a host wait covered them */
#define MAXEV 65536
static int ev_done[MAXEV], ev_strm[MAXEV];
static long ev_seq[MAXEV], seqn;

/* ---------------------------------------------------------------- runtime */

int cudaGetDeviceCount(int *n)
{
    const char *e = getenv("MOCK_NDEV");
    *n = e ? atoi(e) : 2;
    return 0;
}
int cudaSetDevice(int d) { cur_dev = d; return 0; }
int cudaGetDevice(int *d) { *d = cur_dev; return 0; }
int cudaGetLastError(void) { return 0; }
int cudaPeekAtLastError(void) { return 0; }
const char *cudaGetErrorString(int e) { return e ? "mock error" : "no error"; }
/* an H100's values where CUB asks (cudaDeviceAttr codes), 90 otherwise */
int cudaDeviceGetAttribute(int *v, int attr, int dev)
{
    (void)dev;
    switch (attr) {
    case 1: *v = 1024; break;            /* max threads per block */
    case 8: *v = 49152; break;           /* shared memory per block */
    case 10: *v = 32; break;             /* warp size */
    case 12: *v = 65536; break;          /* registers per block */
    case 16: *v = 132; break;            /* multiprocessors */
    case 75: case 76: {                  /* compute capability 9.0, MOCK_CC=major.minor another */
        const char *cc = getenv("MOCK_CC");
        int major = cc ? atoi(cc) : 9, minor = cc && strchr(cc, '.') ? atoi(strchr(cc, '.') + 1) : 0;
        *v = attr == 75 ? major : minor;
        break;
    }
    case 81: *v = 233472; break;         /* shared memory per multiprocessor */
    case 97: *v = 232448; break;         /* opt-in shared memory per block */
    default: *v = 90;
    }
    return 0;
}
/* cudaFuncAttributes: three size_t, then maxThreadsPerBlock, numRegs,
 * ptxVersion, binaryVersion, ... (CUB reads the PTX version) */
int cudaFuncGetAttributes(void *a, const void *f)
{
    (void)f;
    memset(a, 0, 3 * sizeof(size_t) + 16 * sizeof(int));
    int *i = (int *)((char *)a + 3 * sizeof(size_t));
    i[0] = 1024; i[1] = 32; i[2] = 90; i[3] = 90;
    return 0;
}
int cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, const void *f, int b, size_t s,
                                                            unsigned fl)
{
    (void)f; (void)b; (void)s; (void)fl;
    *n = 1;
    return 0;
}

int cudaStreamCreateWithFlags(void **s, unsigned f)
{
    (void)f;
    *s = mk(++nstream, 1);
    mlog("stream_create s%d dev%d", nstream, cur_dev);
    return 0;
}
int cudaStreamDestroy(void *s) { mlog("stream_destroy s%d", id_of(s)); return 0; }
int cudaStreamSynchronize(void *s)
{
    for (int i = 0; i < MAXEV; i++) if (ev_seq[i] && ev_strm[i] == id_of(s)) ev_done[i] = 1;
    mlog("stream_sync s%d", id_of(s));
    return 0;
}
/* MOCK_CAPTURING=1: every stream is being captured into a graph */
int cudaStreamIsCapturing(void *s, int *st)
{
    (void)s;
    *st = getenv("MOCK_CAPTURING") ? 1 : 0;
    return 0;
}
int cudaStreamWaitEvent(void *s, void *e, unsigned f)
{
    (void)f;
    mlog("wait_event s%d e%d", id_of(s), id_of(e));
    return 0;
}
int cudaEventCreateWithFlags(void **e, unsigned f)
{
    (void)f;
    *e = mk(++nevent, 2);
    mlog("event_create e%d", nevent);
    return 0;
}
int cudaEventDestroy(void *e) { mlog("event_destroy e%d", id_of(e)); return 0; }
/* cudaEventQuery's answer: an event is complete once a host wait covered
 * it: a stream_sync of its stream, or an event_sync of it or of an event
 * recorded after it (the executor joins every rank's stream before its
 * one wait), or a device_sync. */
int cudaEventRecord(void *e, void *s)
{
    int i = id_of(e) % MAXEV;
    ev_done[i] = 0; ev_strm[i] = id_of(s); ev_seq[i] = ++seqn;
    mlog("event_record e%d s%d", id_of(e), id_of(s));
    return 0;
}
int cudaEventSynchronize(void *e)
{
    long q = ev_seq[id_of(e) % MAXEV];
    for (int i = 0; i < MAXEV; i++) if (ev_seq[i] && ev_seq[i] <= q) ev_done[i] = 1;
    mlog("event_sync e%d", id_of(e));
    return 0;
}
int cudaEventQuery(void *e)
{
    int i = id_of(e) % MAXEV;
    int done = !ev_seq[i] || ev_done[i];
    mlog("event_query e%d %s", id_of(e), done ? "done" : "not_ready");
    return done ? 0 : 600; /* cudaErrorNotReady */
}
int cudaEventElapsedTime(float *ms, void *a, void *b) { (void)a; (void)b; *ms = 0.0f; return 0; }
int cudaDeviceSynchronize(void)
{
    for (int i = 0; i < MAXEV; i++) ev_done[i] = 1;
    mlog("device_sync dev%d", cur_dev);
    return 0;
}

int cudaMallocAsync(void **p, size_t n, void *s)
{
    (void)s;
    *p = malloc(n ? n : 1);
    return *p ? 0 : 2;
}
int cudaFreeAsync(void *p, void *s) { (void)s; free(p); return 0; }
int cudaMallocHost(void **p, size_t n)
{
    for (int i = 0; i < MAXHOST; i++)
        if (!host[i].p) {
            host[i].p = malloc(n ? n : 1);
            host[i].n = n;
            host[i].id = ++nhost;
            *p = host[i].p;
            mlog("host_alloc p%d %zu", nhost, n);
            return 0;
        }
    return 2;
}
int cudaFreeHost(void *p)
{
    for (int i = 0; i < MAXHOST; i++)
        if (host[i].p == p) {
            mlog("host_free p%d", host[i].id);
            free(host[i].p);
            host[i].p = NULL;
            return 0;
        }
    mlog("host_free unknown");
    return 1;
}
int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *s)
{
    if (kind == 1) mlog("memcpy H2D %s s%d", pinned(src) ? "pinned" : "pageable", id_of(s));
    if (kind == 2) mlog("memcpy D2H %s s%d", pinned(dst) ? "pinned" : "pageable", id_of(s));
    memcpy(dst, src, n);
    return 0;
}
int cudaMemsetAsync(void *p, int v, size_t n, void *s) { (void)s; memset(p, v, n); return 0; }
int cudaMemset2DAsync(void *p, size_t pitch, int v, size_t w, size_t h, void *s)
{
    (void)s;
    for (size_t r = 0; r < h; r++) memset((char *)p + r * pitch, v, w);
    return 0;
}

int cudaDeviceGetPCIBusId(char *buf, int len, int dev) { snprintf(buf, (size_t)len, "mock:%d", dev); return 0; }
int cudaDeviceCanAccessPeer(int *can, int dev, int peer)
{
    const char *e = getenv("MOCK_NOPEER");
    int a, b;
    *can = 1;
    if (e && sscanf(e, "%d:%d", &a, &b) == 2 && a == dev && b == peer) *can = 0;
    return 0;
}
int cudaDeviceGetDefaultMemPool(void **pool, int dev) { *pool = mk(dev, 3); return 0; }
int cudaMemPoolSetAttribute(void *pool, int attr, void *v)
{
    mlog("pool_attr pool%d attr=%d value=%llu", id_of(pool), attr,
         (unsigned long long)*(uint64_t *)v);
    return 0;
}
struct mock_access { struct { int type, id; } location; int flags; };
int cudaMemPoolSetAccess(void *pool, const struct mock_access *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        mlog("pool_access pool%d dev=%d type=%d flags=%d", id_of(pool), d[i].location.id,
             d[i].location.type, d[i].flags);
    return 0;
}
int cudaMemPoolTrimTo(void *pool, size_t keep) { mlog("pool_trim pool%d %zu", id_of(pool), keep); return 0; }

/* kernel launches (nvcc's stubs) */
static mdim3 cfg_grid, cfg_block;
static size_t cfg_shm;
static void *cfg_stream;
void **__cudaRegisterFatBinary(void *fb) { static void *h; (void)fb; return &h; }
void __cudaRegisterFatBinaryEnd(void **h) { (void)h; }
void __cudaUnregisterFatBinary(void **h) { (void)h; }
void __cudaRegisterFunction(void) {}
void __cudaRegisterVar(void) {}
unsigned __cudaPushCallConfiguration(mdim3 g, mdim3 b, size_t shm, void *s)
{
    cfg_grid = g; cfg_block = b; cfg_shm = shm; cfg_stream = s;
    return 0;
}
int __cudaPopCallConfiguration(mdim3 *g, mdim3 *b, size_t *shm, void **s)
{
    *g = cfg_grid; *b = cfg_block; *shm = cfg_shm; *s = cfg_stream;
    return 0;
}
int __cudaGetKernel(void **k, const void *f) { *k = (void *)f; return 0; }
int __cudaLaunchKernel(void *k, mdim3 g, mdim3 b, void **args, size_t shm, void *s)
{
    (void)k; (void)args;
    mlog("launch grid=%u,%u block=%u shm=%zu s%d", g.x, g.y, b.x, shm, id_of(s));
    return 0;
}

/* CUTLASS's host code (the grouped GEMM objects of kernels/cutlass): the
 * dynamic shared memory opt-in, and driver entry points it looks up at run
 * time (cuTensorMapEncodeTiled, ...), each logged and answered by a function
 * that logs its call and succeeds */
int cudaFuncSetAttribute(const void *f, int attr, int v)
{
    (void)f;
    mlog("func_attr %d %d", attr, v);
    return 0;
}
static int driver_call(void) { mlog("driver_call"); return 0; }
int cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned ver, unsigned long long fl,
                                     int *st)
{
    (void)ver; (void)fl;
    mlog("driver_entry %s", sym);
    *fn = (void *)driver_call;
    if (st) *st = 0;
    return 0;
}
int cudaGetDriverEntryPoint(const char *sym, void **fn, unsigned long long fl, int *st)
{
    return cudaGetDriverEntryPointByVersion(sym, fn, 0, fl, st);
}

/* ---------------------------------------------------------------- cuBLAS */

static void *blas_stream[256];
int cublasCreate_v2(void **h)
{
    *h = mk(++nblas, 4);
    mlog("blas_create h%d", nblas);
    return 0;
}
int cublasDestroy_v2(void *h) { mlog("blas_destroy h%d", id_of(h)); return 0; }
int cublasSetStream_v2(void *h, void *s)
{
    blas_stream[id_of(h) & 255] = s;
    mlog("blas_stream h%d s%d", id_of(h), id_of(s));
    return 0;
}
int cublasSetMathMode(void *h, int m) { (void)h; (void)m; return 0; }
const char *cublasGetStatusString(int s) { return s ? "mock status" : "success"; }
int cublasGemmEx(void *h)
{
    const char *f = getenv("MOCK_GEMM_FAIL");
    int fail = f && ++ngemm == atoi(f);
    mlog("gemm h%d s%d%s", id_of(h), id_of(blas_stream[id_of(h) & 255]), fail ? " FAIL" : "");
    return fail ? 13 : 0;
}
/* cublasGemmGroupedBatchedEx(handle, ..., group_count (arg 19), ...) */
int cublasGemmGroupedBatchedEx(void *h, const void *ta, const void *tb, const int *m, const int *n,
                               const int *k, const float *al, const void *const *A, int at,
                               const int *lda, const void *const *B, int bt, const int *ldb,
                               const float *be, void *const *C, int ct, const int *ldc, int groups)
{
    (void)ta; (void)tb; (void)m; (void)n; (void)k; (void)al; (void)A; (void)at; (void)lda;
    (void)B; (void)bt; (void)ldb; (void)be; (void)C; (void)ct; (void)ldc;
    int fail = getenv("MOCK_GROUPED_FAIL") != NULL;
    mlog("gemm_grouped h%d s%d n=%d%s", id_of(h), id_of(blas_stream[id_of(h) & 255]), groups,
         fail ? " FAIL" : "");
    return fail ? 13 : 0;
}

/* ---------------------------------------------------------------- NCCL */

const char *ncclGetErrorString(int r) { return r ? "mock nccl error" : "no error"; }
int ncclCommInitAll(void **comm, int n, const int *dev)
{
    for (int i = 0; i < n; i++) comm[i] = mk(dev[i] + 1, 5);
    mlog("nccl_init n=%d", n);
    return 0;
}
int ncclCommDestroy(void *c) { (void)c; return 0; }
int ncclGetUniqueId(void *id) { memset(id, 0, 128); return 0; }
int ncclCommInitRank(void **comm, int n, const void *id, int rank)
{
    (void)id;
    *comm = mk(rank + 1, 5);
    mlog("nccl_init_rank n=%d rank=%d", n, rank);
    return 0;
}
int ncclGroupStart(void) { return 0; }
int ncclGroupEnd(void) { return 0; }
int ncclSend(void) { return 0; }
int ncclRecv(void) { return 0; }

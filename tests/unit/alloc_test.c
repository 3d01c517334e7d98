/* lrmoe_alloc_big's page policy and lrmoe_alloc_prefault (lib/frame.c,
 * lib/alloc.h). Usage: alloc_test 0|1|auto
 *   0, 1: run with LRMOE_THP set to it: a buffer of 4 MiB or more is 2 MiB
 *   aligned and its mapping carries the advice (/proc/self/smaps VmFlags:
 *   hg for huge pages, nh for 4 KiB ones); with 1, where THP is not "never",
 *   filling it gives the mapping AnonHugePages; with 0 none.
 *   auto: prints the process' choice and its reason.
 * Then lrmoe_alloc_prefault: a fresh 4 KiB-page buffer is populated by one
 * call (the page faults it takes count in the call; writing the buffer
 * afterwards takes almost none; a fresh mmap), contents of a resident buffer are left
 * alone and a second call does nothing. Prints "alloc: ok" when all hold. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include "alloc.h"
#include "lrmoe.h"

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

/* the smaps entry of the mapping that holds p: its VmFlags line and its
 * AnonHugePages (kB); 0 when not found */
static int smaps_of(const void *p, char *flags, size_t fl, long *ahp)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 0;
    char line[240];
    int in = 0, found = 0;
    *ahp = -1;
    flags[0] = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char c;
        if (sscanf(line, "%lx-%lx %c", &lo, &hi, &c) == 3 && strchr(line, ' ') &&
            line[strcspn(line, " ")] == ' ' && strchr("r-", c)) {
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            if (in) found = 1;
            continue;
        }
        if (!in) continue;
        if (!strncmp(line, "AnonHugePages:", 14)) *ahp = atol(line + 14);
        if (!strncmp(line, "VmFlags:", 8)) snprintf(flags, fl, "%s", line + 8);
    }
    fclose(f);
    return found;
}

static long minflt(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

static int thp_never(void)
{
    char buf[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return 1;
    if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
    fclose(f);
    return strstr(buf, "[never]") != NULL || !buf[0];
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "auto";
    if (strcmp(mode, "auto")) setenv("LRMOE_THP", mode, 1);
    const char *why;
    int thp = lrmoe_alloc_thp(&why);
    printf("alloc: huge pages %s (%s)\n", thp ? "yes" : "no", why);
    if (strcmp(mode, "auto")) CHECK(thp == atoi(mode), "LRMOE_THP=%s gave %d", mode, thp);

    const size_t n = (size_t)16 << 20;
    char *p = lrmoe_alloc_big(n);
    CHECK(p && (uintptr_t)p % ((size_t)2 << 20) == 0, "16 MiB buffer %p not 2 MiB aligned", (void *)p);
    if (!p) return 1;
    memset(p, 1, n);
    char fl[256];
    long ahp = -1;
    CHECK(smaps_of(p, fl, sizeof fl, &ahp), "no smaps entry for %p", (void *)p);
    const int hg = strstr(fl, " hg") != NULL, nh = strstr(fl, " nh") != NULL;
    printf("alloc: VmFlags%s", fl);
    printf("alloc: AnonHugePages %ld kB of 16 MiB\n", ahp);
    if (thp) {
        CHECK(hg && !nh, "huge pages chosen, but the mapping is not advised MADV_HUGEPAGE");
        if (thp_never()) printf("alloc: THP is never here: AnonHugePages not checked\n");
        else CHECK(ahp > 0, "MADV_HUGEPAGE, THP not never, yet no AnonHugePages after the fill");
    } else {
        CHECK(nh && !hg, "4 KiB pages chosen, but the mapping is not advised MADV_NOHUGEPAGE");
        CHECK(ahp <= 0, "4 KiB pages chosen, yet %ld kB AnonHugePages", ahp);
    }
    free(p);

    /* prefault: on 4 KiB pages, so that the fault counts are per page */
    setenv("LRMOE_THP", "0", 1);
    const size_t m = (size_t)8 << 20, pages = m / 4096;
    /* a fresh anonymous mapping (malloc may hand out touched heap) */
    char *q = mmap(NULL, m, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED) return 1;
    madvise(q, m, MADV_NOHUGEPAGE);
    long f0 = minflt();
    int did = lrmoe_alloc_prefault(q, m);
    long f1 = minflt();
    memset(q, 7, m);
    long f2 = minflt();
    printf("alloc: prefault %d: %ld faults in the call, %ld in the writes after it (%zu pages)\n",
           did, f1 - f0, f2 - f1, pages);
    CHECK(did == 1, "lrmoe_alloc_prefault did not populate a fresh buffer");
    CHECK(f2 - f1 < (long)pages / 16, "writing a prefaulted buffer took %ld page faults", f2 - f1);
    CHECK(lrmoe_alloc_prefault(q, m) == 0, "lrmoe_alloc_prefault populated a resident buffer");
    size_t bad = 0;
    for (size_t i = 0; i < m; i++) bad += q[i] != 7;
    CHECK(!bad, "%zu bytes changed by lrmoe_alloc_prefault", bad);
    CHECK(lrmoe_alloc_prefault(q + 1, 100) == 0, "less than a page: nothing to do");
    munmap(q, m);
    if (fails) { printf("alloc: %d failed\n", fails); return 1; }
    printf("alloc: ok\n");
    return 0;
}

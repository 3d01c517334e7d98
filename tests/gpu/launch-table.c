/* launch-table: print kernels/kcu_launch.h's launch table, one kernel a line:
 *   NAME THREADS DYNAMIC_SHARED_BYTES LOCAL_BUDGET_BYTES
 * for tests/gpu/check-resources.sh (plain C, no CUDA needed). */
#include <stdio.h>
#include "kcu_launch.h"

#define ROW(k, threads, dsmem, local) \
    printf("%s %ld %ld %ld\n", #k, (long)(threads), (long)(dsmem), (long)(local));

int main(void)
{
    KCU_LAUNCH_TABLE(ROW)
    return ferror(stdout) ? 1 : 0;
}

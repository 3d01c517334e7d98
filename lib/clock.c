/* The monotonic clock every stage times itself with (lrmoe_now): the
 * bottom layer, like error.c (lrmoe(7), THE LIBRARY). */
#include <time.h>
#include "lrmoe.h"
#include "clock.h"

double lrmoe_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

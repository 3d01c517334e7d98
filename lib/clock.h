/* The library's clock (lib/clock.c): not installed; the stages time
 * themselves with it, the tools print its readings. */
#ifndef LRMOE_CLOCK_H
#define LRMOE_CLOCK_H

#ifdef __cplusplus
extern "C" {
#endif

double lrmoe_now(void); /* monotonic seconds */

#ifdef __cplusplus
}
#endif

#endif

/* common/ internals exposed for its unit tests only. */
#ifndef MPS_COMMON_CM_INTERNAL_H
#define MPS_COMMON_CM_INTERNAL_H

#include "common/cm.h"

/* When a pending timer is due (cm_now_us() clock). */
uint64_t cm_timer_deadline_us(const cm_timer_t *t);
/* How many timers are pending (made, neither fired nor cancelled). */
size_t cm_loop_pending_timers(const cm_loop_t *loop);

#endif

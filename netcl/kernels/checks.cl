/* Device-side input checks: a kernel that meets input it cannot honour (a label outside [0, C), an
 * embedding id outside [0, V)) records it in its queue's check record, which the host raises at the
 * next read on that queue (netcl.core.backend.Queue.check_buffer). Included by the kernel files that
 * check (#include "checks.cl").
 * Record (int32): [code, value low 32 bits, value high 32 bits, row, limit, 0, 0, 0]; the first
 * failing work-item wins the atomic compare-and-swap on the code and writes the rest. */
#ifndef NETCL_CHECKS_CL
#define NETCL_CHECKS_CL
inline void report_check(__global int* err, int code, long value, long row, long limit) {
    if (atomic_cmpxchg(err, 0, code) == 0) {
        err[1] = (int)(value & 0xffffffffL);
        err[2] = (int)(value >> 32);
        err[3] = (int)row;
        err[4] = (int)limit;
    }
}
#endif

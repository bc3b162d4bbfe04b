#!/usr/bin/env python3
"""Run a benchmark command only on a quiet machine, and keep its output only
if the machine stayed quiet (BENCHMARKS.md, "Method").

usage: quiet_run.py OUTFILE -- COMMAND [ARGS...]

Waits until the CPUs were less than 10 % busy over 5 s, runs COMMAND, and
measures how much CPU time *other* processes used meanwhile (all busy time
minus the command's own user+system time). If others used 5 % or more of the
machine's cores, the run is discarded and retried (at most 8 attempts; the
last one is kept whatever happened). OUTFILE gets one "# attempt" line with
those figures, then the command's stdout and stderr. Linux only (/proc/stat).
"""
import os
import resource
import subprocess
import sys
import time


def busy_and_total():
    """Jiffies busy (all but idle, iowait, steal) and total, over all CPUs."""
    fields = list(map(int, open('/proc/stat').readline().split()[1:]))
    idle = fields[3] + fields[4]
    total = sum(fields)
    return total - idle - fields[7], total


def steal():
    return int(open('/proc/stat').readline().split()[8])


def main():
    if len(sys.argv) < 4 or sys.argv[2] != '--':
        sys.exit(__doc__)
    out, cmd = sys.argv[1], sys.argv[3:]
    hz = os.sysconf('SC_CLK_TCK')
    cores = os.cpu_count() or 1
    for attempt in range(8):
        while True:  # quiet: < 10 % busy over 5 s
            b0, t0 = busy_and_total()
            time.sleep(5)
            b1, t1 = busy_and_total()
            if (b1 - b0) / max(1, t1 - t0) < 0.10:
                break
        load = open('/proc/loadavg').read().strip()
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        b0, _ = busy_and_total()
        s0, w0 = steal(), time.time()
        p = subprocess.run(cmd, capture_output=True, text=True)
        b1, _ = busy_and_total()
        s1, w1 = steal(), time.time()
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        ours = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        others = max(0.0, (b1 - b0) / hz - ours)
        share = others / (cores * max(1e-9, w1 - w0))
        msg = (f"# attempt {attempt}: loadavg at start {load}; wall {w1 - w0:.1f} s; our CPU {ours:.1f} s; "
               f"others' CPU {others:.1f} s ({100 * share:.1f}% of {cores} cores); steal {(s1 - s0) / hz:.1f} s")
        print(msg, file=sys.stderr)
        # Under a second the jiffy counters cannot tell: keep it.
        if share < 0.05 or attempt == 7 or w1 - w0 < 1.0:
            with open(out, 'w') as f:
                f.write(msg + "\n" + p.stdout + p.stderr)
            sys.exit(p.returncode)


if __name__ == '__main__':
    main()

"""Every Python process started with this folder on PYTHONPATH prints the stacks of all its
threads to stderr every VIME_STACK_DUMP_S seconds (a forked child too): how
benchmarks/gpu/h200_live.sh's `mp` step looks at where vLLM's engine core in its own process
waits on a machine without py-spy or gdb. A daemon thread of its own, not
faulthandler.dump_traceback_later: re-arming that in a forked child waits forever for the
parent's watchdog thread, which the child does not have."""

import faulthandler
import os
import sys
import threading
import time

_every = float(os.environ.get("VIME_STACK_DUMP_S", "0") or 0)


def _dump_forever() -> None:
    while True:
        time.sleep(_every)
        print(f"stackdump: pid {os.getpid()} at {time.strftime('%H:%M:%S')}", file=sys.stderr,
              flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def _arm() -> None:
    print(f"stackdump: pid {os.getpid()} ({' '.join(sys.argv)[:120]}) dumps every {_every:g} s",
          file=sys.stderr, flush=True)
    threading.Thread(target=_dump_forever, name="vime-stackdump", daemon=True).start()


if _every > 0:
    _arm()
    os.register_at_fork(after_in_child=_arm)

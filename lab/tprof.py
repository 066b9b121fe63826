"""Timing probe of `python -m fxray.tune` (lab use): prints '@@ <step> <s since T0>' for the driver's
steps, and a cProfile of finish() (TPROF_FINISH=1). Usage: python lab/tprof.py T0 <fxray tune args>"""
import atexit
import cProfile
import io
import os
import pstats
import sys
import time

T0 = float(sys.argv.pop(1))


def mark(what):
    print(f"@@ {what} {time.time() - T0:.2f}", file=sys.stderr, flush=True)


mark("python up")
import fxray.tune as tune  # noqa: E402

mark("imports")
from fxray.sweep import driver  # noqa: E402
from fxray.track import results, writer  # noqa: E402

for mod, name in [(driver, "validate"), (driver, "start"), (driver, "fit"), (results, "write_results"),
                  (writer.Writer, "finish"), (driver.Workers, "stop")]:
    f = getattr(mod, name)

    def w(*a, __f=f, __n=name, **k):
        mark(f"{__n} begin")
        r = __f(*a, **k)
        mark(f"{__n} end")
        return r

    setattr(mod, name, w)

_finish = driver.finish


def finish(run):
    mark("finish begin")
    prof = cProfile.Profile() if os.environ.get("TPROF_FINISH") == "1" else None
    if prof:
        prof.enable()
    r = _finish(run)
    if prof:
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(int(os.environ.get('TPROF_TOP', 35)))
        print(s.getvalue(), file=sys.stderr)
    mark("finish end")
    return r


driver.finish = finish
atexit.register(lambda: mark("atexit"))
code = tune.main()
mark("main returned")
try:
    from fxray.cli import leave  # a tree that has it ends there, as `python -m fxray.tune` does
except ImportError:
    sys.exit(code)
sys.exit(leave(code))

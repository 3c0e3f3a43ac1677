"Before/after timing rows shared by the bench scripts: one function per script, one row per pair."
import time


def wall(f):
    "f() and its wall-clock seconds."
    t0 = time.perf_counter(); out = f(); return out, time.perf_counter() - t0


def cpu(f):
    "f() and its CPU seconds (all threads of this process)."
    t0 = time.process_time(); out = f(); return out, time.process_time() - t0


def pair_recorder(rows: list, timer, unit: str = 's', width: int = 58, digits: int = 5):
    "pair(what, before, after, diff): time both, append a row to `rows`, print one line."
    def pair(what, before, after, diff):
        (a, tb), (b, ta) = timer(before), timer(after)
        rows.append({'what': what, f'before_{unit}': round(tb, 2), f'after_{unit}': round(ta, 2),
                     'speedup': round(tb / ta, 1), 'max_abs_diff': float(diff(a, b))})
        print(f"{what:{width}s} {tb:7.2f} s -> {ta:6.2f} s  (x{tb / ta:{digits}.1f}), max |diff| "
              f"{rows[-1]['max_abs_diff']:.2e}", flush=True)
    return pair

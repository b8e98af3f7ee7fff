"""Python's cyclic garbage collector, tuned for the packet path: in the analyze process (cli.py) and in the
reader process it starts (sources/reader_process.py).

The packet path allocates a few objects a packet, nearly all freed by reference counting, and Python's default
(a young collection every 700 allocations) spent ~6% of analyze's CPU on a 1M-packet pair looking for cycles
that are not there (bench/RESULTS.md). In the reader process, which allocates a few tuples a record, the default
cost ~4% of its CPU and ~6% of analyze's wall on bench/gen's short mix.
"""

from __future__ import annotations

import gc

# gc.set_threshold: allocations a young collection, young collections a middle one, middle ones a full one.
GC_THRESHOLDS = (50_000, 20, 50)


def tune_gc() -> None:
    """What is loaded by now (modules, detectors) is moved out of the collector's sight for good (gc.freeze),
    and collections come less often (GC_THRESHOLDS)."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)

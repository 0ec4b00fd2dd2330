"""`gemsops bench --host` against any gemsops tree: the cases and timing of this tree's
gemsops/bench_host.py, run over the gemsops found on PYTHONPATH (an older commit's tree,
for a before/after pair in one GPU call).

    PYTHONPATH=OLD_TREE python3 .ci/host_compare.py [CALLS]
"""

import importlib.util
import sys
from pathlib import Path

here = Path(__file__).resolve().parent.parent / "gemsops" / "bench_host.py"
spec = importlib.util.spec_from_file_location("bench_host_of_this_tree", here)
assert spec is not None and spec.loader is not None
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
calls = int(sys.argv[1]) if len(sys.argv) > 1 else 500
module.report(module.measure_host(calls=calls))

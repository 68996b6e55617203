"""The hidden tests of fix-calc: `add` fixed, `mul` unchanged."""

import sys

sys.path.insert(0, "/app")
from calc import add, mul  # noqa: E402

cases = [(add(2, 3), 5), (add(-1, 1), 0), (add(10, 20), 30), (mul(3, 4), 12)]
failed = [(got, want) for got, want in cases if got != want]
print(f"{len(cases) - len(failed)}/{len(cases)} checks passed", failed or "")
sys.exit(1 if failed else 0)

# The suite's pytest arguments, shared by scripts/test and scripts/test_installed; sourced.
#
# The suite runs in parallel (pytest-xdist): most of its time is spent waiting on server processes,
# sandboxes, sockets and databases, not on the CPU, so twice as many workers as cores (at most 8)
# finish it about four times sooner on two cores. Every test has its own temp dirs, database,
# ports and sandbox ids, so tests do not share state. `worksteal` hands a free worker the queued
# tests of a busy one, as the longest tests take a minute. ASHD_TEST_WORKERS=N sets the number;
# 0 runs the suite in one process, in file order.
_cores="$(nproc 2>/dev/null || echo 2)"
ASHD_TEST_WORKERS="${ASHD_TEST_WORKERS:-$(( _cores * 2 < 8 ? _cores * 2 : 8 ))}"
ASHD_PYTEST_ARGS=(-q -p no:cacheprovider)
if [ "$ASHD_TEST_WORKERS" != "0" ]; then
  ASHD_PYTEST_ARGS+=(-n "$ASHD_TEST_WORKERS" --dist worksteal)
fi

"""`python -m cudattn selfcheck`: every kernel family checked on the device at hand, under the
sanitizers, under load from many threads, over a long soak, and from processes that start cold.

One job per module:

- `_cases`: what to run (pure data: the case lists; no GPU).
- `_inputs`: seeded random host inputs for a case (no GPU).
- `_exec`: a case on the GPU through the public API: upload, call into NaN-poisoned outputs, fetch.
- `_check`: the results against the float64 reference (DESIGN §6; FP8: check_close_fp8).
- `_counter`: kernel launches per kernel name, counted while a run is in progress.
- `_suite`: the case list run in process, with a line per case.
- `_sanitize`: the case list re-run in child processes under compute-sanitizer's tools.
- `_pool`: problems uploaded once and called many times; the first result checked against the
  reference, the later ones compared bit for bit.
- `_load`: many threads, each on its own stream, calling a pool of problems.
- `_soak`: one thread, many calls; device memory, pool and host RSS before and after.
- `_memory`: reading those memory figures.
- `_coldcache`: pointing the kernel cache at an empty directory.
- `_coldprocs`: processes that start together on an empty cache.
- `_report`: text tables and the JSON report.
- `_main`: the command line.
"""

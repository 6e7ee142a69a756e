"""Programs the benchmarks time from the outside: real files that run as scripts or import as functions."""

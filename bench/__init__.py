"""The project's benchmarks (``make bench``); not tests: they print figures, assert nothing."""

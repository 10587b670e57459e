"""Kelvin's benchmarks: each ``bench_*.py`` measures one part beside its reference."""

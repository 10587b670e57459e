"""Kelvin allocator."""

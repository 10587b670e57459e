"""Halls as data: the reference hall (``reference-40.yaml`` + its D), hall files, synthetic halls."""

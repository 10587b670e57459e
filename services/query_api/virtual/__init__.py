"""Virtual sensors: expressions over other sensors, evaluated lazily and written back."""

"""The Slurm bridge: Kelvin's allocator places the jobs of a real Slurm cluster."""

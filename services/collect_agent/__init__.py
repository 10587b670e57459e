"""Kelvin collect agent."""

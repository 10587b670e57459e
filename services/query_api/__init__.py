"""Kelvin query API."""

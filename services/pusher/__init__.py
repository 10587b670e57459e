"""Kelvin pusher."""

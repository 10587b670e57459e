"""Pusher plugins: the model in ``base``, discovery in ``registry``, one module per plugin."""

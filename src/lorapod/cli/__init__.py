"""Thin typer commands, one module per command group; each exposes ``register(app)``."""

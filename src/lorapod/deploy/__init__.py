"""Serving a trained model: ``lorapod deploy RUN --to runpod-serverless`` (deploy/serverless.py)."""

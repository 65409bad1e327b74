"""The built-in trainer: one recipe per family (llm.py, diffusion) over shared pieces
(loop, checkpoint, metrics, progress, optim, device)."""

"""Local fake control planes for RunPod and Vast.ai, checked against the providers' contracts."""

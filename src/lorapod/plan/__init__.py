"""The planner: will this job fit, how long will it take, and what will it cost, per GPU x provider.

``vram`` estimates peak memory, ``speed`` steps or tokens per second, ``cost`` dollars by
phase, ``choose`` ranks every offer, ``storage`` advises which disk to pay for, and ``live``
refreshes prices from the providers. Nothing here imports torch.
"""

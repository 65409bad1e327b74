"""Compute: providers that rent (or borrow) a machine, the job lifecycle on it, and the ledger.

``provider.py`` holds the one interface every backend implements; ``session.py`` runs a job's
stages in order (``acquire``, ``provision``, ``follow``, ``teardown``); ``wait.py`` is the only
place that waits; ``ledger.py`` remembers every instance before it can cost money.
"""

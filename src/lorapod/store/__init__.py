"""The controller's own records, below the planner and compute: both read and write them.

``ledger`` is the SQLite ledger of instances, jobs, events, dollars and measured runs;
``ledger_file`` keeps that file healthy (WAL, busy waits, backups, a damaged file moved aside);
``identity`` says who owns what (this installation's id, instance labels, the controller's pid);
``phases`` reads the measured setup phases of remote jobs. The planner reads measured runs and
boot times from here, so it needs no compute code; compute writes them as a run goes.
``compute/ledger_repair.py`` stays in compute: rebuilding a ledger asks the providers.
"""

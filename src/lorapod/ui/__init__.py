"""``lorapod ui``: a local web dashboard over the ledger and the run folders.

It holds no state of its own: every page is read from the ledger (``store/ledger.py``) and the
run folders (``rundir.py``) when it is asked for, and every action (pull now, STOP at the next
save, destroy now) goes through the same functions as ``lorapod pull``, the session's STOP and
``lorapod down`` (``compute/jobs.py``). Run folders hold what a rented host sent, so files are
served from inside a run folder only, never through a link (:mod:`lorapod.ui.files`), and every
text from them is escaped (Jinja2 autoescaping, ``textContent`` in the browser).

Starlette, uvicorn, Jinja2 and Pillow come with the ``ui`` extra: ``pip install 'lorapod[ui]'``.
"""

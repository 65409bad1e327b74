"""Dataset checks, reports, fixes and draft captions: catch broken data before a GPU is rented.

Submodules are imported on demand (``lorapod.data.chat``, ``lorapod.data.images``...) so that the
chat parser the LLM engine shares never pulls in Pillow, and ``import lorapod`` stays light.
"""

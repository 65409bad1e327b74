"""Chat templating and tokenisation, shared by the data check (``data/chat.py``) and the LLM engine.

``template`` says what a model's chat template does with a conversation (where the replies are,
where the system prompt goes); ``tokenize`` turns a conversation into token ids labelled on the
replies. Both sit below ``data/`` and ``engine/`` (docs/architecture.md), so ``lorapod data check
--model`` counts and refuses exactly what the engine will train on, without importing the engine.
"""

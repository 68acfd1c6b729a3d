"""Context-1: a corpus, its search indexes, questions and the pruning environment.

``corpus`` (documents → located chunks, ``count_tokens``), ``index`` (``ContextIndex``: BM25
and dense search in Chroma), ``search_agents`` (the search sub-agent plug-ins),
``questions`` / ``generate`` / ``scoring`` and ``env`` (the ``podium/Context-v0``
environment). Nothing is imported here, so importing the package stays cheap.
"""

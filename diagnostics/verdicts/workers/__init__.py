"""Engine workers: small scripts that run one audited engine (vLLM, OpenVINO GenAI, …) inside that
engine's own virtual environment and answer the verdict table over a pipe.

A worker imports only the standard library and its engine, never this lab (it runs under another
interpreter). The lab starts it as ``VENV/bin/python diagnostics/verdicts/workers/NAME_worker.py``
(``verdicts.venv_engine``) and they speak JSON lines, one object per line, UTF-8:

1. The lab writes the set-up: ``{"model": "/abs/HF folder of the target", "speculative": {…} or
   null, "cache": "/abs/folder the worker may write (exports)", "threads": int}``. ``speculative``
   is the engine's own speculative configuration as the row states it (null: the control, the
   same engine with speculation off); relative model paths inside it are absolute already.
2. The worker answers ``{"ready": true, "engine": "name version", "settings": {flat JSON: every
   setting the engine applies that a reader needs}}``, or ``{"error": "one line"}`` and exits 1.
3. For each request ``{"prompt_ids": [int], "seeds": [int], "max_tokens": int, "temperature":
   float, "top_k": int or null, "top_p": float or null, "min_p": float or null, "eos_ids": [int]}``
   it answers ``{"outputs": [[int], …], "drafted": int or null, "accepted": int or null}``: one
   list per seed, in the seeds' order, the generated ids only (no prompt; an EOS it generated is
   kept as the last id), and the drafted and accepted token counts of this request alone as the
   engine's own metrics report them (null where the engine reports none). A request that fails
   is answered ``{"error": "one line"}`` and the worker goes on reading.
4. When its stdin closes the worker exits 0 (the OpenVINO worker exits 1 when it closes before the
   set-up line: it never became ready).

The worker's stdout carries nothing but these answers: it moves file descriptor 1 to 2 before
importing its engine (engines print), and writes its answers to a duplicate of the original.
What the workers share of this (the bounded line reader, the answer channel, the serving loop) is
``_protocol.py``, standard library only, which each worker loads by its path.
"""

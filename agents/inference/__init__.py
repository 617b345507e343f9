"""The in-VM inference runtime: engines and the OpenAI-compatible model server.

``agents.inference.server`` serves an :class:`~agents.inference.engines.Engine`
over the same HTTP API vLLM speaks (chat, completions, SSE streaming, usage,
embeddings, ``/health``), so the agent and the proxy treat the GPU runtime
(vLLM) and the CPU ``local`` runtime alike.
"""

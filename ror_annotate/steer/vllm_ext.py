"""The module vLLM imports in each of its worker processes (``worker_extension_cls``) for the vLLM engine.

Importing it installs the capture/steer hooks (:func:`~ror_annotate.steer.vllm_engine.install`: the
custom ops and the patches of vLLM's router, model runner and model loader) in that process, before
vLLM builds the model there, so ``torch.compile`` sees the ops in every rank. The class adds the
``ror_*`` methods the driver calls through ``LLM.collective_rpc``. :func:`~ror_annotate.steer.vllm_engine.build_llm`
names it; nothing else should import it.
"""

from __future__ import annotations

from .vllm_engine import RorWorkerExtension, install

install()

__all__ = ["RorWorkerExtension"]

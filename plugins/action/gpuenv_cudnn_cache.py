"""Action plugin gpuenv_cudnn_cache: the module, with the entry's tar brought to the host by the task
itself (copy_from), without ansible.builtin.copy's second read of it (gpuenv.cacheaction)."""

from __future__ import annotations

from gpuenv.cacheaction import CacheUnpackAction as ActionModule

__all__ = ["ActionModule"]

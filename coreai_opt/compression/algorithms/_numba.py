"""The numba kernels of a module, made together on the first call of any of them.

Importing a kernel module does no work: each kernel name is a stand-in until a kernel is first
called; then all of that module's are made at once (they call each other by name, so numba must
find the made ones in the module), and numba compiles each on its first call. The machine code is
cached on disk in ~/.cache/coreopt/numba (never beside the source: an installed package's folder
may be read-only, and a checkout stays clean) unless NUMBA_CACHE_DIR says where. numba's cache
files are pickles it loads, so the disk cache is used only where both that folder and the
subfolder numba keeps the module's kernels in keep the rule of every cache folder
(`coreai_opt._cache`); elsewhere the kernels compile afresh, with one warning when they are made.
numba's own `CACHE_DIR` is set only while they are made (numba fixes each kernel's cache folder
then), so no other numba code in the process is pointed at a folder checked, or refused, for these.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coreai_opt._cache import cache_folder_for, user_cache, warn_unused

# one lock for every module's kernels: numba's CACHE_DIR, set while they are made, is the process's
_MAKING = threading.Lock()


class Kernels:
    """The kernels of one module (`namespace`: its globals; `source`: its file, which names
    numba's cache subfolder); `without`: what a refused cache folder costs, said in its warning."""

    def __init__(self, namespace: dict[str, Any], source: str, without: str) -> None:
        self._namespace, self._source, self._without = namespace, source, without
        self._sources: dict[str, Callable[..., Any]] = {}  # every kernel's Python function, by name
        self._made: dict[str, Any] = {}  # every kernel as numba made it, once the first was called

    def kernel(self, py_func: Callable[..., Any]) -> _Kernel:
        """Register `py_func` as a kernel, made with the others on the first call of any of them."""
        self._sources[py_func.__name__] = py_func
        return _Kernel(py_func, self)

    def made(self) -> dict[str, Any]:
        """Every kernel, made by numba (nogil, so threads run them in parallel; numpy's error model:
        no zero-divisor checks) with the disk cache where `_cache_folder` allows it; the made
        kernels take their stand-ins' names in the module, where numba looks for the ones called."""
        if self._made:
            return self._made
        import numba

        with _MAKING:
            if not self._made:
                folder = self._cache_folder()
                previous = numba.config.CACHE_DIR
                try:
                    if folder is not None:
                        numba.config.CACHE_DIR = str(folder)
                    jit = numba.njit(cache=folder is not None, nogil=True, error_model="numpy")
                    made = {name: jit(py_func) for name, py_func in self._sources.items()}
                finally:
                    numba.config.CACHE_DIR = previous
                self._namespace.update(made)
                self._made.update(made)
        return self._made

    def _cache_folder(self) -> Path | None:
        """The folder numba may keep these kernels in (its `CACHE_DIR`), or None: it and the
        subfolder numba reads them from must keep the rule and be writable - where they cannot,
        numba would look for a cache beside the source or in ~/.cache/numba instead."""
        from numba.core.caching import UserProvidedCacheLocator

        chosen = Path(os.environ.get("NUMBA_CACHE_DIR") or user_cache("numba"))
        try:
            root = cache_folder_for(chosen, create=True, without=self._without)
            subpath = UserProvidedCacheLocator.get_suitable_cache_subpath(self._source)
            kernels = cache_folder_for(root / subpath, create=True, without=self._without) if root else None
        except OSError as exc:
            warn_unused(chosen, f"it cannot be made ({exc.strerror})", self._without)
            return None
        if root is None or kernels is None:
            return None
        if not os.access(kernels, os.W_OK | os.X_OK):
            warn_unused(kernels, "it cannot be written", self._without)
            return None
        return root


class _Kernel:
    """A kernel's stand-in until its module's kernels are made; calls go to the made kernel."""

    def __init__(self, py_func: Callable[..., Any], kernels: Kernels) -> None:
        self.py_func = py_func
        self._kernels = kernels
        functools.update_wrapper(self, py_func)

    def __call__(self, *args: Any) -> Any:
        return self._kernels.made()[self.py_func.__name__](*args)

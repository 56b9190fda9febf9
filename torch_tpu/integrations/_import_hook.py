"""Runs an integration's code around the import of a module, without importing it early: a finder at
the front of sys.meta_path finds the module as the other finders do and wraps its loader."""
from __future__ import annotations

import importlib.abc
import sys
from typing import Callable


class _Loader(importlib.abc.Loader):
    """The module's own loader, with `before(module)` just before it executes and `after(module)` once
    it has."""

    def __init__(self, loader, before, after):
        self.loader, self.before, self.after = loader, before, after

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        if self.before is not None:
            self.before(module)
        self.loader.exec_module(module)
        if self.after is not None:
            self.after(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, before, after):
        self.name, self.before, self.after = name, before, after

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, self.before, self.after)
                return spec
        return None


def on_import(name: str, before: Callable | None = None, after: Callable | None = None) -> None:
    """Calls before(module) just before module `name` executes and after(module) once it has, at its
    import; where it is already imported, after(module) now. Installed once per name."""
    if name in sys.modules:
        if after is not None:
            after(sys.modules[name])
    elif not any(isinstance(f, _Finder) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(name, before, after))

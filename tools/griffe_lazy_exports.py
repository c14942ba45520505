"""A griffe extension for the docs build (mkdocs.yml): makes ``blockbatch.Engine`` and the other
attributes ``blockbatch/__init__.py`` loads lazily visible to mkdocstrings.

``import blockbatch`` leaves the classes that need the compiled extension to a module
``__getattr__`` driven by the ``_NATIVE`` table (name -> submodule), so that the package imports
without ``_C``. griffe reads the source statically and cannot follow that; this adds each entry of
``_NATIVE`` as an alias of ``blockbatch.<submodule>.<name>``, so ``::: blockbatch.Engine`` renders
the class under its public path. Nothing is imported: the docs build needs neither torch nor the
extension.
"""

from __future__ import annotations

import ast

import griffe


class LazyExports(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        if pkg.name != "blockbatch" or "_NATIVE" not in pkg.members:
            return
        table = ast.literal_eval(str(pkg.members["_NATIVE"].value))
        for name, module in table.items():
            if name not in pkg.members:
                pkg.set_member(name, griffe.Alias(name, f"blockbatch.{module}.{name}", parent=pkg))

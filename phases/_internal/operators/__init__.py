"""The operator kinds, one module each, behind one interface (:class:`~phases._internal.operators.base.OperatorKind`),
and their registry (:mod:`phases._internal.operators.registry`: ``KINDS``, ``kind_of(pipeline)``, ``kind_named(name)``).

This package's ``__init__`` imports nothing: a module that needs one piece of an operator (a join's logic) does
not load every kind with it, and no import circle runs through the package."""

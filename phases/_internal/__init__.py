"""The engine's internals: everything behind the public names of :mod:`phases` (``phases.__all__``),
:mod:`phases.inspect`, :mod:`phases.testing`, :mod:`phases.pytest_plugin`, :mod:`phases.feed` and
:mod:`phases.setup`. Nothing here is an API: modules move and change between releases without notice.
``tests/test_architecture.py`` fails when the Dagster layer or the demo's code location imports from here."""

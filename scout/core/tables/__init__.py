"""Copies of the machine tables ``spec/<name>.toml`` shipped as package data (loaded with
``importlib.resources`` by :func:`scout.core.machine.packaged_machine`). Do not edit them:
``scout spec`` writes them from ``spec/``, and ``scout spec --check`` fails when they differ."""

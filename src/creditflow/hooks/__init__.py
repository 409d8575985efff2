"""The project's Kedro hooks, one a module; ``settings.py`` registers them (and is the only
module that imports this package)."""

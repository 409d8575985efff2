"""The project's Kedro hooks, one a module; ``settings.py`` registers them (and is the only
module that imports this package)."""

from creditflow.hooks.console import quiet_known_noise, widen_log_console

# Before any hook module imports MLflow or Kedro's config loader, which warn as they load.
quiet_known_noise()
widen_log_console()

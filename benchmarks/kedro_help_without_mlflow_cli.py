"""``kedro --help`` as it would run without kedro-mlflow's CLI plugin, to measure what that
plugin costs every ``kedro`` command (docs/results.md, "Time to the first error").

Kedro imports the module behind each ``kedro.project_commands`` entry point before it parses
the command line; kedro-mlflow's (``kedro_mlflow.framework.cli.cli``) imports MLflow. This
script leaves that one entry point out of Kedro's entry-point lookup (a measurement only: the
project's own commands never do this) and runs ``kedro --help`` in the current directory.

    cd <project root> && /usr/bin/time -f "%e %U %S" python benchmarks/kedro_help_without_mlflow_cli.py
"""

import sys

from kedro.framework.cli import utils

_entry_points = utils._get_entry_points


def _without_kedro_mlflow(group: str) -> list:
    return [point for point in _entry_points(group) if not point.module.startswith("kedro_mlflow")]


if __name__ == "__main__":
    utils._get_entry_points = _without_kedro_mlflow
    from kedro.framework.cli.cli import main  # noqa: PLC0415 - after the lookup is replaced

    sys.argv = ["kedro", "--help"]
    main()

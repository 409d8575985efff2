"""Project settings. There is no need to edit this file unless you want to change values
from the Kedro defaults. For further information, including these default values, see
https://docs.kedro.org/en/stable/configure/configuration_basics/#configuration"""

import os

# MLflow reports usage to its developers unless told not to; nothing of a run leaves the machine
# (docs/reproducibility.md). Set here, before kedro-mlflow imports MLflow, which reads it then.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# The defaults `make run` sets, for a `kedro run` typed in the activated venv too; a variable
# already set wins (HF_HUB_OFFLINE=0 to download a model by its Hugging Face id). Set here,
# before any pipeline imports torch or huggingface_hub, which read them at import.
# The tiny models train several times faster on one thread than with intra-op threads
# spinning on a shared CPU (docs/results.md); a GPU run is unaffected.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Models, tokenizers and datasets from local paths or the cache: no hub lookups.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")

# Instantiated project hooks (docs/reproducibility.md): a JSON manifest per run in
# data/08_reporting/run_manifests/, MLflow tracking (kedro-mlflow, configured in
# conf/base/mlflow.yml, switched by params:tracking), and the Kedro credentials as the
# `credentials` dataset (docs/howto/credentials.md).
from creditflow.hooks.credentials import CredentialsHook
from creditflow.hooks.mlflow_tracking import MlflowTrackingHook
from creditflow.hooks.parameter_check import ParameterCheckHook
from creditflow.hooks.pinned_versions import PinnedVersionsHook
from creditflow.hooks.raw_data import RawDataHook
from creditflow.hooks.run_manifest import RunManifestHook
from creditflow.hooks.task_source import TaskSourceHook
from creditflow.hooks.termination import SigtermHook

# Hooks are executed in a Last-In-First-Out (LIFO) order.
# ParameterCheckHook last, so it runs first and fails a run before MLflow opens one;
# RawDataHook next: a data_ingest run whose raw data sets are absent fails saying how to fetch;
# PinnedVersionsHook fixes the run's dataset versions before any of them loads;
# TaskSourceHook puts tapo.tasks.source / tor.tasks.source under the task nodes' fixed input
# names (docs/howto/own_data.md) and fails a run whose source is unknown before pinning.
# SigtermHook turns SIGTERM into a failure the other hooks record (manifest "interrupted",
# MLflow run KILLED); it orders itself around the others (trylast, wrappers).
HOOKS = (
    SigtermHook(),
    CredentialsHook(),
    RunManifestHook(),
    MlflowTrackingHook(),
    PinnedVersionsHook(),
    TaskSourceHook(),
    RawDataHook(),
    ParameterCheckHook(),
)

# Installed plugins for which to disable hook auto-registration. kedro-mlflow's hook runs
# inside MlflowTrackingHook, which redacts secrets before it logs parameters; registered on its
# own as well it would log them as they are, and every run twice.
DISABLE_HOOKS_FOR_PLUGINS = ("kedro_mlflow",)

# Class that manages the KedroSession.
# from kedro.framework.session import KedroSession
# SESSION_CLASS = KedroSession

# Class that manages storing KedroSession data.
# from kedro.framework.session.store import BaseSessionStore
# SESSION_STORE_CLASS = BaseSessionStore
# Keyword arguments to pass to the `SESSION_STORE_CLASS` constructor.
# SESSION_STORE_ARGS = {
#     "path": "./sessions"
# }

# Directory that holds configuration.
# CONF_SOURCE = "conf"

# Class that manages how configuration is loaded.
# from kedro.config import OmegaConfigLoader

# CONFIG_LOADER_CLASS = OmegaConfigLoader

# Keyword arguments to pass to the `CONFIG_LOADER_CLASS` constructor.
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    # Parameters of conf/local (or --env) merge key by key into conf/base: a
    # conf/local/parameters_tapo.yml holds only the keys it changes. Kedro's default
    # ("destructive") would replace each whole top-level group, and since --params is merged
    # into the env's parameters first, one conf/local parameters file would make --params
    # replace every group it names. Catalog and credentials keep Kedro's default.
    "merge_strategy": {"parameters": "soft"},
    # "config_patterns": {
    #     "spark" : ["spark*/"],
    #     "parameters": ["parameters*", "parameters*/**", "**/parameters*"],
    # }
}

# Class that manages Kedro's library components.
# from kedro.framework.context import KedroContext
# CONTEXT_CLASS = KedroContext

# Class that manages the Data Catalog.
# from kedro.io import DataCatalog
# DATA_CATALOG_CLASS = DataCatalog

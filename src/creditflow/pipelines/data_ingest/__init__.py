"""``data_ingest``: load the shared raw data sets into validated, versioned Parquet tables."""

from creditflow.pipelines.data_ingest.pipeline import create_pipeline

__all__ = ["create_pipeline"]

"""s3batch activities (never import workflows from here)."""

from s3batch.activities.s3_activities import S3Activities

__all__ = ["S3Activities"]

"""Worker Versioning: how a week-long job survives a controller upgrade.

A worker started with a deployment name and a build id (``lazarus worker
--deployment lazarus --build-id 2026.12.1``) polls as that version of the
deployment, and every job it starts is *pinned* to that version: its workflow code
never changes under it mid-run, so no replay of an old history on new code can
diverge. An upgrade is then:

1. start workers of the new build id beside the old ones;
2. make it the deployment's current version
   (``temporal worker deployment set-current-version``);
3. each running job notices at its next workflow task
   (``is_target_worker_deployment_version_changed``), continues as new with
   ``AUTO_UPGRADE``, and its next run, which adopts the live ranks, runs on the new
   build;
4. once no job is pinned to the old version, stop its workers.

Without a deployment (the default, and the embedded dev server's demo), workers are
unversioned and code changes ride on ``workflow.patched`` (see ``workflows.job``).
Both are tested: the released-history corpus replays against every change, and
``tests/integration/test_upgrade.py`` moves a running job from one build to the next.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.worker import WorkerDeploymentConfig

DEPLOYMENT_ENV = "LAZARUS_DEPLOYMENT"
BUILD_ID_ENV = "LAZARUS_BUILD_ID"


class WorkerDeployment(BaseModel):
    """Which version of which deployment this worker is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    build_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._+-]+$")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> WorkerDeployment | None:
        """From ``LAZARUS_DEPLOYMENT`` and ``LAZARUS_BUILD_ID``; both or neither."""
        env = os.environ if environ is None else environ
        name, build_id = env.get(DEPLOYMENT_ENV), env.get(BUILD_ID_ENV)
        if not name and not build_id:
            return None
        if not name or not build_id:
            missing = DEPLOYMENT_ENV if not name else BUILD_ID_ENV
            raise ValueError(f"{missing} is not set: set both it and its partner, or neither")
        return cls(name=name, build_id=build_id)

    def config(self) -> WorkerDeploymentConfig:
        return WorkerDeploymentConfig(
            version=WorkerDeploymentVersion(deployment_name=self.name, build_id=self.build_id),
            use_worker_versioning=True,
            default_versioning_behavior=VersioningBehavior.PINNED,
        )

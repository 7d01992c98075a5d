"""Execution of runs: the kinds a run can be (`kinds`, each with a pure `job_spec`), their submission
(`submit`; cron `schedules` submit through it), the one launcher that submits and stops every kind's job on Ray
(`launch`, `ray`), the tick's reconcile of runs against their jobs (`reconcile`), liveness and its sweeps
(`liveness`, `sweeps`), the cluster's capacity (`capacity`), how a job's outcome finishes a run (`outcome`), what
follows a finished run (`followups`), the platform's own restart (`restart`), staff commands to a running job
(`controls`) and where its session server listens (`serving`). It builds on runs.core and runs.scheduling;
only runs.telemetry and runs.api import it (the layers contract in pyproject.toml)."""
